"""safedma.kernels.gather: exact gathers under strict simulation, twin identity, TPU builds.

Pure data movement, so every output must equal ``pages[indices]`` bit for bit.
The strict simulation also proves the aggregate wait is exact: after a wait for
fewer bytes than the k copies moved, the last page may still be in flight when
the buffer is read (RaceDetectedError, before its bytes are found left on the
semaphore), and one for more never returns (UnsatisfiableWaitError).
"""

from __future__ import annotations

import functools

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

import safedma as sd
import safedma.kernels.gather as gather_module
from tests.support.twins import gather as twin
from safedma.kernels.gather import gather_pages
from tests.support.kernel_params import BF16, EACH_DTYPE, F32, I32, SPLIT_MESHES
from tests.support.kernel_params import TOPOLOGIES, DType, assert_built, split_devices
from safedma.testing import (
    KernelFailedError,
    TpuCompileError,
    RaceDetectedError,
    UnsatisfiableWaitError,
    assert_same_mosaic,
    compile_for_tpu,
    simulate,
    simulated_mesh,
)


def example_pages(num_pages: int, page_rows: int, cols: int, dtype: DType) -> jax.Array:
    """Page p holds p * 8 + (a pattern in 0..6): pages differ, and all values are exact in bfloat16."""
    pattern = np.arange(page_rows * cols).reshape(page_rows, cols) % 7
    pages = np.arange(num_pages)[:, None, None] * 8 + pattern
    return jnp.asarray(pages, dtype=dtype)


def reference(pages: jax.Array, indices: jax.Array) -> np.ndarray:
    gathered: np.ndarray = np.asarray(pages)[np.asarray(indices)]
    return gathered


def assert_exact(out: jax.Array, expected: np.ndarray) -> None:
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(out), expected)


# ------------------------------------------------------------ one device

CASES = [  # pages (num_pages, page_rows, cols), dtype, indices
    ((6, 8, 128), F32, [5, 0, 3, 3, 1, 2, 4, 0, 5]),  # k > num_pages, repeats, any order
    ((6, 8, 128), F32, [4]),  # a single page
    ((4, 16, 256), BF16, [3, 1, 2]),
    ((3, 8, 384), I32, [2, 2, 0, 1]),
    ((16, 32, 128), BF16, list(range(15, -1, -2))),
]


@pytest.mark.parametrize(
    "shape,dtype,indices", CASES, ids=["f32-repeats", "f32-one", "bf16", "int32", "bf16-strided"]
)
def test_matches_reference_on_one_device(
    shape: tuple[int, int, int], dtype: DType, indices: list[int]
) -> None:
    pages = example_pages(*shape, dtype)
    idx = jnp.asarray(indices, jnp.int32)
    out = simulate(gather_pages, pages, idx)
    assert out.shape == (len(indices), *shape[1:])
    assert_exact(out, reference(pages, idx))


def test_interpret_argument_runs_without_simulate() -> None:
    from jax.experimental.pallas import tpu as pltpu

    pages = example_pages(5, 8, 128, F32)
    idx = jnp.asarray([4, 1, 1], jnp.int32)
    out = gather_pages(pages, idx, interpret=pltpu.InterpretParams())
    assert_exact(out, reference(pages, idx))


def test_out_of_range_traced_index_fails_in_simulation() -> None:
    """As documented: traced indices are not checked; interpret mode rejects the DMA."""
    pages = example_pages(4, 8, 128, F32)
    with pytest.raises(KernelFailedError, match="Out-of-bounds"):
        simulate(gather_pages, pages, jnp.asarray([0, 4], jnp.int32))


# ------------------------------------------------------------ meshes

PER_DEVICE = {F32: (5, 8, 128), BF16: (5, 16, 128)}  # pages per device, page shape
K = 7


def _mesh_reference(pages: np.ndarray, indices: np.ndarray, devices: int) -> np.ndarray:
    """Device d gathers its own indices from its own pages."""
    local_pages = pages.reshape(devices, -1, *pages.shape[1:])
    local_idx = indices.reshape(devices, -1)
    return np.concatenate([p[i] for p, i in zip(local_pages, local_idx)])


@EACH_DTYPE
@SPLIT_MESHES
def test_each_device_gathers_from_its_shard(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], split: str | tuple[str, ...], dtype: DType
) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    devices = split_devices(mesh, split)
    num_pages, page_rows, cols = PER_DEVICE[dtype]
    pages = example_pages(devices * num_pages, page_rows, cols, dtype)
    rng = np.random.default_rng(devices)
    indices = jnp.asarray(rng.integers(0, num_pages, devices * K), jnp.int32)
    out = simulate(
        gather_pages, pages, indices, mesh=mesh, in_specs=(P(split), P(split)), out_specs=P(split)
    )
    assert_exact(out, _mesh_reference(np.asarray(pages), np.asarray(indices), devices))


# ------------------------------------------------------------ preconditions

_PAGES = jnp.zeros((4, 8, 128), F32)


@pytest.mark.parametrize(
    "pages,indices,message",
    [
        (jnp.zeros((32, 128), F32), jnp.asarray([0], I32), "3-D"),
        (jnp.zeros((4, 16, 128), jnp.float16), jnp.asarray([0], I32), "supports dtypes"),
        (jnp.zeros((4, 8, 128), BF16), jnp.asarray([0], I32), r"tile \(16, 128\)"),
        (jnp.zeros((4, 8, 200), F32), jnp.asarray([0], I32), r"tile \(8, 128\)"),
        (_PAGES, jnp.asarray([[0, 1]], I32), "1-D"),
        (_PAGES, jnp.zeros((0,), I32), "at least one"),
        (_PAGES, jnp.asarray([0, 1], jnp.int16), "int32"),
        (_PAGES, jnp.asarray([0, 4, 1], I32), r"indices\[1\] = 4 is outside \[0, 4\)"),
        (_PAGES, jnp.asarray([-1, 5, 2], I32), r"indices\[0\] = -1 .*2 of 3 indices"),
    ],
    ids=[
        "2d",
        "float16",
        "bf16-tile",
        "cols",
        "2d-indices",
        "empty",
        "int16",
        "too-big",
        "negative",
    ],
)
def test_preconditions_are_checked_up_front(
    pages: jax.Array, indices: jax.Array, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        gather_pages(pages, indices)


def test_constant_indices_inside_jit_are_checked() -> None:
    """Indices closed over by a jitted function are concrete, so they are checked too."""
    idx = jnp.asarray([0, 9], I32)
    with pytest.raises(ValueError, match="outside"):
        jax.jit(lambda p: gather_pages(p, idx)).lower(_PAGES)


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize(
    "shape,dtype,k",
    [
        ((6, 8, 128), F32, 9),
        ((6, 8, 128), F32, 1),
        ((4, 16, 256), BF16, 3),
    ],
    ids=["f32-k9", "f32-k1", "bf16-k3"],
)
def test_same_mosaic_as_the_pltpu_twin(shape: tuple[int, int, int], dtype: DType, k: int) -> None:
    pages = jax.ShapeDtypeStruct(shape, dtype)
    indices = jax.ShapeDtypeStruct((k,), I32)
    assert_same_mosaic(gather_pages, twin.gather_pages, pages, indices)


# ------------------------------------------------------------ TPU builds


def _global(devices: int, dtype: DType) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    num_pages, page_rows, cols = 64, (8 if dtype == F32 else 16), 512
    return (
        jax.ShapeDtypeStruct((devices * num_pages, page_rows, cols), dtype),
        jax.ShapeDtypeStruct((devices * 24,), I32),
    )


def test_compiles_for_a_16_chip_v6e() -> None:
    report = compile_for_tpu(gather_pages, *_global(16, F32), topology="v6e:4x4")
    assert_built(report, devices=16, kernels=("gather_pages",))


@pytest.mark.slow
@EACH_DTYPE
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, dtype: DType) -> None:
    report = compile_for_tpu(gather_pages, *_global(4, dtype), topology=topology)
    assert report.topology == topology
    assert report.generated_code_size_in_bytes > 0


# ------------------------------------------------------------ the aggregate wait is exact


def _wrong_aggregate_wait(
    indices_smem: sd.DataRef,
    pages_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    buf: sd.DataRef,
    sem: sd.SemRef,
    *,
    twice: bool,
) -> None:
    """The gather kernel with its one aggregate wait a page short, or made twice."""
    k = buf.shape[0]
    for j in range(k):
        sd.LocalCopy(pages_hbm.at[indices_smem[j]], buf.at[j], sem).start()
    if twice:
        sd.LocalCopy(buf, buf, sem).started_elsewhere().wait()
        sd.LocalCopy(buf, buf, sem).started_elsewhere().wait()
    else:
        short = pl.ds(0, k - 1)
        sd.LocalCopy(buf.at[short], buf.at[short], sem).started_elsewhere().wait()
    sd.LocalCopy(buf, o_hbm, sem).start().wait()


@pytest.mark.parametrize(
    "body,error,match",
    [
        # a page short: the last page may still be in flight when buf is copied out
        # (a wait is ordered only after the copies it consumes), and its bytes stay
        # on sem; the race comes first
        (
            functools.partial(_wrong_aggregate_wait, twice=False),
            RaceDetectedError,
            "_wrong_aggregate_wait",
        ),
        (
            functools.partial(_wrong_aggregate_wait, twice=True),
            UnsatisfiableWaitError,
            "DMA semaphore",
        ),
    ],
    ids=["short", "twice"],
)
def test_a_wrong_aggregate_wait_fails_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
    body: Callable[..., None],
    error: type[Exception],
    match: str,
) -> None:
    """The same set-up with the aggregate wait changed: the simulation must reject it."""
    monkeypatch.setattr(gather_module, "gather_pages_kernel", body)
    pages = example_pages(4, 8, 128, F32)
    with pytest.raises(error, match=match):
        simulate(gather_pages, pages, jnp.asarray([3, 0, 2], I32), timeout_s=1.0)


def test_too_many_pages_for_vmem_fail_to_compile() -> None:
    """2048 pages of 32 KiB (64 MiB) staged in VMEM: the compiler rejects it, naming vmem."""
    pages = jax.ShapeDtypeStruct((4 * 64, 8, 1024), F32)
    indices = jax.ShapeDtypeStruct((4 * 2048,), I32)
    with pytest.raises(TpuCompileError, match="vmem"):
        compile_for_tpu(gather_pages, pages, indices, topology="v6e:2x2")
