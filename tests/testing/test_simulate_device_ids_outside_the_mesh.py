"""simulate names a device id outside the mesh (a ring neighbour computed without ``% size``)
as verify does: the user's line of the copy or signal, the id, the mesh size and the
modulo that fixes it, instead of jax's interpreter's bare KeyError or IndexError (one
past the end) or a silent signal to the last device (``-1``)."""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import (
    DeviceOutsideMeshError,
    KernelFailedError,
    simulate,
    simulated_mesh,
    verify,
)
from tests.support.simulation import example, line_of

RING = 4
HBM = pl.BlockSpec(memory_space=pl.ANY)


def last_device_copies_past_the_end(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    # The last device sends to "the next", meant to be device 0, which waits for it.
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
        pl.semaphore_signal(flag, 1, device_id=me - 1)


def _per_device(kernel: Any, scratch: list[Any]) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
        )(x)
        return out

    return per_device


def test_a_copy_to_the_device_past_the_end_names_the_id_the_mesh_and_the_modulo() -> None:
    body = _per_device(
        last_device_copies_past_the_end,
        [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
    )
    with pytest.raises(DeviceOutsideMeshError) as caught:
        simulate(body, example((RING * 8, 128)), mesh=simulated_mesh(RING, "x"))
    text = str(caught.value)
    assert line_of(last_device_copies_past_the_end, "copy.start()") in text, text
    assert "on device 3 (x=3)" in text
    assert "device id x=4, outside the mesh (x has 4 devices)" in text
    assert "(lax.axis_index('x') + 1) % 4" in text
    assert "KeyError" not in text and "IndexError" not in text
    # What catches it today keeps catching it.
    assert isinstance(caught.value, KernelFailedError)
    assert isinstance(caught.value, sd.DeviceIdError)
    assert caught.value.location is not None


def test_a_signal_to_device_minus_one_is_not_sent_to_the_last_device() -> None:
    body = _per_device(first_device_signals_before_the_start, [pltpu.SemaphoreType.REGULAR])
    with pytest.raises(DeviceOutsideMeshError) as caught:
        simulate(body, example((RING * 8, 128)), mesh=simulated_mesh(RING, "x"))
    text = str(caught.value)
    assert line_of(first_device_signals_before_the_start, "pl.semaphore_signal") in text, text
    assert "semaphore signal" in text and "on device 0 (x=0)" in text
    assert "device id x=-1, outside the mesh (x has 4 devices)" in text


def test_verify_raises_the_same_class_for_the_same_kernel() -> None:
    body = _per_device(
        last_device_copies_past_the_end,
        [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
    )
    with pytest.raises(DeviceOutsideMeshError) as caught:
        verify(body, example((RING * 8, 128)), mesh=simulated_mesh(RING, "x"))
    assert "x=4 is outside the mesh (x has 4 devices)" in str(caught.value)
