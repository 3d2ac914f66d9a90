"""The DMA sanitizer on a machine without a TPU: a kernel that would hang raises instead.

    python examples/sanitize_on_cpu.py

A local copy kernel runs in jax's TPU interpreter on the CPU with ``sanitize=True``,
first correct, then with a wait that nothing will satisfy (on a TPU: a hung chip).
The sanitized call skips the wait, returns, and raises ``DeadlockError`` naming the
wait's line and semaphore. The manual's recipe page shows this file.
"""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

import safedma as sd  # noqa: E402
from safedma.testing import DeadlockError  # noqa: E402


# --8<-- [start:kernels]
def double(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    """HBM -> VMEM, double it, VMEM -> HBM."""
    sd.LocalCopy(x_hbm, buf, sem).start().wait()
    buf[...] = buf[...] * 2.0
    sd.LocalCopy(buf, o_hbm, sem).start().wait()


def double_hangs(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    """The same, waiting for a copy into buf that was never started: on a TPU, a hang."""
    sd.LocalCopy(x_hbm, buf, sem).started_elsewhere().wait()
    buf[...] = buf[...] * 2.0
    sd.LocalCopy(buf, o_hbm, sem).start().wait()
    # --8<-- [end:kernels]


# --8<-- [start:call]
Body = Callable[[sd.DataRef, sd.DataRef, sd.DataRef, sd.SemRef], None]


def sanitized(body: Body, x: np.ndarray) -> jax.Array:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return sd.pallas_call(
        body,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[hbm],
        out_specs=hbm,
        scratch_shapes=[sd.vmem(x.shape, x.dtype), sd.dma_semaphore()],
        interpret=pltpu.InterpretParams(),  # jax's TPU interpreter, on the CPU
        sanitize=sd.SanitizeOptions(hang_after_s=1.0),  # a wait spinning 1 s is a hang
    )(x)
    # --8<-- [end:call]


def main() -> None:
    # --8<-- [start:run]
    x = np.ones((8, 128), np.float32)
    np.testing.assert_array_equal(np.asarray(sanitized(double, x)), 2.0)  # correct: runs clean
    try:
        sanitized(double_hangs, x)
    except DeadlockError as error:
        print(error)  # names the wait's line, the semaphore, what it waited for, and the fix
    # --8<-- [end:run]


if __name__ == "__main__":
    main()
