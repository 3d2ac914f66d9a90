"""False alarms of session 9's verify rules on correct programs (session 9b), each with
a seeded twin that is still caught.

* Placement primitives (``lax.optimization_barrier``, ``with_sharding_constraint``,
  ``device_put``) outside the kernels: docs/verify.md says a DMA future's destination
  passes through them to its done kernel, but the verifier evaluated them like any
  XLA operation, so the array lost its buffer and the semaphore its identity: a
  done kernel behind a barrier waited a fresh semaphore (a false deadlock), and a
  kernel output whose padding rows the program slices off after a barrier counted
  as read in full (a false R6). Each result is now its operand, for the walk and for
  what the program reads of a kernel output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, UnwrittenReadError, verify
from tests.support.jax_programs import copy_done, copy_start
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((16, 128), F32)
CPU = jax.devices("cpu")[0]

PLACEMENTS: dict[str, Callable[[Any], Any]] = {
    "optimization_barrier": lax.optimization_barrier,
    "sharding_constraint": lambda t: jax.tree.map(
        lambda a: lax.with_sharding_constraint(a, jax.sharding.SingleDeviceSharding(CPU)), t
    ),
    "device_put": lambda t: jax.tree.map(jax.device_put, t),
}


def _future_behind(place: Callable[[Any], Any], *, read: bool) -> Callable[[Any], Any]:
    """A DMA future (start kernel, done kernel: jax's async-copy pattern) whose
    source and future pass through a placement primitive between the two kernels."""

    def fn(x: jax.Array) -> Any:
        x, fut = copy_start(x)
        x, fut = place((x, fut))
        if read:
            early = jnp.sum(fut[0])  # the early read
            return copy_done(x, fut), early
        return copy_done(x, fut)

    return fn


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_a_future_through_a_placement_primitive_verifies_clean(name: str) -> None:
    report = verify(_future_behind(PLACEMENTS[name], read=False), X)
    assert len(report.kernels) == 2 and report.dmas == 1


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_reading_the_future_after_the_placement_is_still_a_race(name: str) -> None:
    with pytest.raises(RaceDetectedError) as caught:
        verify(_future_behind(PLACEMENTS[name], read=True), X)
    text = str(caught.value)
    assert f"{__file__}:{marker_line(__file__, '# the early read')}" in text, text
    assert "reduce_sum" in text and "DMA future" in text, text


def _first_half_kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref.at[0:8], o_ref.at[0:8], sem)  # rows 0:8 only
    copy.start()
    copy.wait()


def _first_half(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        _first_half_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_padding_dropped_after_a_placement_primitive_is_not_read(name: str) -> None:
    place = PLACEMENTS[name]
    assert verify(lambda x: place(_first_half(x))[:8] * 2, X).dmas == 1


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_padding_read_after_a_placement_primitive_is_r6(name: str) -> None:
    place = PLACEMENTS[name]
    with pytest.raises(UnwrittenReadError) as caught:
        verify(lambda x: place(_first_half(x))[4:12] * 2, X)
    text = str(caught.value)
    assert "R6" in text and "nothing wrote o_ref[8:12, 0:128]" in text, text
