"""Pass: sliced copies with ``.at[pl.ds(...)]`` on data refs and on a SemArray.

Must type-check under ``mypy --strict`` and pyright strict with no ``# type: ignore``.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, SemArray, SemRef

ROWS = 8


def split_copy(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    half = x_hbm.shape[0] // 2
    assert_type(half, int)

    # Data refs: .at[...] is again a DataRef, for pl.ds, slices, ints and tuples.
    top = x_hbm.at[pl.ds(0, half)]
    assert_type(top, DataRef)
    assert_type(x_hbm.at[half:], DataRef)
    assert_type(buf.at[0], DataRef)
    assert_type(buf.at[pl.ds(0, half), :], DataRef)
    assert_type(buf.at[..., pl.ds(0, 128)], DataRef)

    # A SemArray: .at[i] is one semaphore, .at[pl.ds(...)] / .at[a:b] a smaller array.
    first = sems.at[0]
    assert_type(first, SemRef)
    assert_type(sems.at[pl.ds(0, 2)], SemArray)
    assert_type(sems.at[1:], SemArray)
    assert_type(sems.at[pl.ds(2, 2)].at[1], SemRef)
    assert_type(sems.shape, tuple[int, ...])

    h0 = safedma.LocalCopy(top, buf.at[pl.ds(half, half)], first).start()
    h1 = safedma.LocalCopy(x_hbm.at[pl.ds(half, half)], buf.at[pl.ds(0, half)], sems.at[1]).start(
        priority=1
    )
    h0.wait()
    h1.wait()
    safedma.LocalCopy(buf, o_hbm, sems.at[pl.ds(2, 2)].at[0]).start().wait()


def grid_step(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    """A traced index (pl.program_id) works for data and semaphore slices alike."""
    i = pl.program_id(0)
    assert_type(i, jax.Array)
    slot = i % 2
    sem = sems.at[slot]
    assert_type(sem, SemRef)
    rows = pl.ds(pl.multiple_of(i * ROWS, ROWS), ROWS)
    safedma.LocalCopy(x_hbm.at[rows], buf.at[slot], sem).start().wait()
    buf[slot] = buf[slot] * 2.0
    safedma.LocalCopy(buf.at[slot], o_hbm.at[rows], sem).start().wait()
