"""Pass: several copies started on one semaphore, then one aggregate wait.

The gather pattern of paged attention: N page copies signal the same DMA
semaphore, and one wait sized like all of them discharges it. Must pass
``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, SemRef

from _typed_jax import fori_loop

PAGES = 4
PAGE = 16


def gather_pages(
    table_smem: DataRef, pages_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef
) -> None:
    for p in range(PAGES):
        page = table_smem[p]
        assert_type(page, jax.Array)
        safedma.LocalCopy(pages_hbm.at[page], buf.at[pl.ds(p * PAGE, PAGE)], sem).start()

    # One wait for all PAGES copies: a descriptor whose size is their sum.
    everything = safedma.LocalCopy(o_hbm, buf, sem).started_elsewhere()
    assert_type(everything, safedma.LocalHandle)
    everything.wait()

    buf[...] = buf[...] * 2.0
    safedma.LocalCopy(buf, o_hbm, sem).start().wait()


def gather_in_loop(
    table_smem: DataRef, pages_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef
) -> None:
    def start_one(p: jax.Array, carry: None) -> None:
        dst = buf.at[pl.ds(p * PAGE, PAGE)]
        safedma.LocalCopy(pages_hbm.at[table_smem[p]], dst, sem).start()
        return carry

    fori_loop(0, PAGES, start_one, None)
    safedma.LocalCopy(o_hbm, buf, sem).started_elsewhere().wait()
    safedma.LocalCopy(buf, o_hbm, sem).start().wait()


def gather_with_named_wait(
    table_smem: DataRef, pages_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef
) -> None:
    for p in range(PAGES):
        safedma.LocalCopy(pages_hbm.at[table_smem[p]], buf.at[pl.ds(p * PAGE, PAGE)], sem).start()
    assert_type(safedma.wait_all_into(buf, sem), DataRef)
    safedma.LocalCopy(buf, o_hbm, sem).start().wait()
