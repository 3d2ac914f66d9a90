"""verify's messages name the line to fix where it is not the copy's own line: the
``make_async_copy`` that built a descriptor started lines later (or through a list),
a wait aimed at another semaphore than the copy's, the ``pl.when`` a copy is
started under, and the branch of a start-or-wait helper where its missing wait belongs. The kernels are written here; each line a message must name is
marked ``# fix: <name>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, SimulationError, verify
from tests.corpus._case import marked_lines, names_line

HERE = Path(__file__)
HBM = pl.BlockSpec(memory_space=pl.ANY)
BLOCK = (8, 128)
X = jax.ShapeDtypeStruct(BLOCK, jnp.float32)


def _call(kernel: Any, sems: int, grid: int = 1) -> Any:
    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            grid=(grid,),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=pl.BlockSpec(BLOCK, lambda i: (0, 0)),
            scratch_shapes=[
                pltpu.VMEM((2, *BLOCK), jnp.float32),
                pltpu.SemaphoreType.DMA((sems,)),
            ],
        )(x)
        return out

    return fn


def _failure(fn: Any) -> str:
    with pytest.raises(SimulationError) as caught:
        verify(fn, X)
    return str(caught.value)


def _descriptor_made_early(slot: int) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        copy = pltpu.make_async_copy(  # fix: made_early
            x_ref,
            buf.at[0],
            sems.at[slot],
        )
        copy.start()
        copy.wait()
        o_ref[...] = buf[0]

    return _call(kernel, sems=1)


def test_a_descriptor_started_lines_after_it_is_made_names_the_line_that_made_it() -> None:
    assert verify(_descriptor_made_early(0), X).dmas == 1
    message = _failure(_descriptor_made_early(1))  # sems.at[1] of a 1-semaphore array
    assert "index 1 is outside" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "made_early")), message


def _descriptors_in_a_list(slot: int) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        copies = []
        for k in range(2):
            copy = pltpu.make_async_copy(x_ref, buf.at[k], sems.at[slot])  # fix: in_list
            copies.append(copy)
        jax.tree.map(lambda c: c.start(), copies)
        jax.tree.map(lambda c: c.wait(), copies)
        o_ref[...] = buf[0] + buf[1]

    return _call(kernel, sems=1)


def test_descriptors_started_through_a_list_name_the_line_that_made_them() -> None:
    assert verify(_descriptors_in_a_list(0), X).dmas == 2
    message = _failure(_descriptors_in_a_list(1))
    assert names_line(message, HERE, marked_lines(HERE, "in_list")), message


def _wait_on_slot(waited: int) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0]).start()
        pltpu.make_async_copy(x_ref, buf.at[1], sems.at[1]).start()
        pltpu.make_async_copy(buf.at[0], buf.at[0], sems.at[waited]).wait()  # fix: aimed
        o_ref[...] = buf[0]
        pltpu.make_async_copy(x_ref, buf.at[1], sems.at[1 - waited]).wait()

    return _call(kernel, sems=2)


def test_a_wait_on_another_slot_than_its_copys_is_named_with_both_semaphores() -> None:
    assert verify(_wait_on_slot(0), X).waits == 2
    with pytest.raises(RaceDetectedError) as caught:
        verify(_wait_on_slot(1), X)
    message = str(caught.value)
    (line,) = marked_lines(HERE, "aimed")
    assert f"the wait at {HERE}:{line}" in message, message
    assert "names this buffer but waits on sems[1], not on sems[0]" in message, message


def _prefetch_guarded(guarded: bool) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _() -> None:
            pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0]).start()

        @pl.when((i + 1 < 2) if guarded else True)  # fix: guard
        def _() -> None:
            pltpu.make_async_copy(x_ref, buf.at[(i + 1) % 2], sems.at[(i + 1) % 2]).start()

        pltpu.make_async_copy(x_ref, buf.at[i % 2], sems.at[i % 2]).wait()
        o_ref[...] = buf[i % 2]

    return _call(kernel, sems=2, grid=2)


def test_a_copy_started_past_its_guard_names_the_condition_it_runs_under() -> None:
    assert verify(_prefetch_guarded(True), X).dmas == 2
    message = _failure(_prefetch_guarded(False))
    (line,) = marked_lines(HERE, "guard")
    assert f"under the condition at {HERE.name}:{line}" in message, message


def _started_on_slot(slot: int) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[slot])  # fix: start_slot
        copy.start()
        pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0]).wait()
        o_ref[...] = buf[0]

    return _call(kernel, sems=2)


def test_a_wait_blocked_while_the_next_slot_holds_its_copy_names_that_copys_line() -> None:
    assert verify(_started_on_slot(0), X).dmas == 1
    message = _failure(_started_on_slot(1))
    assert "deadlock" in message and "sems[1] holds 4096 bytes from" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "start_slot")), message


def _waited_twice(twice: bool) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0])
        copy.start()
        copy.wait()  # fix: first_wait
        if twice:
            copy.wait()
        o_ref[...] = buf[0]

    return _call(kernel, sems=1)


def test_a_second_wait_of_one_copy_names_where_the_first_took_its_count() -> None:
    assert verify(_waited_twice(False), X).waits == 1
    message = _failure(_waited_twice(True))
    (line,) = marked_lines(HERE, "first_wait")
    assert f"last waited sems[0] at {HERE}:{line}" in message, message


def _two_copies_on_one_semaphore(shared: bool) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        first = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0])
        second = pltpu.make_async_copy(x_ref, buf.at[1], sems.at[0 if shared else 1])  # fix: shared
        first.start()
        second.start()
        first.wait()
        o_ref[...] = buf[0]
        second.wait()

    return _call(kernel, sems=2)


def test_a_wait_released_by_either_of_two_copies_names_both_lines() -> None:
    assert verify(_two_copies_on_one_semaphore(False), X).waits == 2
    message = _failure(_two_copies_on_one_semaphore(True))
    assert "it may count those started at" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "shared")), message


def _started_in_a_pl_loop() -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        @pl.loop(0, 2)
        def _(k: Any) -> None:
            pltpu.make_async_copy(x_ref, buf.at[k], sems.at[k]).start()

        o_ref[...] = buf[0]
        pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0]).wait()
        pltpu.make_async_copy(x_ref, buf.at[1], sems.at[1]).wait()

    return _call(kernel, sems=2)


def test_a_copy_started_in_a_pl_loop_names_no_condition() -> None:
    """pl.loop lives beside pl.when in jax's helpers: a loop body is no condition."""
    message = _failure(_started_in_a_pl_loop())
    assert "under the condition" not in message, message


def _start_or_wait_kernel(waits: bool) -> Any:
    def fetch_and_wait(x_ref: Any, buf: Any, sems: Any, wait: bool) -> None:
        copy = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0])
        if wait:
            copy.wait()
        else:
            copy.start()

    def fetch_without_waiting(x_ref: Any, buf: Any, sems: Any, wait: bool) -> None:
        copy = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0])
        if wait:
            pass  # fix: wait_branch
        else:
            copy.start()

    fetch = fetch_and_wait if waits else fetch_without_waiting

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        fetch(x_ref, buf, sems, wait=False)
        fetch(x_ref, buf, sems, wait=True)
        o_ref[...] = buf[0]

    return _call(kernel, sems=1)


def test_a_start_or_wait_helper_that_does_not_wait_names_its_wait_branch() -> None:
    assert verify(_start_or_wait_kernel(waits=True), X).dmas == 1
    message = _failure(_start_or_wait_kernel(waits=False))
    assert "the wait belongs there" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "wait_branch")), message


def _half_waited(half: bool) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        first = pltpu.make_async_copy(x_ref, buf.at[0], sems.at[0])
        second = pltpu.make_async_copy(x_ref, buf.at[1], sems.at[0])
        first.start()
        second.start()
        rows = 4 if half else 8
        pltpu.make_async_copy(  # fix: half_wait
            x_ref.at[pl.ds(0, rows)], buf.at[0, pl.ds(0, rows)], sems.at[0]
        ).wait()
        second.wait()
        o_ref[...] = buf[1]

    return _call(kernel, sems=1)


def test_a_wait_smaller_than_the_copy_it_names_is_named_when_a_later_wait_is_released_early() -> (
    None
):
    assert verify(_half_waited(False), X).dmas == 2
    message = _failure(_half_waited(True))
    assert "took 2048 bytes, less than the 4096-byte copy of x_ref" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "half_wait")), message
