"""A copy of a region onto itself under verify (``emit_pipeline`` with ``no_pipelining``):
it does not race with itself, but a store while it is in flight does.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, verify

F32 = jnp.float32
HERE = r"test_self_copies\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


# ------------------------------------------------ a copy of a region onto itself


def _self_copy(*, store_in_flight: bool) -> Any:
    """Copy rows 0:8 of a VMEM buffer onto themselves (what emit_pipeline with
    ``no_pipelining`` does with a VMEM operand that is its own window)."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        pltpu.sync_copy(x_ref, buf)
        copy = pltpu.make_async_copy(buf.at[0:8], buf.at[0:8], sem)
        copy.start()
        if store_in_flight:
            buf[0:8, :] = jnp.zeros((8, 128), F32)  # the copy may still read these rows
        copy.wait()
        pltpu.sync_copy(buf, o_ref)

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def test_a_copy_of_a_region_onto_itself_does_not_race_with_itself() -> None:
    wide = jax.ShapeDtypeStruct((16, 128), F32)
    assert verify(_self_copy(store_in_flight=False), wide).dmas == 3


def test_a_store_while_a_self_copy_is_in_flight_is_caught() -> None:
    wide = jax.ShapeDtypeStruct((16, 128), F32)
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_self_copy(store_in_flight=True), wide)
