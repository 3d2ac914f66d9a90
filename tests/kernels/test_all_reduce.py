"""safedma.kernels.all_reduce: psum under strict simulation, twin identity, TPU builds.

Both forms (fused, and reduce-scatter then all-gather) are checked against
``jax.lax.psum`` with the rounding bounds of test_kernels_reduce_scatter.py
(an all-reduce is the same sums, gathered), including the tight bfloat16
bound that holds only for float32 accumulation. The two forms round the
same float32 sums once, so they must agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support.twins import all_reduce as twin
from safedma.kernels.all_reduce import all_reduce
from safedma.testing import assert_same_mosaic, compile_for_tpu, simulate, simulated_mesh
from tests.support.reductions import BF16, CHUNKS, EACH_DTYPE, F32, LARGE_V6E, ON_MESHES
from tests.support.reductions import TOPOLOGIES, assert_sum_close, compile_large, DType, exact_sums
from tests.support.reductions import example, global_input, identity_input, simulated
from tests.support.collectives import mapped


def psum(b: jax.Array, axis: str) -> jax.Array:
    return jax.lax.psum(b, axis)


# ------------------------------------------------------------ strict simulation


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
@EACH_DTYPE
@ON_MESHES
def test_matches_psum(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str, dtype: DType, fused: bool
) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    n = mesh.shape[axis]
    # Each form meets both chunk shapes of each dtype, over the meshes.
    chunk = CHUNKS[dtype][(int(fused) + int(dtype == BF16)) % 2]
    x = example(mesh, n, chunk, dtype, seed=10 + n)
    out = simulated(lambda b: all_reduce(b, axis=axis, fused=fused), x, mesh)
    exact, abs_sum = exact_sums(x, mesh, axis)
    assert_sum_close(out, x, mesh, axis, psum, exact, abs_sum)


def test_fused_and_composed_agree_bit_for_bit() -> None:
    mesh = simulated_mesh((8,), ("x",))
    x = example(mesh, 8, CHUNKS[BF16][0], BF16, seed=3)
    fused = simulated(lambda b: all_reduce(b, axis="x", fused=True), x, mesh)
    composed = simulated(lambda b: all_reduce(b, axis="x", fused=False), x, mesh)
    np.testing.assert_array_equal(np.asarray(fused), np.asarray(composed))


def test_one_device_along_the_axis_is_the_identity() -> None:
    mesh = simulated_mesh((1, 4), ("y", "x"))
    x = example(mesh, 1, CHUNKS[F32][0], F32)
    out = simulate(
        lambda b: all_reduce(b, axis="y"),
        x,
        mesh=mesh,
        in_specs=P(("y", "x")),
        out_specs=P(("y", "x")),
    )
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# ------------------------------------------------------------ preconditions


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
@pytest.mark.parametrize(
    "shape,dtype,kwargs,message",
    [
        ((31, 128), F32, {}, "divisible by the 2 devices"),
        ((16, 128), BF16, {}, "multiple of 16"),
        (
            (32, 128),
            F32,
            {"collective_id": True},
            "collective_id must be a non-negative Python int",
        ),
    ],
    ids=["rows", "bf16-tile", "collective-id"],
)
def test_preconditions_are_checked_up_front(
    shape: tuple[int, int], dtype: DType, kwargs: dict[str, int], message: str, fused: bool
) -> None:
    mesh = simulated_mesh((2,), ("x",))
    per_device = jax.shard_map(
        lambda b: all_reduce(b, axis="x", fused=fused, **kwargs),
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P("x"),
        check_vma=False,
    )
    x = jax.ShapeDtypeStruct((shape[0] * 2, shape[1]), dtype, sharding=NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(per_device, x)


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
@pytest.mark.parametrize(
    "sizes,names,axis,dtype",
    [
        ((4,), ("x",), "x", F32),
        ((2, 4), ("y", "x"), "y", BF16),
    ],
    ids=["4-float32", "2x4-y-bfloat16"],
)
def test_same_mosaic_as_the_pltpu_twin(
    sizes: tuple[int, ...], names: tuple[str, ...], axis: str, dtype: DType, fused: bool
) -> None:
    mesh, x = identity_input(sizes, names, axis, dtype)
    assert_same_mosaic(
        mapped(all_reduce, mesh, axis, fused=fused),
        mapped(twin.all_reduce, mesh, axis, fused=fused),
        x,
        mesh=mesh,
    )


# ------------------------------------------------------------ TPU builds

KERNELS = {True: ("all_reduce",), False: ("reduce_scatter", "all_gather")}


def on(axis: str, fused: bool) -> Callable[[jax.Array], jax.Array]:
    def per_device(b: jax.Array) -> jax.Array:
        return all_reduce(b, axis=axis, fused=fused)

    per_device.__name__ = f"all_reduce_{'fused' if fused else 'composed'}_{axis}"
    return per_device


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
@LARGE_V6E
def test_compiles_for_large_v6e_meshes(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str, topology: str, fused: bool
) -> None:
    report = compile_large(on(axis, fused), mesh_shape, names, axis, topology)
    assert report.kernel_names == KERNELS[fused]


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "composed"])
@EACH_DTYPE
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, dtype: DType, fused: bool) -> None:
    report = compile_for_tpu(on("x", fused), global_input(4, 4, dtype), topology=topology)
    assert report.topology == topology
    assert report.kernel_names == KERNELS[fused]
    assert report.generated_code_size_in_bytes > 0
