"""A per-tile loop over a scalar-prefetch table sized by the batch, not the tile.

Found in tokamax's fused conv1d + gated-delta-rule kernel (its batched decode
path): the table of copy bases and sizes holds one entry per sequence, the
kernel reads ``tile`` entries per grid step, so a batch that is not a multiple
of the tile reads past the table's end and copies with whatever SMEM holds
there as bases and sizes. The kernel here is ours; it reproduces the construct.
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

HERE = __file__
TILE = 4


def _gather_rows(seqs: int) -> Any:
    """Grid step ``t`` copies rows ``base[t*TILE + k]`` (``size`` of them, 0 or 1) of
    x into row ``k`` of a VMEM tile, for k in range(TILE), then waits them all."""

    def kernel(base_ref: Any, size_ref: Any, x_ref: Any, o_ref: Any, tile: Any, sem: Any) -> None:
        t = pl.program_id(0)
        total = 0
        for k in range(TILE):
            row = base_ref[t * TILE + k]  # the table has `seqs` entries
            n = size_ref[t * TILE + k]
            pltpu.make_async_copy(x_ref.at[pl.ds(row, n)], tile.at[pl.ds(k, n)], sem).start()
            total += n
        pltpu.make_async_copy(x_ref.at[pl.ds(0, total)], tile.at[pl.ds(0, total)], sem).wait()
        o_ref[...] = tile[...]

    def fn(base: jax.Array, size: jax.Array, x: jax.Array) -> jax.Array:
        tiles = pl.cdiv(seqs, TILE)
        out: jax.Array = pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                grid=(tiles,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((TILE, 128), lambda t, b, s: (t, 0)),
                scratch_shapes=[pltpu.VMEM((TILE, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
            ),
            out_shape=jax.ShapeDtypeStruct((tiles * TILE, 128), jnp.float32),
        )(base, size, x)
        return out

    return fn


def _tables(seqs: int, entries: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    base = np.zeros(entries, np.int32)
    size = np.zeros(entries, np.int32)
    base[:seqs] = np.arange(seqs)
    size[:seqs] = 1
    return base, size


X = jax.ShapeDtypeStruct((16, 128), jnp.float32)


def test_tables_padded_to_whole_tiles_are_clean() -> None:
    seqs = 6
    base, size = _tables(seqs, 8)  # two whole tiles of entries
    report = verify(_gather_rows(seqs), base, size, X)
    assert report.dmas == 8


def test_tables_one_entry_per_sequence_are_read_past_their_end() -> None:
    seqs = 6
    base, size = _tables(seqs, seqs)  # the second tile reads entries 6 and 7
    with pytest.raises(
        OutOfBoundsDmaError, match=r"index 6 is outside dimension 0 of size 6"
    ) as err:
        verify(_gather_rows(seqs), base, size, X)
    assert HERE in str(err.value), err.value
