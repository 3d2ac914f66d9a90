"""Pass: raw pltpu code from jax's own Pallas TPU tests, with the stubs.

* ``pl.select_ref(i, *refs)`` as a copy's source or semaphore: jax types its result
  ``TransformedRef``, which the stubs rejected (7 errors on jax's
  tpu_pallas_distributed_test.py and tpu_pallas_test.py);
* a device id over axes taken jointly, ``{("y", "x"): i}`` (4 errors on jax's async and
  distributed tests).
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jax._src.state.types import TransformedRef

from safedma import DataRef, RegularSem, SemRef


def select_kernel(src: TransformedRef, y: DataRef, sem: TransformedRef) -> None:
    """What ``pl.select_ref(i, x0, x1)`` returns, as jax types it (calling it here would be
    pyright strict's "partially unknown": jax leaves its ``*refs`` unannotated)."""
    pltpu.async_copy(src, y, sem).wait()


def joint_axes(x_ref: DataRef, y_ref: DataRef, ready: RegularSem, send: SemRef, recv: SemRef) -> None:
    n = jax.lax.axis_size(("y", "x"))
    target = {("y", "x"): jax.lax.rem(jax.lax.axis_index(("y", "x")) + 1, n)}
    pl.semaphore_signal(ready, device_id=target)
    pl.semaphore_wait(ready)
    copy = pltpu.make_async_remote_copy(x_ref, y_ref, send, recv, device_id=target)
    copy.start()
    copy.wait()
