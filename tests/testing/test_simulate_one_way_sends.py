"""One-way sends under strict simulation: one chip sends and the other only waits, so the
receiver's wait is the only order between the copy and what reads its rows.

The correct kernel must run clean under strict simulation; its broken twin must be
caught, naming the kernel's own line.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, simulate, simulated_mesh
from safedma.testing._errors import Race
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


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
