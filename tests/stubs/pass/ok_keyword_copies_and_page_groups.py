"""Pass: raw pltpu shapes of paged-attention and grouped-matmul kernels, with the stubs.

* ``pltpu.make_async_copy(src_ref=..., dst_ref=..., sem=...)`` by keyword, started with
  ``priority=1``, and one wait by size on a self-copy of the total;
* a page-group helper keeping its descriptors in a list, started in one place and waited
  in another; a list of descriptors started, then waited.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemRef


def zero_fill(zero: DataRef, out: DataRef, sems: SemArray, rows: jax.Array) -> None:
    for col in range(0, out.shape[-1], 128):
        pltpu.make_async_copy(
            src_ref=zero.at[pl.ds(0, rows)],
            dst_ref=out.at[pl.ds(0, rows), col : col + 128],
            sem=sems.at[0],
        ).start(priority=1)
    pltpu.make_async_copy(
        src_ref=out.at[pl.ds(0, rows)], dst_ref=out.at[pl.ds(0, rows)], sem=sems.at[0]
    ).wait()


class PageGroup:
    def __init__(self, pages: DataRef, buf: DataRef, sem: SemRef, table: DataRef) -> None:
        self.buf = buf
        self.copies = [pltpu.make_async_copy(pages.at[table[i]], buf.at[i], sem) for i in range(2)]

    def start(self) -> None:
        for copy in self.copies:
            copy.start()

    def wait(self) -> DataRef:
        for copy in self.copies:
            copy.wait()
        return self.buf


def header(start: DataRef, end: DataRef, start_buf: DataRef, end_buf: DataRef, sem: SemRef) -> None:
    copies = [
        pltpu.make_async_copy(start.at[:1], start_buf.at[:1], sem),
        pltpu.make_async_copy(end.at[:1], end_buf.at[:1], sem),
    ]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.wait()
