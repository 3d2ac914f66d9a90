"""Zero sizes under verify: a grid with a zero-size axis runs no step, and a zero-size copy
parked at index -1 for a padding page-table entry is in range (a full-size one is not).

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

from safedma.testing import OutOfBoundsDmaError, verify
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_zero_size_copies\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# --------------------------------------------------------------- zero-size grid


def _per_step_copy(steps: int) -> Any:
    def kernel(x_ref: Any, o_in_ref: Any, o_ref: Any, sem: Any) -> None:
        del o_in_ref
        i = pl.program_id(0)
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(i * 8, 8)], o_ref.at[pl.ds(i * 8, 8)], sem)
        copy.start()
        copy.wait()

    def fn(x: Any, o: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            out_shape=jax.ShapeDtypeStruct(o.shape, o.dtype),
            input_output_aliases={1: 0},
        )(x, o)

    return fn


def test_a_grid_with_a_zero_size_axis_runs_no_step() -> None:
    report = verify(_per_step_copy(0), _s(16, 128), _s(16, 128))
    assert report.dmas == 0


def test_a_grid_with_steps_still_checks_them() -> None:
    assert verify(_per_step_copy(2), _s(16, 128), _s(16, 128)).dmas == 2
    with pytest.raises(OutOfBoundsDmaError, match=HERE):
        verify(_per_step_copy(3), _s(16, 128), _s(16, 128))


# ----------------------------------------------------- zero-size padding copies


def _paged_fetch(sizes_from_table: bool) -> Any:
    """Fetch pages listed in a table; padding entries (-1) are copied with size 0."""

    def kernel(
        pages_ref: Any, lens_ref: Any, cache_ref: Any, o_ref: Any, buf: Any, sem: Any
    ) -> None:
        copies = []
        for i in range(3):
            n = lens_ref[i] if sizes_from_table else 8
            c = pltpu.make_async_copy(
                cache_ref.at[pl.ds(pages_ref[i] * 8, n)], buf.at[pl.ds(i * 8, n)], sem
            )
            c.start()
            copies.append(c)
        for c in copies:
            c.wait()
        o_ref[...] = buf[...]

    def fn(pages: Any, lens: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((24, 128), F32),
            scratch=[pltpu.VMEM((24, 128), F32), pltpu.SemaphoreType.DMA],
            prefetch=2,
            out_specs=pl.BlockSpec((24, 128), lambda *_: (0, 0)),
        )(pages, lens, cache)

    return fn


_PAGES = np.array([3, 0, -1], np.int32)
_LENS = np.array([8, 5, 0], np.int32)


def test_a_zero_size_copy_of_a_padding_entry_is_in_range() -> None:
    assert verify(_paged_fetch(True), _PAGES, _LENS, _s(64, 128)).dmas == 3


def test_a_padding_entry_copied_with_its_full_size_is_out_of_range() -> None:
    with pytest.raises(OutOfBoundsDmaError, match=HERE):
        verify(_paged_fetch(False), _PAGES, _LENS, _s(64, 128))
