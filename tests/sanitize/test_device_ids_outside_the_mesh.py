"""The sanitizer checks the device id of every remote copy and signal against the mesh: a
ring neighbour computed without ``% size`` is reported with the user's line, the id, the
mesh size and the modulo (as verify and simulate say it), and the operation is skipped,
instead of jax's interpreter failing with a bare KeyError or IndexError."""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import DeviceOutsideMeshError, KernelFailedError
from tests.sanitize.helpers import example, hbm_call, on_mesh
from tests.support.simulation import line_of

RING = 4


def last_device_copies_past_the_end(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    me = lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=me + 1)

    @pl.when(me == RING - 1)
    def _() -> None:
        copy.start()
        copy.wait_send()

    @pl.when(me == 0)
    def _() -> None:
        copy.wait_recv()


def first_device_signals_before_the_start(x_ref: Any, o_ref: Any, flag: Any) -> None:
    me = lax.axis_index("x")

    @pl.when(me == 0)
    def _() -> None:
        pl.semaphore_signal(flag, 1, device_id={"x": me - 1})


def _run(kernel: Any, scratch: list[Any]) -> None:
    program = on_mesh(lambda x: hbm_call(kernel, scratch)(x), RING)
    with sd.sanitizer_errors():
        jax.block_until_ready(program(example((RING * 8, 128))))


def test_a_copy_to_the_device_past_the_end_names_the_id_the_mesh_and_the_modulo() -> None:
    scratch = [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]
    with pytest.raises(DeviceOutsideMeshError) as caught:
        _run(last_device_copies_past_the_end, scratch)
    text = str(caught.value)
    assert line_of(last_device_copies_past_the_end, "copy.start()") in text, text
    assert "remote copy start" in text and "on device 3 (x=3)" in text
    assert "device id x=4, outside the mesh (x has 4 devices)" in text
    assert "(lax.axis_index('x') + 1) % 4" in text
    assert "sanitizer skipped it" in text
    assert isinstance(caught.value, KernelFailedError)
    assert isinstance(caught.value, sd.DeviceIdError)


def test_a_signal_to_device_minus_one_by_axis_name_is_reported_and_skipped() -> None:
    with pytest.raises(DeviceOutsideMeshError) as caught:
        _run(first_device_signals_before_the_start, [pltpu.SemaphoreType.REGULAR])
    text = str(caught.value)
    assert line_of(first_device_signals_before_the_start, "pl.semaphore_signal") in text, text
    assert "remote semaphore signal" in text and "on device 0 (x=0)" in text
    assert "device id x=-1, outside the mesh (x has 4 devices)" in text
