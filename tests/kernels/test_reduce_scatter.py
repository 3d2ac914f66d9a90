"""safedma.kernels.reduce_scatter: psum_scatter under strict simulation, twin identity, TPU builds.

The rounding bounds are explained in tests/support/reductions.py.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support.reductions import BF16, CHUNKS, EACH_DTYPE, F32, LARGE_V6E, ON_MESHES
from tests.support.reductions import TOPOLOGIES, assert_sum_close, compile_large, DType, exact_sums
from tests.support.reductions import example, global_input, identity_input, scatter, simulated
from tests.support.collectives import mapped
from tests.support.twins import reduce_scatter as twin
from safedma.kernels.reduce_scatter import reduce_scatter
from safedma.testing import assert_same_mosaic, compile_for_tpu, simulated_mesh


def psum_scatter(b: jax.Array, axis: str) -> jax.Array:
    return jax.lax.psum_scatter(b, axis, scatter_dimension=0, tiled=True)


# ------------------------------------------------------------ strict simulation


@EACH_DTYPE
@pytest.mark.parametrize("shape_index", [0, 1], ids=["wide", "tall"])
@ON_MESHES
def test_matches_psum_scatter(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str, shape_index: int, dtype: DType
) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    n = mesh.shape[axis]
    x = example(mesh, n, CHUNKS[dtype][shape_index], dtype, seed=n + shape_index)
    out = simulated(lambda b: reduce_scatter(b, axis=axis), x, mesh)
    exact, abs_sum = exact_sums(x, mesh, axis)
    assert_sum_close(
        out, x, mesh, axis, psum_scatter, scatter(exact, mesh, axis), scatter(abs_sum, mesh, axis)
    )


def test_one_device_along_the_axis_is_the_identity() -> None:
    mesh = simulated_mesh((1, 4), ("y", "x"))
    x = example(mesh, 1, (8, 128), F32)
    out = simulated(lambda b: reduce_scatter(b, axis="y"), x, mesh)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# ------------------------------------------------------------ preconditions


@pytest.mark.parametrize(
    "shape,dtype,axis,kwargs,message",
    [
        ((2, 32, 128), F32, "x", {}, "2-D"),
        ((32, 128), np.dtype(np.int32), "x", {}, "supports dtypes"),
        ((31, 128), F32, "x", {}, "divisible by the 2 devices"),
        ((24, 128), F32, "x", {}, "multiple of 8"),
        ((16, 128), BF16, "x", {}, "multiple of 16"),
        ((32, 200), F32, "x", {}, "multiple of 128"),
        ((32, 128), F32, "z", {}, "unknown mesh axis 'z'"),
        (
            (32, 128),
            F32,
            "x",
            {"collective_id": -1},
            "collective_id must be a non-negative Python int",
        ),
    ],
    ids=["3d", "int32", "rows", "f32-tile", "bf16-tile", "cols", "axis", "collective-id"],
)
def test_preconditions_are_checked_up_front(
    shape: tuple[int, ...], dtype: DType, axis: str, kwargs: dict[str, int], message: str
) -> None:
    mesh = simulated_mesh((2,), ("x",))
    rows = (shape[0] * 2, *shape[1:])
    per_device = jax.shard_map(
        lambda b: reduce_scatter(b, axis=axis, **kwargs),
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P("x"),
        check_vma=False,
    )
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(
            per_device, jax.ShapeDtypeStruct(rows, dtype, sharding=NamedSharding(mesh, P("x")))
        )


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize(
    "sizes,names,axis,dtype",
    [
        ((4,), ("x",), "x", F32),
        ((2, 4), ("y", "x"), "y", BF16),
        ((2, 4), ("y", "x"), "x", F32),
    ],
    ids=["4-float32", "2x4-y-bfloat16", "2x4-x-float32"],
)
def test_same_mosaic_as_the_pltpu_twin(
    sizes: tuple[int, ...], names: tuple[str, ...], axis: str, dtype: DType
) -> None:
    mesh, x = identity_input(sizes, names, axis, dtype)
    assert_same_mosaic(
        mapped(reduce_scatter, mesh, axis), mapped(twin.reduce_scatter, mesh, axis), x, mesh=mesh
    )


# ------------------------------------------------------------ TPU builds


def on(axis: str) -> Callable[[jax.Array], jax.Array]:
    def per_device(b: jax.Array) -> jax.Array:
        return reduce_scatter(b, axis=axis)

    per_device.__name__ = f"reduce_scatter_{axis}"
    return per_device


@LARGE_V6E
def test_compiles_for_large_v6e_meshes(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str, topology: str
) -> None:
    report = compile_large(on(axis), mesh_shape, names, axis, topology)
    assert report.kernel_names == ("reduce_scatter",)


@pytest.mark.slow
@EACH_DTYPE
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, dtype: DType) -> None:
    report = compile_for_tpu(on("x"), global_input(4, 4, dtype), topology=topology)
    assert report.topology == topology
    assert report.kernel_names == ("reduce_scatter",)
    assert report.generated_code_size_in_bytes > 0
