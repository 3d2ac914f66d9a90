"""Computed semaphore indices are read as the slots they can take (safedma/_slot_ranges.py).

A wait on ``sems.at[i % 2]`` stands for copies on slots 0 and 1 only: a copy on slot 2
that no wait can reach is reported, naming the line that started it, for raw pltpu
copies and for the typed API alike. Every range covers all loop iterations and grid
steps, so double buffering, rings, program_id- and where-selected slots and arithmetic
the analysis does not follow stay silent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.support.tracing import VMEM, trace

ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)
THIS_FILE = "test_computed_semaphore_slots.py"


def _raw(kernel: Callable[..., None], *, grid: tuple[int, ...] = (4,), slots: int = 3) -> None:
    call = pl.pallas_call(
        sd.checked(kernel),
        out_shape=X,
        in_specs=[ANY],
        out_specs=ANY,
        grid=grid,
        scratch_shapes=[
            pltpu.VMEM((slots, 8, 128), jnp.float32),
            pltpu.SemaphoreType.DMA((slots,)),
        ],
    )
    jax.jit(call).trace(X)


def _copy(x: Any, buf: Any, sems: Any, slot: Any) -> Any:
    return pltpu.make_async_copy(x.at[pl.ds(0, 8)], buf.at[slot], sems.at[slot])


def _marked(fn: Callable[..., None], mark: str = "leak") -> int:
    lines, first = inspect.getsourcelines(fn)
    return next(first + i for i, line in enumerate(lines) if f"# line: {mark}" in line)


# ------------------------------------------------------------------ raw mistakes


def raw_slot_two_outside_a_floor_mod(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    _copy(x, buf, sems, 0).start()
    _copy(x, buf, sems, 1).start()
    _copy(x, buf, sems, 2).start()  # line: leak
    _copy(x, buf, sems, i % 2).wait()
    _copy(x, buf, sems, (i + 1) % 2).wait()


def raw_slot_two_outside_a_loop_index(x: Any, o: Any, buf: Any, sems: Any) -> None:
    _copy(x, buf, sems, 2).start()  # line: leak

    def body(j: Any, carry: Any) -> Any:
        _copy(x, buf, sems, j).start()
        _copy(x, buf, sems, j).wait()
        return carry

    jax.lax.fori_loop(0, 2, body, 0)


def raw_slot_zero_outside_a_dynamic_loop(x: Any, o: Any, buf: Any, sems: Any) -> None:
    _copy(x, buf, sems, 0).start()  # line: leak
    stop = 3 + pl.program_id(0) * 0  # a traced bound: a while loop

    def body(j: Any, carry: Any) -> Any:
        _copy(x, buf, sems, j).start()
        _copy(x, buf, sems, j).wait()
        return carry

    jax.lax.fori_loop(1, jnp.minimum(stop, 3), body, 0)


def raw_slot_two_outside_lax_rem(x: Any, o: Any, buf: Any, sems: Any) -> None:
    _copy(x, buf, sems, 2).start()  # line: leak
    _copy(x, buf, sems, jax.lax.rem(pl.program_id(0) + 1, 2)).wait()


def raw_slot_two_outside_a_where(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    _copy(x, buf, sems, 2).start()  # line: leak
    _copy(x, buf, sems, jnp.where(i > 1, 0, 1)).wait()


def raw_slot_two_outside_a_mask(x: Any, o: Any, buf: Any, sems: Any) -> None:
    _copy(x, buf, sems, 2).start()  # line: leak
    _copy(x, buf, sems, jnp.bitwise_and(pl.program_id(0), 1)).wait()


def raw_slot_three_outside_program_id(x: Any, o: Any, buf: Any, sems: Any) -> None:
    # grid (3,): program_id is 0..2, never 3.
    _copy(x, buf, sems, 3).start()  # line: leak
    _copy(x, buf, sems, pl.program_id(0)).wait()


def raw_computed_start_outside_every_wait(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    _copy(x, buf, sems, i % 2).start()
    _copy(x, buf, sems, i % 2 + 2).start()  # line: leak
    _copy(x, buf, sems, i % 2).wait()
    _copy(x, buf, sems, 1 - i % 2).wait()


@pytest.mark.parametrize(
    ("kernel", "grid", "slots"),
    [
        (raw_computed_start_outside_every_wait, (4,), 4),
        (raw_slot_two_outside_a_floor_mod, (4,), 3),
        (raw_slot_two_outside_a_loop_index, (4,), 3),
        (raw_slot_zero_outside_a_dynamic_loop, (4,), 3),
        (raw_slot_two_outside_lax_rem, (4,), 3),
        (raw_slot_two_outside_a_where, (4,), 3),
        (raw_slot_two_outside_a_mask, (4,), 3),
        (raw_slot_three_outside_program_id, (3,), 4),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_a_raw_copy_outside_every_computed_wait_is_never_waited(
    kernel: Callable[..., None], grid: tuple[int, ...], slots: int
) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        _raw(kernel, grid=grid, slots=slots)
    message = str(caught.value)
    assert f"{THIS_FILE}:{_marked(kernel)}" in message, message
    assert "1 raw copy was started and never waited" in message, message


# ------------------------------------------------------------------ typed mistakes


def typed_slot_two_outside_a_floor_mod(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x_ref, buf, sems.at[0]).start()
    sd.LocalCopy(x_ref, buf, sems.at[1]).start()
    sd.LocalCopy(x_ref, buf, sems.at[2]).start()  # line: leak
    sd.LocalCopy(x_ref, buf, sems.at[i % 2]).started_elsewhere().wait()
    sd.LocalCopy(x_ref, buf, sems.at[1 - i % 2]).started_elsewhere().wait()


def typed_slot_two_outside_a_loop(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sd.LocalCopy(x_ref, buf, sems.at[2]).start()  # line: leak

    def body(j: Any, carry: Any) -> Any:
        sd.LocalCopy(x_ref, buf, sems.at[j % 2]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, 4, body, 0)


def typed_slot_two_outside_a_raw_wait(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sd.LocalCopy(x_ref, buf, sems.at[2]).start()  # line: leak
    slot = jax.lax.rem(pl.program_id(0), 2)
    pltpu.make_async_copy(x_ref, buf, sems.at[slot]).wait()


def typed_computed_start_outside_every_wait(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    def body(j: Any, carry: Any) -> Any:
        sd.LocalCopy(x_ref, buf, sems.at[j + 1]).start()  # line: leak
        sd.LocalCopy(x_ref, buf, sems.at[j % 2]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(1, 2, body, 0)  # j is 1: starts slot 2, waits slot 1


@pytest.mark.parametrize(
    "kernel",
    [
        typed_computed_start_outside_every_wait,
        typed_slot_two_outside_a_floor_mod,
        typed_slot_two_outside_a_loop,
        typed_slot_two_outside_a_raw_wait,
    ],
    ids=lambda k: k.__name__,
)
def test_a_typed_copy_outside_every_computed_wait_is_never_waited(
    kernel: Callable[..., None],
) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        trace(kernel, [VMEM, sd.dma_semaphores(3)], grid=(4,))
    message = str(caught.value)
    assert f"{THIS_FILE}:{_marked(kernel)}" in message, message
    assert "1 copy was started and never waited" in message, message


# ------------------------------------------------------------------ correct raw kernels


def raw_double_buffered_loop(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """Iteration i starts slot (i+1) % 2 and waits slot i % 2 (started one iteration before)."""
    _copy(x, buf, sems, 0).start()

    def body(i: Any, carry: Any) -> Any:
        @pl.when(i + 1 < 6)
        def _() -> None:
            _copy(x, buf, sems, (i + 1) % 2).start()

        _copy(x, buf, sems, i % 2).wait()
        return carry

    jax.lax.fori_loop(0, 6, body, 0)


def raw_double_buffered_one_minus_slot(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    slot = i % 2

    @pl.when(i == 0)
    def _() -> None:
        _copy(x, buf, sems, slot).start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        _copy(x, buf, sems, 1 - slot).start()

    _copy(x, buf, sems, slot).wait()


def raw_ring_across_grid_steps(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """A ring of three slots: step i starts slot (i+1) % 3, waits slot i % 3."""
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _() -> None:
        _copy(x, buf, sems, 0).start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        _copy(x, buf, sems, (i + 1) % 3).start()

    _copy(x, buf, sems, i % 3).wait()


def raw_program_id_slots(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """grid (3,): each step starts and waits its own slot; slot 2 is some step's."""
    i = pl.program_id(0)
    _copy(x, buf, sems, i).start()
    _copy(x, buf, sems, 2).wait()

    @pl.when(i != 2)
    def _() -> None:
        _copy(x, buf, sems, i).wait()

    @pl.when(i == 2)
    def _() -> None:
        _copy(x, buf, sems, 2).start()


def raw_where_selected_slots(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)

    @pl.when(i > 1)
    def _() -> None:
        _copy(x, buf, sems, 2).start()

    @pl.when(i <= 1)
    def _() -> None:
        _copy(x, buf, sems, 0).start()

    _copy(x, buf, sems, jnp.where(i > 1, 2, 0)).wait()


def raw_clamped_slot(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    _copy(x, buf, sems, jnp.minimum(i, 2)).start()
    _copy(x, buf, sems, jnp.clip(i, 0, 2)).wait()


def raw_unknown_arithmetic(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """A shift the analysis does not follow ((i + 8) >> 2 is 2) may be any slot."""
    i = pl.program_id(0)
    _copy(x, buf, sems, 2).start()
    _copy(x, buf, sems, jnp.right_shift(i + 8, 2)).wait()


def raw_lax_rem_of_a_negative_dividend(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """grid (2,): lax.rem(i - 1, 2) is -1 at step 0 (the dividend's sign), so the wait's
    slot is 0 there, 1 at step 1."""
    i = pl.program_id(0)

    @pl.when(i == 0)
    def _() -> None:
        _copy(x, buf, sems, 0).start()

    @pl.when(i == 1)
    def _() -> None:
        _copy(x, buf, sems, 1).start()

    _copy(x, buf, sems, jax.lax.rem(i - 1, 2) + 1).wait()


def raw_a_carried_slot(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """A slot carried through the loop (not its index) is unknown: any slot."""
    _copy(x, buf, sems, 0).start()

    def body(j: Any, slot: Any) -> Any:
        _copy(x, buf, sems, slot).wait()
        _copy(x, buf, sems, 1 - slot).start()
        return 1 - slot

    last = jax.lax.fori_loop(0, 3, body, 0)
    _copy(x, buf, sems, last).wait()


def raw_nested_loop_indices(x: Any, o: Any, buf: Any, sems: Any) -> None:
    def outer(i: Any, carry: Any) -> Any:
        def inner(j: Any, carry: Any) -> Any:
            _copy(x, buf, sems, i + j).start()
            _copy(x, buf, sems, (i + j) % 3).wait()
            return carry

        return jax.lax.fori_loop(0, 2, inner, carry)

    jax.lax.fori_loop(0, 2, outer, 0)


def raw_counting_down(x: Any, o: Any, buf: Any, sems: Any) -> None:
    _copy(x, buf, sems, 2).start()

    def body(k: Any, carry: Any) -> Any:
        _copy(x, buf, sems, 2 - k).wait()

        @pl.when(k < 2)
        def _() -> None:
            _copy(x, buf, sems, 1 - k).start()

        return carry

    jax.lax.fori_loop(0, 3, body, 0)


def raw_dynamic_trip_count(x: Any, o: Any, buf: Any, sems: Any) -> None:
    stop = jnp.minimum(pl.program_id(0) + 1, 3)
    _copy(x, buf, sems, 0).start()

    def body(j: Any, carry: Any) -> Any:
        _copy(x, buf, sems, j).wait()

        @pl.when(j + 1 < stop)
        def _() -> None:
            _copy(x, buf, sems, j + 1).start()

        return carry

    jax.lax.fori_loop(0, stop, body, 0)


@jax.jit
def _next_slot(i: Any) -> Any:
    return (i + 1) % 3


def raw_slot_from_a_jitted_helper(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    _copy(x, buf, sems, _next_slot(i + 1)).start()
    _copy(x, buf, sems, _next_slot(i + 1)).wait()
    _copy(x, buf, sems, 2).start()
    _copy(x, buf, sems, _next_slot(i)).wait()

    @pl.when(_next_slot(i) != 2)
    def _() -> None:
        _copy(x, buf, sems, 2).wait()


def raw_slot_computed_outside_a_branch(x: Any, o: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    slot = (i + 2) % 3

    @pl.when(i > 0)
    def _() -> None:
        _copy(x, buf, sems, slot).start()
        _copy(x, buf, sems, slot).wait()

    _copy(x, buf, sems, 2).start()
    _copy(x, buf, sems, jnp.maximum(slot, 2)).wait()


def raw_double_buffered_single_trip(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """One iteration: the prefetch branch never runs, and its copy on slot 1 (the only
    one no wait's slot 0 can reach) never starts."""
    _copy(x, buf, sems, 0).start()

    def body(i: Any, carry: Any) -> Any:
        slot = i % 2

        @pl.when(i + 1 < 1)
        def _() -> None:
            _copy(x, buf, sems, 1 - slot).start()

        _copy(x, buf, sems, slot).wait()
        return carry

    jax.lax.fori_loop(0, 1, body, 0)


def raw_guarded_prefetch_in_a_single_trip(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """One iteration, and a prefetch guarded by a value read in the kernel: its slot
    (1) is no wait's, but the guard (not the slot) is what keeps it from starting."""
    _copy(x, buf, sems, 0).start()

    def body(i: Any, carry: Any) -> Any:
        @pl.when(buf[0, 0, 0] > i + 1)
        def _() -> None:
            _copy(x, buf, sems, (i + 1) % 2).start()

        _copy(x, buf, sems, i % 2).wait()
        return carry

    jax.lax.fori_loop(0, 1, body, 0)


@pytest.mark.parametrize(
    ("kernel", "grid"),
    [
        (raw_guarded_prefetch_in_a_single_trip, (4,)),
        (raw_double_buffered_single_trip, (4,)),
        (raw_double_buffered_one_minus_slot, (1,)),
        (raw_ring_across_grid_steps, (1,)),
        (raw_double_buffered_loop, (4,)),
        (raw_double_buffered_one_minus_slot, (4,)),
        (raw_ring_across_grid_steps, (5,)),
        (raw_program_id_slots, (3,)),
        (raw_where_selected_slots, (4,)),
        (raw_clamped_slot, (4,)),
        (raw_unknown_arithmetic, (4,)),
        (raw_lax_rem_of_a_negative_dividend, (2,)),
        (raw_a_carried_slot, (4,)),
        (raw_nested_loop_indices, (4,)),
        (raw_counting_down, (4,)),
        (raw_dynamic_trip_count, (4,)),
        (raw_slot_from_a_jitted_helper, (4,)),
        (raw_slot_computed_outside_a_branch, (4,)),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_correct_raw_computed_slots_trace_clean(
    kernel: Callable[..., None], grid: tuple[int, ...]
) -> None:
    _raw(kernel, grid=grid)


def test_a_program_id_of_a_dynamic_grid_is_any_slot() -> None:
    """No size for the grid dimension: program_id may be any slot, so it waits slot 2."""

    def kernel(n: Any, x: Any, o: Any, buf: Any, sems: Any) -> None:
        _copy(x, buf, sems, 2).start()
        _copy(x, buf, sems, pl.program_id(0)).wait()

    call = pl.pallas_call(
        sd.checked(kernel),
        out_shape=X,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(jnp.int32(2) + 0,),  # traced: a dynamic grid dimension
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[
                pltpu.VMEM((3, 8, 128), jnp.float32),
                pltpu.SemaphoreType.DMA((3,)),
            ],
        ),
    )
    jax.jit(call).trace(jnp.zeros((1,), jnp.int32), X)


# ------------------------------------------------------------------ correct typed kernels


def typed_double_buffered_loop(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sd.LocalCopy(x_ref, buf, sems.at[0]).start()

    def body(i: Any, carry: Any) -> Any:
        @pl.when(i + 1 < 4)
        def _() -> None:
            sd.LocalCopy(x_ref, buf, sems.at[(i + 1) % 2]).start()

        sd.LocalCopy(x_ref, buf, sems.at[i % 2]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, 4, body, 0)


def typed_across_grid_steps(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    slot = i % 2

    @pl.when(i == 0)
    def _() -> None:
        sd.LocalCopy(x_ref, buf, sems.at[slot]).start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        sd.LocalCopy(x_ref, buf, sems.at[1 - slot]).start()

    sd.LocalCopy(x_ref, buf, sems.at[slot]).started_elsewhere().wait()


def typed_double_buffered_single_trip(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sd.LocalCopy(x_ref, buf, sems.at[0]).start()

    def body(i: Any, carry: Any) -> Any:
        slot = i % 2

        @pl.when(i + 1 < 1)
        def _() -> None:
            sd.LocalCopy(x_ref, buf, sems.at[1 - slot]).start()

        sd.LocalCopy(x_ref, buf, sems.at[slot]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, 1, body, 0)


def typed_guarded_prefetch_in_a_single_trip(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    sd.LocalCopy(x_ref, buf, sems.at[0]).start()

    def body(i: Any, carry: Any) -> Any:
        @pl.when(buf[0, 0, 0] > i + 1)
        def _() -> None:
            sd.LocalCopy(x_ref, buf, sems.at[(i + 1) % 2]).start()

        sd.LocalCopy(x_ref, buf, sems.at[i % 2]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, 1, body, 0)


def typed_ring_of_three(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x_ref, buf, sems.at[2]).start()
    sd.LocalCopy(x_ref, buf, sems.at[(i + 1) % 3]).started_elsewhere().wait()


def typed_unknown_slot(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x_ref, buf, sems.at[2]).start()
    sd.LocalCopy(x_ref, buf, sems.at[jnp.right_shift(i + 8, 2)]).started_elsewhere().wait()


def typed_where_selected(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x_ref, buf, sems.at[jnp.where(i > 1, 2, 0)]).start()
    sd.LocalCopy(x_ref, buf, sems.at[2]).started_elsewhere().wait()


def typed_loop_index_slots(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    def body(j: Any, carry: Any) -> Any:
        sd.LocalCopy(x_ref, buf, sems.at[j]).start()
        return carry

    jax.lax.fori_loop(0, 3, body, 0)

    def drain(j: Any, carry: Any) -> Any:
        sd.LocalCopy(x_ref, buf, sems.at[2 - j]).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, 3, drain, 0)


@pytest.mark.parametrize(
    "kernel",
    [
        typed_double_buffered_loop,
        typed_double_buffered_single_trip,
        typed_guarded_prefetch_in_a_single_trip,
        typed_across_grid_steps,
        typed_ring_of_three,
        typed_unknown_slot,
        typed_where_selected,
        typed_loop_index_slots,
    ],
    ids=lambda k: k.__name__,
)
def test_correct_typed_computed_slots_trace_clean(kernel: Callable[..., None]) -> None:
    trace(kernel, [VMEM, sd.dma_semaphores(3)], grid=(4,))


def test_a_copy_in_a_branch_no_grid_step_takes_is_any_slot() -> None:
    """grid (1,): the prefetch branch never runs; its copy's slot (1) is no wait's."""
    trace(typed_across_grid_steps, [VMEM, sd.dma_semaphores(3)], grid=(1,))
