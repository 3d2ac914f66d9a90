"""Pytree arguments under verify (a tuple of arrays with a None, as ``jax.jit`` takes
them): verified by their leaves.

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

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, verify

F32 = jnp.float32
HERE = r"test_pytree_arguments\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------------------------------ pytree arguments


def _pair_copy(*, wait: bool) -> Any:
    """fn takes a pytree (a tuple of two arrays and a None), as jax.jit allows."""

    def kernel(a_ref: Any, b_ref: Any, o_ref: Any, sem: Any) -> None:
        del b_ref
        copy = pltpu.make_async_copy(a_ref, o_ref, sem)
        copy.start()
        if wait:
            copy.wait()

    def fn(pair: Any) -> Any:
        a, b, nothing = pair
        assert nothing is None
        return pl.pallas_call(
            kernel,
            in_specs=[ANY, ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(a, b)

    return fn


def test_pytree_arguments_are_verified_by_their_leaves() -> None:
    assert verify(_pair_copy(wait=True), (X, jnp.zeros((8, 128)), None)).dmas == 1


def test_pytree_arguments_with_a_dropped_wait_are_caught() -> None:
    with pytest.raises((LeftoverSemaphoreError, RaceDetectedError), match=HERE):
        verify(_pair_copy(wait=False), (X, jnp.zeros((8, 128)), None))
