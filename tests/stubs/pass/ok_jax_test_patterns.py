"""Pass: raw pltpu code from jax's own Pallas TPU tests, with the stubs (docs/held-out.md).

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

from safedma import DataRef, RegularSem, SemArray, SemRef


def select_kernel(i: jax.Array, x0: DataRef, x1: DataRef, y: DataRef, sems: SemArray) -> None:
    # jax leaves select_ref's *refs unannotated ("partially unknown" to pyright strict).
    src = pl.select_ref(i, x0, x1)  # pyright: ignore[reportUnknownMemberType]
    sem = pl.select_ref(i, sems.at[0], sems.at[1])  # pyright: ignore[reportUnknownMemberType]
    pltpu.async_copy(src, y, sem).wait()


def joint_axes(x_ref: DataRef, y_ref: DataRef, ready: RegularSem, send: SemRef, recv: SemRef) -> None:
    n = jax.lax.axis_size(("y", "x"))
    target = {("y", "x"): jax.lax.rem(jax.lax.axis_index(("y", "x")) + 1, n)}
    pl.semaphore_signal(ready, device_id=target)
    pl.semaphore_wait(ready)
    copy = pltpu.make_async_remote_copy(x_ref, y_ref, send, recv, device_id=target)
    copy.start()
    copy.wait()
