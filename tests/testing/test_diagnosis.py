"""What simulate's messages say: the user's own line, one entry per copy site, every leftover
on every device in a stable order.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, UnsatisfiableWaitError
from safedma.testing import simulate, simulated_mesh
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, dma, example, hbm_call
from tests.support.simulation import over_signalled_barrier
from tests.corpus._case import library_lines
from tests.support.source_lines import marker_line

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

THIS_FILE = re.escape(__file__.rsplit("/", 1)[-1])


# ------------------------------------------------ 5: the user's own line


def test_unsatisfiable_safedma_wait_is_located_at_the_users_line() -> None:
    # Before: "waits at .../safedma/copies.py:243 (wait)".
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
        for i in range(3):
            sd.LocalCopy(x_ref.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)], sem).start()
        sd.wait_all_into(buf, sem)  # marker: aggregate wait
        sd.LocalCopy(buf, o_ref, out_sem).start().wait()

    with pytest.raises(UnsatisfiableWaitError) as info:
        simulate(
            hbm_call(sd.checked(kernel), [pltpu.VMEM((32, 128), F32), *dma(2)]),
            example((32, 128)),
            timeout_s=30.0,
        )
    [stuck] = info.value.waits
    assert stuck.location is not None
    assert f"{__file__}:{marker_line(__file__, 'marker: aggregate wait')} " in stuck.location
    assert not library_lines(str(info.value)), str(info.value)


def test_copies_started_from_different_lines_are_reported_separately() -> None:
    # Before: every start was "safedma/copies.py:127", merged as "started 5 times".
    # The extra copy lands in a buffer of its own: into buf.at[0:8] it would race
    # with the loop's first copy (two copies writing the same rows, neither
    # waited), which simulate reports once copies have clock entries of their own.
    def kernel(x_ref: Any, o_ref: Any, buf: Any, spare: Any, sem: Any, out_sem: Any) -> None:
        for i in range(4):
            sd.LocalCopy(
                x_ref.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)], sem
            ).start()  # marker: page loop
        sd.LocalCopy(x_ref.at[pl.ds(0, 8)], spare, sem).start()  # marker: extra
        sd.wait_all_into(buf, sem)  # waits for four pages: the fifth is left over
        sd.LocalCopy(buf, o_ref, out_sem).start().wait()

    scratch = [pltpu.VMEM((32, 128), F32), pltpu.VMEM(BLOCK, F32), *dma(2)]
    with pytest.raises(LeftoverSemaphoreError) as info:
        simulate(hbm_call(sd.checked(kernel), scratch), example((32, 128)))
    [leftover] = info.value.leftovers
    loop_line, extra_line = (
        marker_line(__file__, "marker: page loop"),
        marker_line(__file__, "marker: extra"),
    )
    # The loop's start is one statement over two lines: Python 3.11 reports its
    # first line, 3.12 the line of the .start() call.
    assert re.search(
        rf"{THIS_FILE}:({loop_line - 1}|{loop_line}) .*\(started 4 times\)", leftover.hint
    ), leftover.hint
    assert re.search(rf"{THIS_FILE}:{extra_line} ", leftover.hint)
    assert not library_lines(str(info.value)), str(info.value)
    assert_clean_afterwards()


def test_race_on_a_safedma_copy_is_located_at_the_users_line() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, early: Any, sem: Any, out_sem: Any) -> None:
        copy = sd.LocalCopy(x_ref, buf, sem).start()
        early[...] = buf[...]  # marker: too early
        copy.wait()
        sd.LocalCopy(early, o_ref, out_sem).start().wait()

    scratch = [pltpu.VMEM(BLOCK, F32), pltpu.VMEM(BLOCK, F32), *dma(2)]
    with pytest.raises(RaceDetectedError) as info:
        simulate(hbm_call(sd.checked(kernel), scratch), example(BLOCK))
    assert info.value.races[0].location is not None
    assert f":{marker_line(__file__, 'marker: too early')} " in info.value.races[0].location
    assert THIS_FILE.replace("\\", "") in info.value.races[0].location


def test_library_kernels_count_as_user_code() -> None:
    from safedma.testing import _interpret_probes as probes

    assert probes._is_library_file(sd.__file__)
    assert probes._is_library_file(probes.__file__)
    kernels = __import__("safedma.kernels", fromlist=["_"])
    assert not probes._is_library_file(kernels.__file__)
    assert not probes._is_library_file(__file__)


# ------------------------------------- 6: every leftover, every device, every run


def _signal_the_next_device(x_ref: Any, o_ref: Any, sem: Any, flag: Any) -> None:
    me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
    pl.semaphore_signal(flag, 1, device_id={"x": (me + 1) % n})  # never waited
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


@pytest.mark.slow
def test_leftover_on_all_8_devices_is_listed_completely_10_times_in_a_row() -> None:
    # Before: each run reported anywhere from 3 to 8 of the 8 devices, because
    # each device was read when it exited, before its neighbour had signalled it.
    mesh = simulated_mesh(8, "x")
    call = hbm_call(_signal_the_next_device, [*dma(), pltpu.SemaphoreType.REGULAR(())])
    texts = []
    for _ in range(10):
        with pytest.raises(LeftoverSemaphoreError) as info:
            simulate(call, example((64, 128)), mesh=mesh)
        leftovers = info.value.leftovers
        assert [x.device_id for x in leftovers] == list(range(8))
        assert {(x.kind, x.count) for x in leftovers} == {("REGULAR", 1)}
        texts.append(str(info.value))
    assert len(set(texts)) == 1  # the same report, in the same order, every time


@pytest.mark.slow
def test_barrier_leftover_on_8_devices_is_always_a_leftover_report() -> None:
    # Before: sometimes "KernelFailedError: KeyError: ('hbm', 101, 6, 0)".
    mesh = simulated_mesh(8, "x")
    call = hbm_call(over_signalled_barrier, dma(), collective_id=0)
    for _ in range(10):
        with pytest.raises(LeftoverSemaphoreError) as info:
            simulate(call, example((64, 128)), mesh=mesh)
        assert [(x.device_id, x.kind, x.count) for x in info.value.leftovers] == [
            (d, "BARRIER", 1) for d in range(8)
        ]


def test_leftover_on_4_devices_is_complete() -> None:
    call = hbm_call(_signal_the_next_device, [*dma(), pltpu.SemaphoreType.REGULAR(())])
    with pytest.raises(LeftoverSemaphoreError) as info:
        simulate(call, example((32, 128)), mesh=simulated_mesh(4, "x"))
    assert [x.device_id for x in info.value.leftovers] == [0, 1, 2, 3]
    # Each names who signalled it, from which line of the user's kernel.
    signal_line = marker_line(__file__, "# never waited")
    for item in info.value.leftovers:
        sender = f"device {(item.device_id - 1) % 4} (x={(item.device_id - 1) % 4})"
        assert f"signalled by {sender} at {__file__}:{signal_line} " in item.hint, item.hint
