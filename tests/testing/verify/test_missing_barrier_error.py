"""A remote write or signal that may land before its target entered the kernel is reported as
MissingBarrierError, a message that opens with what is missing; it stays a
SignalAfterExitError, which verify raised for it before."""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import MissingBarrierError, SignalAfterExitError, simulated_mesh, verify
from tests.support.simulation import example, line_of

RING = 4
HBM = pl.BlockSpec(memory_space=pl.ANY)


def ring_without_barrier(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    me = lax.axis_index("x")
    right = lax.rem(me + 1, RING)
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=right)
    copy.start()
    copy.wait_send()
    copy.wait_recv()


def ring_signal_without_barrier(x_ref: Any, o_ref: Any, flag: Any) -> None:
    me = lax.axis_index("x")
    pl.semaphore_signal(flag, 1, device_id=lax.rem(me + 1, RING))
    pl.semaphore_wait(flag, 1)


def _verify(kernel: Any, scratch: list[Any]) -> None:
    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)
        return out

    verify(per_device, example((RING * 8, 128)), mesh=simulated_mesh(RING, "x"))


def test_a_remote_copy_with_no_barrier_is_a_missing_barrier() -> None:
    scratch = [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]
    with pytest.raises(MissingBarrierError) as caught:
        _verify(ring_without_barrier, scratch)
    text = str(caught.value)
    assert text.startswith("missing barrier before a remote write (R10): "), text
    assert line_of(ring_without_barrier, "copy.start()") in text
    assert "a barrier belongs before this access" in text
    assert isinstance(caught.value, SignalAfterExitError)


def test_a_remote_signal_with_no_barrier_is_a_missing_barrier() -> None:
    with pytest.raises(MissingBarrierError) as caught:
        _verify(ring_signal_without_barrier, [pltpu.SemaphoreType.REGULAR])
    text = str(caught.value)
    assert text.startswith("missing barrier before a remote signal (R10): "), text
    assert line_of(ring_signal_without_barrier, "pl.semaphore_signal") in text
