"""An output read through several slices: only the slices count as read.

A wrapper that keeps two row ranges of a kernel's output (``out[0:8]`` and
``out[16:24]``) reads neither the rows between them nor what comes after;
verify used to take the bounding box of the two reads and report the rows in
between as an unwritten read (R6). Each slice is now its own read.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _two_ranges(written: tuple[int, ...]) -> Any:
    """The kernel copies x's rows into the 8-row blocks ``written`` of a 32-row
    output; the wrapper keeps blocks 0 and 2."""

    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        for b in written:
            copy = pltpu.make_async_copy(x_ref.at[pl.ds(b * 8, 8)], o_ref.at[pl.ds(b * 8, 8)], sem)
            copy.start()
            copy.wait()

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return jnp.concatenate([out[0:8], out[16:24]])

    return fn


X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def test_rows_between_two_kept_slices_may_stay_unwritten() -> None:
    assert verify(_two_ranges((0, 2)), X).dmas == 2


def test_a_kept_slice_left_unwritten_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match=r"16:24"):
        verify(_two_ranges((0, 1)), X)
