"""Races between copies do not hide behind a shared vector-clock entry, however many copies.

jax's race detector counts each copy's events on one entry of a fixed-size
vector clock; two copies on one entry count as one virtual thread, so waiting
the later one orders a core after the earlier one too.  simulate handed out
``DMA_CLOCK_ENTRIES`` entries in turn: with more copies in flight than that, a
read of a copy's destination after a wait that covered only OTHER copies ran
clean when its entry-mate was among them.  Now an entry is reused only once
the issuing core knows its copy completed, and a run with more copies in
flight than entries runs again with more.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, SimulationUnsupportedError, simulate
from safedma.testing import _interpret_probes as probes
from safedma.testing import _runner as runner
from tests.support.simulation import F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

ROWS = 8  # rows of one copy
MANY = probes.DMA_CLOCK_ENTRIES + 40  # copies in flight at once
HALF = MANY // 2


def _call(kernel: Any, copies: int) -> Any:
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((copies * ROWS, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((copies * ROWS, 128), F32), pltpu.SemaphoreType.DMA((2,))],
    )


def _rows(ref: Any, first: int, count: int = 1) -> Any:
    return ref.at[pl.ds(first * ROWS, count * ROWS)]


# --------------------- MANY copies in flight on one semaphore, half of them waited


def _half_waited(x_ref: Any, o_ref: Any, buf: Any, sems: Any, *, read: int | None) -> None:
    sem = sems.at[0]

    def start(i: Any, carry: Any) -> Any:
        pltpu.make_async_copy(_rows(x_ref, i), _rows(buf, i), sem).start()  # each copy
        return carry

    lax.fori_loop(0, MANY, start, 0)
    # One wait for the bytes of the first HALF copies: it consumes their signals.
    pltpu.make_async_copy(_rows(x_ref, 0, HALF), _rows(buf, 0, HALF), sem).wait()
    if read is not None:
        o_ref[pl.ds(0, ROWS), :] = buf[pl.ds(read * ROWS, ROWS), :]  # the early read
    pltpu.make_async_copy(
        _rows(x_ref, HALF, MANY - HALF), _rows(buf, HALF, MANY - HALF), sem
    ).wait()
    if read is None:
        o_ref[...] = buf[...]


def _half_waited_call(read: int | None) -> Any:
    def kernel(*refs: Any) -> None:
        _half_waited(*refs, read=read)

    return _call(kernel, MANY)


def test_many_copies_in_flight_all_waited_run_clean() -> None:
    x = example((MANY * ROWS, 128))
    np.testing.assert_array_equal(np.asarray(simulate(_half_waited_call(None), x)), np.asarray(x))


@pytest.mark.parametrize(
    "read",
    # a copy whose entry-mate (DMA_CLOCK_ENTRIES copies earlier) was waited: missed before
    [probes.DMA_CLOCK_ENTRIES + 1, MANY - 1, HALF],
    ids=["entry-mate-waited", "last", "first-unwaited"],
)
def test_a_read_of_an_unwaited_copy_among_many_in_flight_is_a_race(read: int) -> None:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_half_waited_call(read), example((MANY * ROWS, 128)))
    message = str(caught.value)
    assert f"at {line_of(_half_waited, '# the early read')} " in message, message
    assert line_of(_half_waited, "# each copy") in message, message
    assert_clean_afterwards()


def _two_early_reads(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sem = sems.at[0]

    def start(i: Any, carry: Any) -> Any:
        pltpu.make_async_copy(_rows(x_ref, i), _rows(buf, i), sem).start()
        return carry

    lax.fori_loop(0, MANY, start, 0)
    pltpu.make_async_copy(_rows(x_ref, 0, HALF), _rows(buf, 0, HALF), sem).wait()
    late = probes.DMA_CLOCK_ENTRIES + 1  # its entry-mate was waited: hidden when shared
    o_ref[pl.ds(0, ROWS), :] = buf[pl.ds(late * ROWS, ROWS), :]  # the first race
    o_ref[pl.ds(ROWS, ROWS), :] = buf[pl.ds(HALF * ROWS, ROWS), :]  # a later race
    pltpu.make_async_copy(
        _rows(x_ref, HALF, MANY - HALF), _rows(buf, HALF, MANY - HALF), sem
    ).wait()


def test_a_race_found_while_entries_were_shared_is_not_reported_before_an_earlier_one() -> None:
    # The first run shares entries and meets only the later race; the first race
    # of the kernel is the one a clock with an entry per copy meets.
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_call(_two_early_reads, MANY), example((MANY * ROWS, 128)))
    message = str(caught.value)
    assert f"at {line_of(_two_early_reads, '# the first race')} " in message, message


# --------------------- a long loop of waited copies, one left in flight


LOOP = 3 * probes.DMA_CLOCK_ENTRIES
LEFT = probes.DMA_CLOCK_ENTRIES + 5  # the iteration whose copy is waited late


def _one_left_in_flight(x_ref: Any, o_ref: Any, buf: Any, sems: Any, *, read_early: bool) -> None:
    # Every copy is waited in its own iteration but one, on a semaphore of its own,
    # which is waited after the loop: the entries of the waited copies are reused,
    # the late one's must not be.
    def step(i: Any, carry: Any) -> Any:
        sem = sems.at[jnp.where(i == LEFT, 1, 0)]
        copy = pltpu.make_async_copy(_rows(x_ref, i), _rows(buf, i), sem)
        copy.start()  # each copy

        @pl.when(i != LEFT)
        def _() -> None:
            copy.wait()

        return carry

    lax.fori_loop(0, LOOP, step, 0)
    late = pltpu.make_async_copy(_rows(x_ref, LEFT), _rows(buf, LEFT), sems.at[1])
    if read_early:
        o_ref[pl.ds(0, ROWS), :] = buf[pl.ds(LEFT * ROWS, ROWS), :]  # the early read
    late.wait()
    if not read_early:
        o_ref[...] = buf[...]


def _one_left_call(read_early: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _one_left_in_flight(*refs, read_early=read_early)

    return _call(kernel, LOOP)


def _counting_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    runs: list[int] = []
    execute = runner._Run.execute  # pyright: ignore[reportPrivateUsage]

    def counted(self: Any, recorder: Any, entries: int) -> Any:
        runs.append(entries)
        return execute(self, recorder, entries)

    monkeypatch.setattr(runner._Run, "execute", counted)  # pyright: ignore[reportPrivateUsage]
    return runs


def test_a_long_loop_of_waited_copies_reuses_entries_and_runs_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _counting_runs(monkeypatch)
    x = example((LOOP * ROWS, 128))
    np.testing.assert_array_equal(np.asarray(simulate(_one_left_call(False), x)), np.asarray(x))
    assert runs == [probes.DMA_CLOCK_ENTRIES], runs


def test_the_copy_left_in_flight_keeps_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _counting_runs(monkeypatch)
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_one_left_call(True), example((LOOP * ROWS, 128)))
    assert f"at {line_of(_one_left_in_flight, '# the early read')} " in str(caught.value)
    assert runs == [probes.DMA_CLOCK_ENTRIES], runs


def test_many_in_flight_runs_again_with_an_entry_for_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _counting_runs(monkeypatch)
    simulate(_half_waited_call(None), example((MANY * ROWS, 128)))
    assert len(runs) == 2 and runs[1] >= MANY, runs


def test_more_copies_in_flight_than_the_memory_bound_are_refused_naming_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probes, "MAX_DMA_CLOCK_ENTRIES", probes.DMA_CLOCK_ENTRIES)
    with pytest.raises(SimulationUnsupportedError) as caught:
        simulate(_half_waited_call(None), example((MANY * ROWS, 128)))
    message = str(caught.value)
    assert f"more than {probes.DMA_CLOCK_ENTRIES} copies were in flight at once" in message
    assert line_of(_half_waited, "# each copy") in message, message
    assert "safedma.testing.verify" in message, message
    assert_clean_afterwards()
