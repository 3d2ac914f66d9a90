"""Windows through reshaped refs under verify: a merging reshape keeps windows exact, so
two copies into disjoint column halves of a reshaped cache do not race (MLA's kv-cache
update) and two into the same columns do.

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

from safedma.testing import RaceDetectedError, abstract_mesh, verify
from safedma.testing._verify.model.regions import Buffer, resolve
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_reshaped_windows\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


ANY = pl.BlockSpec(memory_space=pl.ANY)


# --------------------------------------------- reshaped cache, column halves


def _halves(second_cols: slice) -> Any:
    """Write rows of a (pages, rows, 2, 256) cache, merged to (pages * rows, 2, 256), in
    two column halves by two copies in flight at once."""

    def kernel(
        row_ref: Any,
        a_ref: Any,
        b_ref: Any,
        cache_ref: Any,
        out_ref: Any,
        va: Any,
        vb: Any,
        sems: Any,
    ) -> None:
        del cache_ref
        flat = out_ref.reshape(out_ref.shape[0] * out_ref.shape[1], *out_ref.shape[2:])
        pltpu.sync_copy(a_ref, va)
        pltpu.sync_copy(b_ref, vb)
        row = row_ref[0]
        first = pltpu.make_async_copy(va, flat.at[pl.ds(row, 4), :, :128], sems.at[0])
        second = pltpu.make_async_copy(vb, flat.at[pl.ds(row, 4), :, second_cols], sems.at[1])
        first.start()
        second.start()
        first.wait()
        second.wait()

    def fn(row: Any, a: Any, b: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
            scratch=[
                pltpu.VMEM((4, 2, 128), F32),
                pltpu.VMEM((4, 2, 128), F32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
            inputs=3,
            input_output_aliases={3: 0},
        )(row, a, b, cache)

    return fn


_HALF_ARGS = (np.array([12], np.int32), _s(4, 2, 128), _s(4, 2, 128), _s(4, 8, 2, 256))


def test_two_copies_into_disjoint_columns_of_a_reshaped_cache_are_clean() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        report = verify(_halves(slice(128, None)), *_HALF_ARGS)
    assert report.dmas == 4


def test_two_copies_into_the_same_columns_of_a_reshaped_cache_race() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        with pytest.raises(RaceDetectedError, match=HERE):
            verify(_halves(slice(0, 128)), *_HALF_ARGS)


def _buf(*shape: int) -> Buffer:
    return Buffer(0, 0, "b", shape, 4, "ANY")


def test_a_merging_reshape_keeps_windows_exact() -> None:
    view = resolve(
        _buf(4, 8, 2, 256),
        [
            ("reshape", (32, 2, 256)),
            ("index", (("slice", 12, 4, 1), ("slice", 0, 2, 1), ("slice", 128, 128, 1))),
        ],
    )
    assert view.box == ((1, 2), (4, 8), (0, 2), (128, 256))


def test_a_window_across_merged_rows_is_bounded_and_a_split_is_exact() -> None:
    across = resolve(
        _buf(4, 8, 256),
        [("reshape", (32, 256)), ("index", (("slice", 6, 4, 1), ("slice", 0, 128, 1)))],
    )
    assert across.box[0] == (0, 2) and across.box[2][0] == 0  # conservative, never smaller
    split = resolve(
        _buf(32, 256),
        [
            ("reshape", (4, 8, 2, 128)),
            (
                "index",
                (("int", 2, 1, 1), ("slice", 0, 8, 1), ("slice", 0, 2, 1), ("slice", 0, 128, 1)),
            ),
        ],
    )
    assert split.box == ((16, 24), (0, 256))
    half = resolve(
        _buf(32, 256),
        [
            ("reshape", (32, 2, 128)),
            ("index", (("slice", 0, 32, 1), ("int", 1, 1, 1), ("slice", 0, 128, 1))),
        ],
    )
    assert half.box == ((0, 32), (128, 256))
