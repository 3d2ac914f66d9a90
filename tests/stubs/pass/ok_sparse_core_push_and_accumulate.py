"""Pass: raw SparseCore DMA that jax lowers but the stubs used to reject.

* ``add=True`` on a local copy: a scatter-add into ``shared.at[indices]`` (VMEM to
  VMEM_SHARED) or a gather-add from ``src.at[indices]``, lowered on SparseCore by jax
  0.10.2 and 0.12 (tokamax's top-k histogram). The stubs
  typed it ``Literal[False]``.
* jax 0.12's push streams (a local copy from VMEM to HBM, VMEM_SHARED or SMEM): the
  hardware ignores the destination semaphore and jax warns unless ``sem=None``; the source
  read is tracked on ``src_sem`` and waited with ``wait_read()``, the writes fenced with
  ``wait_write()`` (jax's ``emit_pipeline(..., output_wait_read_only=True)``). The stubs
  required ``sem`` and left out ``src_sem``, ``wait_read`` and ``wait_write``.
"""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def scatter_add(histogram: DataRef, shared: DataRef, indices: DataRef, sem: SemRef) -> None:
    pltpu.async_copy(histogram, shared.at[indices], sem, add=True).wait()
    copy = pltpu.make_async_copy(shared.at[indices], histogram, sem)
    copy.start(add=True)
    copy.wait()


def push_stream(buf: DataRef, out_hbm: DataRef, read_sem: SemRef) -> None:
    pltpu.async_copy(buf, out_hbm, sem=None).wait()
    pltpu.make_async_copy(buf, out_hbm).start()
    copy = pltpu.make_async_copy(buf, out_hbm, src_sem=read_sem)
    copy.start()
    copy.wait_read()  # buf may be overwritten now
    copy.wait_write()  # every push stream's writes have landed
    pltpu.async_copy(buf, out_hbm, None, src_sem=read_sem).wait()
