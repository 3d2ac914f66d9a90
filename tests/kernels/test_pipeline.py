"""safedma.kernels.pipeline: exact results under strict simulation, twin identity, TPU builds.

The compute is exact (x * 2 + 1 on small integers, exact in float32 and
bfloat16), so every output must equal the jnp reference bit for bit; any
chunk fetched from the wrong rows, written to the wrong rows, or read from a
buffer still in flight shows up as a mismatch or a race.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from tests.support.twins import pipeline as twin
from safedma.kernels.pipeline import ChunkFn, pipeline
from tests.support.kernel_params import BF16, EACH_DTYPE, F32, I32, SPLIT_MESHES, TILE_ROWS
from tests.support.kernel_params import TOPOLOGIES, DType, assert_built, split_devices
from safedma.testing import (
    TpuCompileError,
    assert_same_mosaic,
    compile_for_tpu,
    simulate,
    simulated_mesh,
)


def affine(chunk: jax.Array) -> jax.Array:
    return chunk * 2 + 1


def minus_column_max(chunk: jax.Array) -> jax.Array:
    """Blockwise: the result depends on the whole chunk, so chunk boundaries matter."""
    return chunk - jnp.max(chunk, axis=0, keepdims=True)


def example(shape: tuple[int, int], dtype: DType) -> jax.Array:
    """Small distinct-ish integers: x * 2 + 1 stays exact in bfloat16 (|x| <= 60)."""
    values = (np.arange(shape[0] * shape[1]) * 7) % 121 - 60
    return jnp.asarray(values.reshape(shape), dtype=dtype)


def reference(x: jax.Array, fn: ChunkFn, chunk_rows: int) -> np.ndarray:
    chunks = [fn(x[i : i + chunk_rows]) for i in range(0, x.shape[0], chunk_rows)]
    return np.asarray(jnp.concatenate(chunks))


def run(fn: ChunkFn, chunk_rows: int) -> Callable[[jax.Array], jax.Array]:
    def per_device(x: jax.Array) -> jax.Array:
        return pipeline(x, fn, chunk_rows=chunk_rows)

    return per_device


def assert_exact(out: jax.Array, expected: np.ndarray) -> None:
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(out), expected)


# ------------------------------------------------------------ one device

CASES = [  # (rows, cols), chunk_rows, dtype: chunks = rows // chunk_rows
    ((8, 128), 8, F32),  # a single chunk
    ((24, 256), 8, F32),  # 3 chunks: odd, ends in slot 0
    ((64, 128), 16, F32),  # 4 chunks
    ((16, 128), 16, BF16),  # a single chunk
    ((80, 256), 16, BF16),  # 5 chunks
    ((64, 384), 32, BF16),  # 2 chunks: both write-backs drained after the loop
    ((56, 128), 8, I32),  # 7 chunks of int32
]


@pytest.mark.parametrize(
    "shape,chunk_rows,dtype",
    CASES,
    ids=[f"{s[0]}x{s[1]}-c{c}-{jnp.dtype(d).name}" for s, c, d in CASES],
)
def test_matches_reference_on_one_device(
    shape: tuple[int, int], chunk_rows: int, dtype: DType
) -> None:
    x = example(shape, dtype)
    out = simulate(run(affine, chunk_rows), x)
    assert_exact(out, reference(x, affine, chunk_rows))


def test_blockwise_fn_sees_exactly_one_chunk() -> None:
    x = example((40, 128), F32)
    out = simulate(run(minus_column_max, 8), x)
    assert_exact(out, reference(x, minus_column_max, 8))
    # The whole-array column max would give a different answer: chunking is real.
    assert not np.array_equal(np.asarray(out), np.asarray(minus_column_max(x)))


def test_interpret_argument_runs_without_simulate() -> None:
    x = example((24, 128), F32)
    out = pipeline(x, affine, chunk_rows=8, interpret=pltpu.InterpretParams())
    assert_exact(out, reference(x, affine, 8))


# ------------------------------------------------------------ meshes


@EACH_DTYPE
@SPLIT_MESHES
def test_each_device_pipelines_its_shard(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], split: str | tuple[str, ...], dtype: DType
) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    devices = split_devices(mesh, split)
    chunk_rows = TILE_ROWS[dtype]
    x = example((devices * 3 * chunk_rows, 128), dtype)  # 3 chunks per device
    out = simulate(run(affine, chunk_rows), x, mesh=mesh, in_specs=P(split), out_specs=P(split))
    assert_exact(out, reference(x, affine, chunk_rows))


# ------------------------------------------------------------ properties


@seed(20261202)
@settings(max_examples=8, deadline=None, database=None)
@given(
    dtype=st.sampled_from([F32, BF16]),
    tiles_per_chunk=st.integers(1, 3),
    chunks=st.integers(1, 5),
    lanes=st.integers(1, 3),
    blockwise=st.booleans(),
)
def test_any_shape_chunking_and_dtype(
    dtype: DType, tiles_per_chunk: int, chunks: int, lanes: int, blockwise: bool
) -> None:
    chunk_rows = TILE_ROWS[dtype] * tiles_per_chunk
    x = example((chunk_rows * chunks, 128 * lanes), dtype)
    fn = minus_column_max if blockwise else affine
    out = simulate(run(fn, chunk_rows), x)
    assert_exact(out, reference(x, fn, chunk_rows))


# ------------------------------------------------------------ preconditions


def _bad_shape(chunk: jax.Array) -> jax.Array:
    return chunk[:8]


def _bad_dtype(chunk: jax.Array) -> jax.Array:
    return chunk.astype(jnp.int32)


@pytest.mark.parametrize(
    "x,chunk_rows,fn,message",
    [
        (jnp.zeros((2, 8, 128), F32), 8, affine, "2-D"),
        (jnp.zeros((16, 128), jnp.float16), 16, affine, "supports dtypes"),
        (jnp.zeros((32, 128), jnp.int8), 32, affine, "supports dtypes"),
        (jnp.zeros((32, 128), F32), 0, affine, "chunk_rows must be a positive Python int"),
        (jnp.zeros((32, 128), F32), True, affine, "chunk_rows must be a positive Python int"),
        (jnp.zeros((32, 128), F32), 4, affine, "multiple of 8"),
        (jnp.zeros((32, 128), BF16), 8, affine, "multiple of 16"),
        (jnp.zeros((24, 128), F32), 16, affine, "divisible by chunk_rows=16"),
        (jnp.zeros((16, 200), F32), 8, affine, "multiple of 128"),
        (jnp.zeros((32, 128), F32), 16, _bad_shape, "same shape and dtype"),
        (jnp.zeros((32, 128), F32), 16, _bad_dtype, "same shape and dtype"),
    ],
    ids=[
        "3d",
        "float16",
        "int8",
        "zero-chunk",
        "bool-chunk",
        "f32-tile",
        "bf16-tile",
        "rows",
        "cols",
        "fn-shape",
        "fn-dtype",
    ],
)
def test_preconditions_are_checked_up_front(
    x: jax.Array, chunk_rows: int, fn: ChunkFn, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pipeline(x, fn, chunk_rows=chunk_rows)


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize(
    "rows,chunk_rows,dtype,fn",
    [
        (8, 8, F32, affine),
        (24, 8, F32, affine),
        (64, 16, BF16, affine),
        (32, 8, F32, minus_column_max),
    ],
    ids=["f32-1chunk", "f32-3chunks", "bf16-4chunks", "f32-blockwise"],
)
def test_same_mosaic_as_the_pltpu_twin(
    rows: int, chunk_rows: int, dtype: DType, fn: ChunkFn
) -> None:
    spec = jax.ShapeDtypeStruct((rows, 256), dtype)
    assert_same_mosaic(
        lambda x: pipeline(x, fn, chunk_rows=chunk_rows),
        lambda x: twin.pipeline(x, fn, chunk_rows=chunk_rows),
        spec,
    )


# ------------------------------------------------------------ TPU builds


def _global(devices: int, dtype: DType, chunks: int = 5) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((devices * chunks * TILE_ROWS[dtype] * 2, 512), dtype)


def test_compiles_for_a_16_chip_v6e() -> None:
    report = compile_for_tpu(run(affine, 16), _global(16, F32), topology="v6e:4x4")
    assert_built(report, devices=16, kernels=("pipeline",))


@pytest.mark.slow
@EACH_DTYPE
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, dtype: DType) -> None:
    chunk_rows = 2 * TILE_ROWS[dtype]
    report = compile_for_tpu(run(affine, chunk_rows), _global(4, dtype), topology=topology)
    assert report.topology == topology
    assert report.generated_code_size_in_bytes > 0


@pytest.mark.slow
def test_blockwise_fn_compiles() -> None:
    report = compile_for_tpu(run(minus_column_max, 16), _global(4, F32), topology="v6e:2x2")
    assert report.generated_code_size_in_bytes > 0


@pytest.mark.slow  # about 4.5 s of compiling on the 2-core CI machine
def test_chunks_too_big_for_vmem_fail_to_compile() -> None:
    """Four 32 MiB chunk buffers exceed any chip's scoped VMEM: the compiler says so."""
    x = jax.ShapeDtypeStruct((4 * 8192, 1024), F32)
    with pytest.raises(TpuCompileError, match="vmem"):
        compile_for_tpu(run(affine, 8192), x, topology="v6e:2x2")
