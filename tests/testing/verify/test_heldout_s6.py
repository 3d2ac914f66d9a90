"""Patterns of kernels from other authors that verify had never seen (session 6).

docs/verify.md, "Kernels from other authors (session 6)", lists the kernels and
verdicts. Each kernel here is written for this file in raw pltpu and reproduces
one construct that made verify raise a false alarm or an unclear message; each
correct one must verify clean and each seeded mistake must still be caught,
naming this file's line.

* an output block whose index map reads a scalar-prefetch table (a ragged kernel
  maps each logical tile to its physical output block through it) and that the
  kernel writes only at the last step on that block: Pallas copies the block out
  only when the index map's answer changes, which verify must compute with the
  table, not treat as "changes every step"; and an output block the kernel does not
  write at its step is garbage even if it wrote the previous block;
* several kernels with one name (every ``emit_pipeline`` body is ``wrapped``): the
  report counts and names each by its line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify

F32 = jnp.float32
HERE = r"test_heldout_s6\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------------- an output block picked through a prefetch table


def _tiled_sum(write_last: bool) -> Any:
    """Sum the kv blocks of each logical tile into the output tile the table names.

    Grid (logical tile, kv block); ``tile_of[t]`` is the physical output tile of
    logical tile t (two logical tiles share tile 0). The output is written once,
    at the last kv block of the last logical tile on it, from a VMEM accumulator:
    the ragged paged attention layout (torch_xla, megablox metadata).
    """

    def kernel(tile_of: Any, x_ref: Any, o_ref: Any, acc: Any) -> None:
        t, k = pl.program_id(0), pl.program_id(1)
        nt, nk = pl.num_programs(0), pl.num_programs(1)

        @pl.when(k == 0)
        def _() -> None:
            acc[...] = jnp.zeros_like(acc)

        acc[...] += x_ref[...]
        nxt = jnp.minimum(t + 1, nt - 1)
        leaving = jnp.logical_or(t == nt - 1, tile_of[t] != tile_of[nxt])

        @pl.when(jnp.logical_and(k == nk - 1, leaving if write_last else t == 0))
        def _() -> None:
            o_ref[...] = acc[...]

    def fn(tile_of: Any, x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(3, 2),
                in_specs=[pl.BlockSpec((8, 128), lambda t, k, tile_of: (t, k))],
                out_specs=pl.BlockSpec((8, 128), lambda t, k, tile_of: (tile_of[t], 0)),
                scratch_shapes=[pltpu.VMEM((8, 128), F32)],
            ),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        )(tile_of, x)

    return fn


TILE_OF = np.array([0, 0, 1], np.int32)


def test_output_block_from_a_prefetch_table_written_at_its_last_step_is_clean() -> None:
    assert verify(_tiled_sum(write_last=True), TILE_OF, _s(24, 256)) is not None


def test_output_block_from_a_prefetch_table_never_written_is_caught() -> None:
    # tile 1 (logical tile 2) is never written: its copy-out is garbage
    with pytest.raises(UnwrittenReadError, match=r"o_ref\[8:16, 0:128\]|o_ref\[0:8, 0:128\]"):
        verify(_tiled_sum(write_last=False), TILE_OF, _s(24, 256))


# ------------------------------------------------ kernels that share one name


def _double(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2


def test_kernels_with_one_name_are_each_listed_by_line() -> None:
    def fn(x: Any) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        y = pl.pallas_call(_double, out_shape=out)(x)
        return pl.pallas_call(_double, out_shape=out)(y)

    report = verify(fn, _s(8, 128))
    assert len(report.kernels) == 2
    assert all(k.startswith("_double (") and "test_heldout_s6.py:" in k for k in report.kernels)


def test_one_kernel_called_twice_from_one_line_is_listed_once() -> None:
    def fn(x: Any) -> Any:
        for _ in range(2):
            x = pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return x

    assert verify(fn, _s(8, 128)).kernels == ("_double",)
