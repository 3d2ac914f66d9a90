"""Outputs aliased to inputs under verify: an aliased output is the input's memory, so the
rows nothing wrote keep the input's values and copies through either name are checked
against each other.

* an output aliased to an input under scalar prefetch (``input_output_aliases`` counts
  the prefetch operands: a kv-cache update kernel);
* a blocked output aliased to an input passed in HBM: the pipeline's copy-outs and the
  kernel's own copies through the input race if unordered.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, SimulationError, UnwrittenReadError, verify
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_aliases\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# --------------------------------------------------------------- aliased output


def _cache_update(alias: bool, wait: bool) -> Any:
    """Copy ``new`` into rows ``start[0]:`` of the cache, in place when aliased."""

    def kernel(start_ref: Any, new_ref: Any, cache_ref: Any, out_ref: Any, sem: Any) -> None:
        del cache_ref
        copy = pltpu.make_async_copy(
            new_ref, out_ref.at[pl.ds(start_ref[0], new_ref.shape[0])], sem
        )
        copy.start()
        if wait:
            copy.wait()

    def fn(start: Any, new: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
            scratch=[pltpu.SemaphoreType.DMA],
            inputs=2,
            # operand 2 counts the scalar-prefetch operand: the cache
            input_output_aliases={2: 0} if alias else {},
        )(start, new, cache)

    return fn


def test_an_output_aliased_under_scalar_prefetch_keeps_the_unwritten_rows() -> None:
    report = verify(_cache_update(True, True), np.array([8], np.int32), _s(8, 128), _s(32, 128))
    assert report.dmas == 1


def test_without_the_alias_the_rows_nothing_wrote_are_reported() -> None:
    with pytest.raises(UnwrittenReadError):
        verify(_cache_update(False, True), np.array([8], np.int32), _s(8, 128), _s(32, 128))


def test_the_aliased_update_without_its_wait_is_caught() -> None:
    with pytest.raises(SimulationError, match=HERE):
        verify(_cache_update(True, False), np.array([8], np.int32), _s(8, 128), _s(32, 128))


ANY = pl.BlockSpec(memory_space=pl.ANY)


# ------------------- a blocked output aliased to an input the kernel addresses in HBM


def _blocked_alias(wait_in_step: bool) -> Any:
    """Output blocks of 8 rows over a grid of 2, aliased to an input passed in HBM (ANY).
    At step 0 the kernel also copies rows into block 0 of that memory through the input
    ref, waiting in the step (then the step's copy-out lands after it) or only at step 1
    (then the copy-out of block 0 and the copy write the same rows unordered)."""

    def kernel(src: Any, mem: Any, o_blk: Any, sem: Any) -> None:
        step = pl.program_id(0)
        o_blk[...] = jnp.zeros_like(o_blk)
        copy = pltpu.make_async_copy(src.at[pl.ds(0, 8)], mem.at[pl.ds(0, 8)], sem)

        @pl.when(step == 0)
        def _() -> None:
            copy.start()
            if wait_in_step:
                copy.wait()

        if not wait_in_step:
            pl.when(step == 1)(copy.wait)

    def fn(src: jax.Array, mem: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=_s(16, 128),
            grid=(2,),
            in_specs=[ANY, ANY],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={1: 0},
        )(src, mem)

    return fn


def test_a_blocked_output_aliased_to_an_hbm_input_shares_its_memory() -> None:
    assert verify(_blocked_alias(True), _s(16, 128), _s(16, 128)).dmas == 1
    with pytest.raises(RaceDetectedError, match=r"mem\[0:8, 0:128\].*copies an output block"):
        verify(_blocked_alias(False), _s(16, 128), _s(16, 128))
