"""Pass: raw pltpu local copies in kernels annotated with safedma's brands.

HBM to VMEM and back with compute in between, ``async_copy``, sliced copies
on a semaphore array, priority 1, and the double-buffering loop that rebuilds
a descriptor to wait for the copy the previous iteration started.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemRef

CHUNK = 8


def scale_copy(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    buf[...] = buf[...] * 2.0 + 1.0
    pltpu.async_copy(buf, o_hbm, sem).wait()


def reverse_halves(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    half = x_hbm.shape[0] // 2
    c1 = pltpu.make_async_copy(x_hbm.at[pl.ds(0, half)], buf.at[pl.ds(half, half)], sems.at[0])
    c2 = pltpu.make_async_copy(x_hbm.at[pl.ds(half, half)], buf.at[pl.ds(0, half)], sems.at[1])
    c1.start()
    c2.start(priority=1)
    c1.wait()
    c2.wait()
    pltpu.async_copy(buf, o_hbm, sems.at[0], priority=0).wait()


def double_buffered(
    x_hbm: DataRef, o_hbm: DataRef, bufs: DataRef, out_buf: DataRef, in_sems: SemArray, out_sem: SemRef
) -> None:
    steps = x_hbm.shape[0] // CHUNK

    def fetch(step: int | jax.Array, slot: int | jax.Array) -> pltpu.LocalCopyDescriptor:
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], in_sems.at[slot]
        )

    fetch(0, 0).start()

    @pl.loop(0, steps)
    def _(step: jax.Array) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _() -> None:
            fetch(step + 1, 1 - slot).start()

        # The copy was started by the previous iteration: rebuild it to wait (legitimate).
        fetch(step, slot).wait()
        out_buf[...] = bufs[slot] * 3.0
        out = pltpu.make_async_copy(out_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem)
        out.start()
        out.wait()


def aggregate_wait(pages_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    """Paged-attention style: several copies signal one semaphore; one wait per copy size."""
    copies = [
        pltpu.make_async_copy(pages_hbm.at[i], buf.at[i], sem) for i in range(4)
    ]
    for c in copies:
        c.start()
    for c in copies:
        c.wait()
