"""Gathers in flight under strict simulation: G copies, one semaphore each, started in any
order and more of them than the race detector has clock entries.

The correct kernel must run clean under strict simulation; its broken twin must be
caught, naming the kernel's own line.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, simulate
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
