"""Gathers, one-way sends and copies sharing a semaphore under strict simulation.

Every kernel here is written for safedma's tests; each reproduces a construct
met in Pallas TPU kernels written outside jax (docs/simulate-jax-tests.md,
"Kernels from other authors") that strict simulation once mishandled, or that
it must keep handling.  The correct kernel must run clean; its broken twin must
be caught, naming the kernel's own line.
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

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, simulate, simulated_mesh
from safedma.testing._errors import Race
from safedma.testing._interpret_probes import DMA_CLOCK_ENTRIES
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ G gathers in flight, one semaphore each


UNITS = 4


def _gather_units(x_ref: Any, o_ref: Any, buf: Any, sems: Any, *, skip_wait: int | None) -> None:
    # A sparse-attention gather: every unit's copy is started, then all are
    # waited, then the gathered block is read. The twin forgets one unit's wait
    # (its copy is still in flight when the block is read, after the OTHER
    # units' waits). Before: jax gave every copy of a one-device run the same
    # vector-clock entry, so the other waits made the read look ordered.
    def unit(g: int) -> Any:
        return pltpu.make_async_copy(x_ref.at[pl.ds(g * 8, 8)], buf.at[pl.ds(g * 8, 8)], sems.at[g])

    for g in range(UNITS):
        unit(g).start()
    for g in range(UNITS):
        if g != skip_wait:
            unit(g).wait()
    o_ref[...] = buf[...] * 2.0  # the gathered block
    if skip_wait is not None:
        unit(skip_wait).wait()


def _gather_call(skip_wait: int | None) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        _gather_units(x_ref, o_ref, buf, sems, skip_wait=skip_wait)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((UNITS * 8, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((UNITS * 8, 128), F32), pltpu.SemaphoreType.DMA((UNITS,))],
    )


def test_gathers_all_waited_before_the_read_run_clean() -> None:
    x = example((UNITS * 8, 128))
    out = simulate(_gather_call(None), x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2.0)


@pytest.mark.parametrize("skipped", [0, UNITS - 1], ids=["first-unit", "last-unit"])
def test_a_read_after_the_other_copies_waits_but_before_its_own_is_a_race(skipped: int) -> None:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_gather_call(skipped), example((UNITS * 8, 128)))
    message = str(caught.value)
    assert f"at {line_of(_gather_units, 'o_ref[...] = buf')} " in message, message
    assert line_of(_gather_units, "unit(g).start()") in message, message
    assert_clean_afterwards()


def _wait_the_other_half(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    first = pltpu.make_async_copy(x_ref.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], sems.at[0])
    second = pltpu.make_async_copy(x_ref.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], sems.at[1])
    second.start()
    first.start()  # started after: still in flight when `second` is waited
    second.wait()
    o_ref[...] = buf[pl.ds(0, 8), :]  # reads first's window, waited below
    first.wait()


def test_copies_started_in_any_order_get_separate_clock_entries() -> None:
    call = pl.pallas_call(
        _wait_the_other_half,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA((2,))],
    )
    with pytest.raises(RaceDetectedError) as caught:
        simulate(call, example((16, 128)))
    assert f"at {line_of(_wait_the_other_half, 'o_ref[...] =')} " in str(caught.value)


def _many_in_flight(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    # More copies in flight than clock entries, all waited before the read:
    # sharing an entry must never make a correct kernel race.
    copies = [
        pltpu.make_async_copy(x_ref.at[pl.ds(i, 1)], buf.at[pl.ds(i, 1)], sem)
        for i in range(DMA_CLOCK_ENTRIES + 8)
    ]
    for copy in copies:
        copy.start()
    for copy in copies:
        copy.wait()
    o_ref[...] = buf[...]


def test_more_copies_in_flight_than_clock_entries_is_still_clean() -> None:
    rows = DMA_CLOCK_ENTRIES + 8
    call = pl.pallas_call(
        _many_in_flight,
        out_shape=jax.ShapeDtypeStruct((rows, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((rows, 128), F32), pltpu.SemaphoreType.DMA],
    )
    x = example((rows, 128))
    np.testing.assert_array_equal(np.asarray(simulate(call, x)), np.asarray(x))


# ------------------------------------ one DMA semaphore for copies of different sizes


def _slices_through_scratch(
    s_ref: Any, x_ref: Any, cache_ref: Any, o_ref: Any, buf: Any, sem: Any, *, drop: bool
) -> None:
    # A cache update: slices of data-dependent length (0 for padding) staged
    # through VMEM, every copy on ONE semaphore, each waited by its own
    # descriptor; the output aliases the cache it scatters into.
    del o_ref
    copies = []
    for i in range(3):
        length = s_ref[2, i]
        copy = pltpu.make_async_copy(
            x_ref.at[pl.ds(s_ref[1, i], length)], buf.at[i, pl.ds(0, length)], sem
        )
        copy.start()
        copies.append(copy)
    for copy in copies[: 2 if drop else 3]:
        copy.wait()
    copies.clear()
    for i in range(3):
        length = s_ref[2, i]
        copy = pltpu.make_async_copy(
            buf.at[i, pl.ds(0, length)], cache_ref.at[pl.ds(s_ref[0, i], length)], sem
        )
        copy.start()
        copies.append(copy)
    for copy in copies:
        copy.wait()


def _cache_update(drop: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _slices_through_scratch(*refs, drop=drop)

    any_space = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((32, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), any_space, any_space],
        out_specs=any_space,
        scratch_shapes=[pltpu.VMEM((3, 8, 128), F32), pltpu.SemaphoreType.DMA],
        input_output_aliases={2: 0},
    )


_SLICES = np.array(
    [[3, 20, 0], [0, 5, 9], [5, 4, 0]], np.int32
)  # cache start, source start, length


def test_slices_of_different_lengths_on_one_semaphore_run_clean() -> None:
    x, cache = example((16, 128)), jnp.zeros((32, 128), F32)
    out = np.asarray(simulate(_cache_update(False), jnp.asarray(_SLICES), x, cache))
    expected = np.zeros((32, 128), np.float32)
    expected[3:8] = np.asarray(x)[0:5]
    expected[20:24] = np.asarray(x)[5:9]
    np.testing.assert_array_equal(out, expected)


def test_a_slice_never_waited_on_the_shared_semaphore_is_caught() -> None:
    # The third slice has length 0: its wait is the one dropped, so nothing is
    # left over; lengths 5 and 4 otherwise.
    slices = _SLICES.copy()
    slices[2, 2] = 3
    with pytest.raises((RaceDetectedError, LeftoverSemaphoreError)) as caught:
        simulate(
            _cache_update(True), jnp.asarray(slices), example((16, 128)), jnp.zeros((32, 128), F32)
        )
    assert line_of(_slices_through_scratch, "x_ref.at[pl.ds(s_ref[1, i], length)]") in str(
        caught.value
    ) or line_of(_slices_through_scratch, "copy.start()") in str(caught.value), str(caught.value)


# ------------------------------------ one chip sends, the other only waits (no barrier)


def _one_way_send(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any, *, wait_recv: bool) -> None:
    # A benchmark-style one-way transfer: device 0 writes device 1's output;
    # device 1 only waits for it. The twin's receiver returns without waiting.
    me = lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(1,))

    @pl.when(me == 0)
    def _() -> None:
        copy.start()
        copy.wait_send()

    @pl.when(me == 1)
    def _() -> None:
        if wait_recv:
            copy.wait_recv()


def _one_way_call(wait_recv: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _one_way_send(*refs, wait_recv=wait_recv)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
    )


# Only device 1's output is written (the test reads only that half): R6 on device 0.
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_a_one_way_send_waited_by_the_receiver_runs_clean() -> None:
    x = example((16, 128))
    out = np.asarray(simulate(_one_way_call(True), x, mesh=simulated_mesh(2, "x")))
    np.testing.assert_array_equal(out[8:], np.asarray(x)[:8])


def test_a_receiver_that_returns_without_wait_recv_is_a_race_naming_the_send() -> None:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_one_way_call(False), example((16, 128)), mesh=simulated_mesh(2, "x"))
    message = str(caught.value)
    # Whichever access jax's detector meets second, the message names the copy's
    # start and says the receiver's body had returned.
    assert line_of(_one_way_send, "copy.start()") in message, message
    assert "copying the kernel's outputs back" in message or "wait_recv" in message, message
    assert_clean_afterwards()


def test_a_copy_landing_after_the_outputs_were_copied_back_says_the_wait_is_missing() -> None:
    report = (
        "RACE DETECTED\n"
        "  write of ('hbm', 101, 1, 0)[()] from (100, 0), /k.py:36:4 (send)\n"
        "  read of ('hbm', 101, 1, 0)[(slice(0, 8, 1),)] from (1, 0), pallas_call\n"
    )
    race = Race("write", "DMA #100", "device 1", ("hbm", 101, 1, 0), "/k.py:36 (send)", report)
    message = str(RaceDetectedError([race]))
    assert "by DMA #100 at /k.py:36 (send) landed after the kernel body of device 1" in message
    assert "a wait_recv (or wait) is missing there" in message
    assert "is not ordered after" not in message


def _two_copies_into_the_same_rows(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    first = pltpu.make_async_copy(x_ref.at[pl.ds(0, 8)], buf, sem)
    second = pltpu.make_async_copy(x_ref.at[pl.ds(8, 8)], buf, sem)
    first.start()
    second.start()  # writes the rows `first` may still be writing
    first.wait()
    second.wait()
    o_ref[...] = buf[...]


def test_two_copies_in_flight_into_the_same_rows_are_a_race() -> None:
    # Masked while every copy of a one-device run shared one clock entry.
    call = pl.pallas_call(
        _two_copies_into_the_same_rows,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM(BLOCK, F32), pltpu.SemaphoreType.DMA],
    )
    with pytest.raises(RaceDetectedError) as caught:
        simulate(call, example((16, 128)))
    assert line_of(_two_copies_into_the_same_rows, "second.start()") in str(caught.value)
