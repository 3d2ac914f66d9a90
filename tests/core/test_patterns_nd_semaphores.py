"""Issue 13 item 1: N-D semaphore arrays, ``sems.at[i, j]``.

Same Mosaic as the raw spelling; a row where one semaphore belongs and a static
index outside the array are caught at trace time with the array, the index and
the fix in the message (jax itself lowers ``sems.at[5]`` of two semaphores).
"""

from __future__ import annotations

from typing import Any

import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import assert_same_mosaic
from tests.support.patterns import X, local_call, trace


def _two_d(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray2) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], sems.at[1, 2]).start().wait()
    sd.LocalCopy(x.at[pl.ds(16, 16)], o.at[pl.ds(16, 16)], sems.at[i % 2].at[0]).start().wait()


def _two_d_raw(x: Any, o: Any, sems: Any) -> None:
    i = pl.program_id(0)
    c = pltpu.make_async_copy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], sems.at[1, 2])
    c.start()
    c.wait()
    c = pltpu.make_async_copy(x.at[pl.ds(16, 16)], o.at[pl.ds(16, 16)], sems.at[i % 2].at[0])
    c.start()
    c.wait()


def test_two_d_array_matches_raw() -> None:
    ours = local_call(_two_d, [sd.dma_semaphores((2, 3))], grid=(2,))
    theirs = local_call(_two_d_raw, [pltpu.SemaphoreType.DMA((2, 3))], checked=False, grid=(2,))
    assert_same_mosaic(ours, theirs, X)


def _three_d(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray3, flags: sd.RegularSemArray2) -> None:
    sd.LocalCopy(x, o, sems.at[1, 0, 3]).start().wait()
    sd.signal(flags.at[1, 1])
    sd.wait(flags.at[1, 1])


def _three_d_raw(x: Any, o: Any, sems: Any, flags: Any) -> None:
    c = pltpu.make_async_copy(x, o, sems.at[1, 0, 3])
    c.start()
    c.wait()
    pl.semaphore_signal(flags.at[1, 1], 1)
    pl.semaphore_wait(flags.at[1, 1], 1)


def test_three_d_and_regular_two_d_match_raw() -> None:
    ours = local_call(_three_d, [sd.dma_semaphores((2, 2, 4)), sd.regular_semaphores((2, 2))])
    theirs = local_call(
        _three_d_raw,
        [pltpu.SemaphoreType.DMA((2, 2, 4)), pltpu.SemaphoreType.REGULAR((2, 2))],
        checked=False,
    )
    assert_same_mosaic(ours, theirs, X)


def test_declarations_take_an_int_or_a_tuple() -> None:
    assert sd.dma_semaphores(3) == pltpu.SemaphoreType.DMA((3,))
    assert sd.dma_semaphores((2, 3)) == pltpu.SemaphoreType.DMA((2, 3))
    assert sd.regular_semaphores((2, 2)) == pltpu.SemaphoreType.REGULAR((2, 2))
    assert sd.dma_semaphores((2, 3, 4, 5)) == pltpu.SemaphoreType.DMA(
        (2, 3, 4, 5)
    )  # rank 4: SemArray4
    bad_shapes: list[Any] = [0, (2, 0), (), (1, 2, 3, 4, 5), 2.0, True]
    for bad in bad_shapes:
        with pytest.raises(ValueError, match="positive int"):
            sd.dma_semaphores(bad)


def test_a_row_where_one_semaphore_belongs_names_the_index_and_the_fix() -> None:
    def kernel(x: Any, o: Any, sems: Any) -> None:
        sd.LocalCopy(x, o, sems.at[1]).start().wait()

    with pytest.raises(sd.SemaphoreShapeError) as err:
        trace(local_call(kernel, [sd.dma_semaphores((2, 3))]))
    message = str(err.value)
    for part in ("sems.at[1, pl.ds(0, 3)]", "shape (2, 3)", "Select one with sems.at[i, j]"):
        assert part in message, message


@pytest.mark.parametrize(
    "select,index",
    [
        (lambda s: s.at[1, 3], "index 3"),
        (lambda s: s.at[2, 0], "index 2"),
        (lambda s: s.at[-1, 0], "index -1"),
        (lambda s: s.at[1].at[5], "index 5"),
    ],
    ids=["column", "row", "negative", "chained"],
)
def test_a_static_index_outside_the_array_is_caught(select: Any, index: str) -> None:
    def kernel(x: Any, o: Any, sems: Any) -> None:
        sd.LocalCopy(x, o, select(sems)).start().wait()

    with pytest.raises(sd.SemaphoreIndexError) as err:
        trace(local_call(kernel, [sd.dma_semaphores((2, 3))]))
    message = str(err.value)
    for part in (index, "sems", "(2, 3)", "Wrap the index"):
        assert part in message, message


def test_jax_alone_accepts_the_out_of_range_index() -> None:
    """The check adds something: the raw kernel lowers with the bad index."""

    def kernel(x: Any, o: Any, sems: Any) -> None:
        c = pltpu.make_async_copy(x, o, sems.at[1, 3])
        c.start()
        c.wait()

    trace(local_call(kernel, [pltpu.SemaphoreType.DMA((2, 3))], checked=False))


def test_traced_indices_and_signals_are_not_checked_statically() -> None:
    def kernel(x: Any, o: Any, sems: Any, flags: Any) -> None:
        i = pl.program_id(0)
        sd.LocalCopy(x, o, sems.at[i, i + 5]).start().wait()
        sd.signal(flags.at[i, 1])
        sd.wait(flags.at[i, 1])

    trace(local_call(kernel, [sd.dma_semaphores((2, 3)), sd.regular_semaphores((2, 2))], grid=(2,)))


def test_out_of_range_on_a_regular_semaphore_signal() -> None:
    def kernel(x: Any, o: Any, flags: Any) -> None:
        sd.signal(flags.at[0, 2])

    with pytest.raises(sd.SemaphoreIndexError, match="signal"):
        trace(local_call(kernel, [sd.regular_semaphores((2, 2))]))
