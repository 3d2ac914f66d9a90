"""A first safedma kernel, run, verified and type-checked on a machine without a TPU.

    python examples/first_kernel.py

The kernel sends each device's block to the next device along mesh axis "x" (a
ring permute). The script runs it on 4 simulated CPU devices in strict TPU
interpret mode and compares the result with ``numpy.roll``, then proves its
DMA/semaphore protocol on a device-free mesh of 256 devices with ``verify``. The
getting-started page of the manual shows this file piece by piece; ``mypy --strict`` and
pyright strict accept it.
"""

from __future__ import annotations

import os

# jax reads both variables once, when it creates its CPU backend: set them before
# anything uses jax. (In a pytest suite, safedma's pytest plugin does this from one
# line of configuration: `safedma_devices = 4`.)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

import safedma as sd  # noqa: E402
from safedma.testing import abstract_mesh, simulate, simulated_mesh, verify  # noqa: E402


# --8<-- [start:kernel]
def ring_permute(
    x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef
) -> None:
    """Send this device's block to the next device along mesh axis "x"."""
    copy = (
        sd.RemoteCopy(x_ref, o_ref, recv_sem)  # RemoteCopy[Missing, Missing]
        .with_send_sem(send_sem)  # RemoteCopy[Given, Missing]
        .to(sd.neighbour("x"))  # RemoteCopy[Given, Given]: only now can it start
    )
    handle = copy.start()  # a RemoteHandle: the only thing that can be waited
    handle.wait()  # waits the send side, then the receive side


def per_device(block: jax.Array) -> jax.Array:
    """The per-device function: one kernel call on this device's block."""
    hbm = pl.BlockSpec(memory_space=pl.ANY)  # leave the operands in HBM
    return sd.pallas_call(
        ring_permute,
        jax.ShapeDtypeStruct(block.shape, block.dtype),
        in_specs=[hbm],
        out_specs=hbm,
        scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],  # send_sem, recv_sem
    )(block)
    # --8<-- [end:kernel]


def main() -> None:
    # --8<-- [start:simulate]
    x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
    out = simulate(per_device, x, mesh=simulated_mesh((4,), ("x",)))
    # Device i's 8 rows now hold device i-1's rows.
    expected = np.roll(x.reshape(4, 8, 128), 1, axis=0).reshape(4 * 8, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)
    # --8<-- [end:simulate]
    print("simulate: 4 CPU devices, output matches numpy.roll")

    # --8<-- [start:verify]
    report = verify(
        per_device,
        jax.ShapeDtypeStruct((256 * 8, 128), jnp.float32),  # no data needed
        mesh=abstract_mesh((256,), ("x",)),  # no devices needed
    )
    print(report)
    # --8<-- [end:verify]


if __name__ == "__main__":
    main()
