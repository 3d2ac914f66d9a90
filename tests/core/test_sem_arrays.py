"""Semaphore array declarations (``safedma/_sem_arrays.py``): ``dma_semaphores`` and
``regular_semaphores`` take an int or a tuple and make jax's own scratch types.

Copies and signals on N-D arrays, their raw twins and the indices caught at trace time
are in tests/corpus/semaphore_arrays.py. Here also 4-D arrays sliced step by step, against
their raw twin and with their indices checked.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import assert_same_mosaic


def test_declarations_take_an_int_or_a_tuple() -> None:
    assert sd.dma_semaphores(3) == pltpu.SemaphoreType.DMA((3,))
    assert sd.dma_semaphores((2, 3)) == pltpu.SemaphoreType.DMA((2, 3))
    assert sd.regular_semaphores((2, 2)) == pltpu.SemaphoreType.REGULAR((2, 2))
    assert sd.dma_semaphores((2, 3, 4, 5)) == pltpu.SemaphoreType.DMA(
        (2, 3, 4, 5)
    )  # rank 4: SemArray4
    bad_shapes: list[Any] = [0, (2, 0), (), (1, 2, 3, 4, 5), 2.0, True]
    for bad in bad_shapes:
        with pytest.raises(ValueError, match="positive int"):
            sd.dma_semaphores(bad)


ANY = pl.BlockSpec(memory_space=pl.ANY)


# --- 4-D semaphore arrays, sliced step by step ------------------------------------------


def _rank4(x_hbm: sd.DataRef, o_hbm: sd.DataRef, sems: sd.SemArray4) -> None:
    step = sems.at[1, pl.program_id(0)]  # a 2-D slice, then one semaphore of it
    sd.LocalCopy(x_hbm.at[0], o_hbm.at[0], step.at[2, 3]).start().wait()
    sd.LocalCopy(x_hbm.at[1], o_hbm.at[1], sems.at[0, 0, 1, 4]).start().wait()


def _rank4_raw(x_hbm: Any, o_hbm: Any, sems: Any) -> None:
    step = sems.at[1, pl.program_id(0)]
    for copy in (
        pltpu.make_async_copy(x_hbm.at[0], o_hbm.at[0], step.at[2, 3]),
        pltpu.make_async_copy(x_hbm.at[1], o_hbm.at[1], sems.at[0, 0, 1, 4]),
    ):
        copy.start()
        copy.wait()


def _rank4_call(body: Any, entry: Any) -> Any:
    return entry(
        body,
        jax.ShapeDtypeStruct((2, 8, 128), jnp.float32),
        grid=(2,),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[sd.dma_semaphores((2, 2, 3, 5))],
    )


def test_rank4_semaphore_arrays_match_raw() -> None:
    x = jax.ShapeDtypeStruct((2, 8, 128), jnp.float32)
    assert_same_mosaic(
        _rank4_call(_rank4, sd.pallas_call), _rank4_call(_rank4_raw, pl.pallas_call), x
    )


def test_rank4_semaphore_index_checks() -> None:
    x = jax.ShapeDtypeStruct((2, 8, 128), jnp.float32)

    def outside(x_hbm: sd.DataRef, o_hbm: sd.DataRef, sems: sd.SemArray4) -> None:
        sd.LocalCopy(x_hbm, o_hbm, sems.at[0, 0, 1, 5]).start().wait()

    def row(x_hbm: sd.DataRef, o_hbm: sd.DataRef, sems: sd.SemArray4) -> None:
        sd.LocalCopy(x_hbm, o_hbm, sems.at[0, 0, 1]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    with pytest.raises(sd.SemaphoreIndexError, match=r"index 5 in dimension 3"):
        jax.eval_shape(_rank4_call(outside, sd.pallas_call), x)
    with pytest.raises(sd.SemaphoreShapeError, match=r"sems\.at\[i, j, k, i3\]"):
        jax.eval_shape(_rank4_call(row, sd.pallas_call), x)
