"""The first kernel's tests, as a kernel author writes them with safedma's pytest plugin.

    pytest examples/test_first_kernel.py

The plugin (installed with safedma) sets the simulated device count before jax starts,
from ``safedma_devices`` under ``[tool.pytest.ini_options]``; this repository sets 8.
"""

# --8<-- [start:tests]
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import safedma as sd
from examples.first_kernel import per_device
from safedma.pytest_plugin import MeshFactory
from safedma.testing import abstract_mesh, simulate, verify


def test_ring_permute_moves_each_block_one_device_along(
    simulated_mesh_factory: MeshFactory,
) -> None:
    x = np.arange(4 * 8 * 128, dtype=np.float32).reshape(4 * 8, 128)
    out = simulate(per_device, x, mesh=simulated_mesh_factory((4,), ("x",)))
    expected = np.roll(x.reshape(4, 8, 128), 1, axis=0).reshape(4 * 8, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize("devices", [2, 8, 64])
def test_ring_permute_protocol(devices: int) -> None:
    block = jax.ShapeDtypeStruct((devices * 8, 128), jnp.float32)
    report = verify(per_device, block, mesh=abstract_mesh((devices,), ("x",)), invocations=2)
    assert report.devices == devices


def test_a_receive_never_waited_is_reported() -> None:
    def send_only(
        x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef
    ) -> None:
        copy = sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem)
        copy.to(sd.neighbour("x")).start().wait_send()  # the receive side is never waited

    def broken(block: jax.Array) -> jax.Array:
        hbm = pl.BlockSpec(memory_space=pl.ANY)
        return sd.pallas_call(
            send_only,
            jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
        )(block)

    block = jax.ShapeDtypeStruct((4 * 8, 128), jnp.float32)
    # Caught while verify traces the kernel, before any device is walked (T7).
    with pytest.raises(sd.CopyNeverWaitedError, match="wait_recv"):
        verify(broken, block, mesh=abstract_mesh((4,), ("x",)))
    # --8<-- [end:tests]
