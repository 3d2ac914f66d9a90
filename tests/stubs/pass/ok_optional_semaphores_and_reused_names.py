"""Pass: two patterns of production kernels that type-check with jax's own types.

* A semaphore parameter that defaults to ``None`` (``ring_sem=None``: pyright types it
  ``Unknown | None``), signalled and waited only where the kernel's flags say it was
  given. jax rejects a ``None`` that reaches ``semaphore_wait`` or ``semaphore_signal``
  at trace time.
* One loop name used first for local copies and then for remote ones (``for copy in
  ...`` twice in a kernel): each loop's copies are checked as their own kind.
"""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSem, SemRef


def ring_step(x_ref: DataRef, ring: bool, ring_sem: RegularSem | None = None) -> None:
    if ring:
        pl.semaphore_signal(ring_sem, 1, device_id=1)
        pl.semaphore_wait(ring_sem, 1)
    del x_ref


def gather_then_send(
    x_ref: DataRef, bufs: DataRef, out_ref: DataRef, sem: SemRef, send: SemRef, recv: SemRef
) -> None:
    loads = [pltpu.make_async_copy(x_ref.at[i], bufs.at[i], sem) for i in range(2)]
    for copy in loads:
        copy.start()
    for copy in loads:
        copy.wait()
    sends = [
        pltpu.make_async_remote_copy(bufs.at[i], out_ref.at[i], send, recv, device_id=i + 1)
        for i in range(2)
    ]
    for copy in sends:
        copy.start()
    for copy in sends:
        copy.wait_send()
