"""safedma.kernels.reduce_scatter: psum_scatter under strict simulation, twin identity, TPU builds.

Tolerances. The kernel and XLA add the same ``n`` values per element in
different orders, so they differ by rounding only. The bounds are the
classic worst-case bound for a sum of ``n`` terms in any order,
``|computed - exact| <= gamma(n - 1) * sum(|x|)`` with
``gamma(k) = k*u / (1 - k*u)`` and ``u`` the unit roundoff (2**-24 for
float32, 2**-8 for bfloat16: 24 and 8 significant bits), applied per
element; the exact sum and ``sum(|x|)`` are computed in float64 with numpy.
The bounds are far below the size of the inputs (standard normal), so a
chunk sent to the wrong device, added twice or missed fails by orders of
magnitude.

* float32, against ``jax.lax.psum_scatter``: both are within
  ``gamma(n - 1) * sum(|x|)`` of the exact sum, so within twice that of
  each other.
* bfloat16, against ``jax.lax.psum_scatter`` in bfloat16: XLA may round
  after each of its additions (``gamma_bf16(n - 1)``), the kernel rounds once
  after a float32 sum, so the two are within
  ``(gamma_bf16(n - 1) + 2**-8 + 2 * gamma_f32(n - 1)) * sum(|x|)``.
* bfloat16, tight, against the exact sum: within ``2**-8 * |exact|`` (half a
  bfloat16 ulp) plus the float32 bound, which holds only if the kernel
  accumulates in float32 and rounds once, as documented.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kernel_twins import reduce_scatter as twin
from safedma.kernels.reduce_scatter import reduce_scatter
from safedma.testing import (
    abstract_mesh,
    assert_same_mosaic,
    compile_for_tpu,
    simulate,
    simulated_mesh,
)

DType = np.dtype[Any]
F32: DType = np.dtype(jnp.float32)
BF16: DType = np.dtype(jnp.bfloat16)
UNIT_ROUNDOFF = {F32: 2.0**-24, BF16: 2.0**-8}
TILE_ROWS = {F32: 8, BF16: 16}
# Two chunk shapes per dtype: two tiles along the lanes, or along the rows. Each
# device's block (ring size x chunk) stays at 64 KB or less on 8 devices: jax
# 0.10.2's interpret mode deadlocks when a kernel argument of about 100 KB or
# more is handed to its buffer allocation while another device waits.
CHUNKS = {F32: [(8, 256), (16, 128)], BF16: [(16, 256), (32, 128)]}

# mesh shape, axis names, the ring axis
MESHES = [
    ((2,), ("x",), "x"),
    ((4,), ("x",), "x"),
    ((8,), ("x",), "x"),
    ((2, 4), ("y", "x"), "y"),
    ((2, 4), ("y", "x"), "x"),
]
MESH_IDS = ["2", "4", "8", "2x4-y", "2x4-x"]


def gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def example(mesh: Mesh, ring: int, chunk: tuple[int, int], dtype: DType,
            seed: int = 0) -> jax.Array:
    """Standard normal values: each device's block holds ``ring`` chunks."""
    rows = mesh.devices.size * ring * chunk[0]
    values = np.random.default_rng(seed).standard_normal((rows, chunk[1]))
    return jnp.asarray(values, dtype=dtype)


def xla(fn: Callable[[jax.Array], jax.Array], x: jax.Array, mesh: Mesh) -> np.ndarray:
    """``fn`` per device under shard_map, rows split over every mesh axis, as float64."""
    spec = P(tuple(mesh.axis_names))
    placed = jax.device_put(x, NamedSharding(mesh, spec))
    out = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec))(placed)
    return np.asarray(out, dtype=np.float64)


def simulated(fn: Callable[[jax.Array], jax.Array], x: jax.Array, mesh: Mesh) -> jax.Array:
    spec = P(tuple(mesh.axis_names))
    return simulate(fn, x, mesh=mesh, in_specs=spec, out_specs=spec)


def exact_sums(x: jax.Array, mesh: Mesh, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Per device: the float64 sum over ``axis`` of every block, and of their absolute values.

    Device blocks are the rows of ``x`` split over all mesh axes in mesh order;
    the result has one full-size block per device, in the same order.
    """
    shape = tuple(mesh.devices.shape)
    blocks = np.asarray(x, dtype=np.float64).reshape(*shape, -1, x.shape[1])
    ring = list(mesh.axis_names).index(axis)

    def summed(values: np.ndarray) -> np.ndarray:
        total = np.broadcast_to(values.sum(axis=ring, keepdims=True), values.shape)
        return total.reshape(-1, x.shape[1])

    return summed(blocks), summed(np.abs(blocks))


def scatter(full: np.ndarray, mesh: Mesh, axis: str) -> np.ndarray:
    """Each device's chunk of its full-size block: chunk ``j`` on coordinate ``j`` of ``axis``."""
    shape = tuple(mesh.devices.shape)
    n = mesh.shape[axis]
    ring = list(mesh.axis_names).index(axis)
    blocks = full.reshape(int(np.prod(shape)), n, -1, full.shape[1])
    chunks = [blocks[d, coords[ring]] for d, coords in enumerate(np.ndindex(*shape))]
    return np.concatenate(chunks)


def assert_sum_close(out: jax.Array, x: jax.Array, mesh: Mesh, axis: str,
                     collective: Callable[[jax.Array, str], jax.Array],
                     exact: np.ndarray, abs_sum: np.ndarray) -> None:
    """``out`` is ``collective(x, axis)`` within the module docstring's bounds."""
    n = mesh.shape[axis]
    dtype = np.dtype(x.dtype)
    assert out.dtype == dtype
    got = np.asarray(out, dtype=np.float64)
    same = xla(lambda b: collective(b, axis), x, mesh)
    assert got.shape == same.shape == exact.shape
    f32 = gamma(n - 1, UNIT_ROUNDOFF[F32])
    if dtype == F32:
        bound = 2 * f32 * abs_sum
    else:
        bound = (gamma(n - 1, UNIT_ROUNDOFF[BF16]) + UNIT_ROUNDOFF[BF16] + 2 * f32) * abs_sum
        tight = UNIT_ROUNDOFF[BF16] * np.abs(exact) + f32 * abs_sum * (1 + UNIT_ROUNDOFF[BF16])
        worst = np.max(np.abs(got - exact) - tight)
        assert worst <= 0, f"not float32-accumulated: exceeds the tight bound by {worst}"
    worst = np.max(np.abs(got - same) - bound)
    assert worst <= 0, f"differs from XLA by {worst} beyond the rounding bound"


def psum_scatter(b: jax.Array, axis: str) -> jax.Array:
    return jax.lax.psum_scatter(b, axis, scatter_dimension=0, tiled=True)


# ------------------------------------------------------------ strict simulation


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape_index", [0, 1], ids=["wide", "tall"])
@pytest.mark.parametrize("mesh_shape,names,axis", MESHES, ids=MESH_IDS)
def test_matches_psum_scatter(mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str,
                              shape_index: int, dtype: DType) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    n = mesh.shape[axis]
    x = example(mesh, n, CHUNKS[dtype][shape_index], dtype, seed=n + shape_index)
    out = simulated(lambda b: reduce_scatter(b, axis=axis), x, mesh)
    exact, abs_sum = exact_sums(x, mesh, axis)
    assert_sum_close(out, x, mesh, axis, psum_scatter, scatter(exact, mesh, axis),
                     scatter(abs_sum, mesh, axis))


def test_one_device_along_the_axis_is_the_identity() -> None:
    mesh = simulated_mesh((1, 4), ("y", "x"))
    x = example(mesh, 1, (8, 128), F32)
    out = simulated(lambda b: reduce_scatter(b, axis="y"), x, mesh)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# ------------------------------------------------------------ preconditions


@pytest.mark.parametrize("shape,dtype,axis,kwargs,message", [
    ((2, 32, 128), F32, "x", {}, "2-D"),
    ((32, 128), np.dtype(np.int32), "x", {}, "supports dtypes"),
    ((31, 128), F32, "x", {}, "divisible by the 2 devices"),
    ((24, 128), F32, "x", {}, "multiple of 8"),
    ((16, 128), BF16, "x", {}, "multiple of 16"),
    ((32, 200), F32, "x", {}, "multiple of 128"),
    ((32, 128), F32, "z", {}, "unknown mesh axis 'z'"),
    ((32, 128), F32, "x", {"collective_id": -1},
     "collective_id must be a non-negative Python int"),
], ids=["3d", "int32", "rows", "f32-tile", "bf16-tile", "cols", "axis", "collective-id"])
def test_preconditions_are_checked_up_front(shape: tuple[int, ...], dtype: DType, axis: str,
                                            kwargs: dict[str, int], message: str) -> None:
    mesh = simulated_mesh((2,), ("x",))
    rows = (shape[0] * 2, *shape[1:])
    per_device = jax.shard_map(lambda b: reduce_scatter(b, axis=axis, **kwargs), mesh=mesh,
                               in_specs=P("x"), out_specs=P("x"), check_vma=False)
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(per_device, jax.ShapeDtypeStruct(rows, dtype,
                                                        sharding=NamedSharding(mesh, P("x"))))


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize("sizes,names,axis,dtype", [
    ((4,), ("x",), "x", F32),
    ((2, 4), ("y", "x"), "y", BF16),
    ((2, 4), ("y", "x"), "x", F32),
], ids=["4-float32", "2x4-y-bfloat16", "2x4-x-float32"])
def test_same_mosaic_as_the_pltpu_twin(sizes: tuple[int, ...], names: tuple[str, ...],
                                       axis: str, dtype: DType) -> None:
    mesh = abstract_mesh(sizes, names)
    spec = P(names)
    n = sizes[names.index(axis)]
    rows = int(np.prod(sizes)) * n * 2 * TILE_ROWS[dtype]
    x = jax.ShapeDtypeStruct((rows, 256), dtype, sharding=NamedSharding(mesh, spec))

    def mapped(fn: Callable[..., jax.Array]) -> Callable[[jax.Array], jax.Array]:
        return jax.shard_map(lambda b: fn(b, axis=axis), mesh=mesh, in_specs=spec,
                             out_specs=spec, check_vma=False)

    assert_same_mosaic(mapped(reduce_scatter), mapped(twin.reduce_scatter), x, mesh=mesh)


# ------------------------------------------------------------ TPU builds

TOPOLOGIES = ["v5e:2x2", "v6e:2x2", "v5p:2x2x1", "v4:2x2x1", "tpu7x:2x2x1"]


def on(axis: str) -> Callable[[jax.Array], jax.Array]:
    def per_device(b: jax.Array) -> jax.Array:
        return reduce_scatter(b, axis=axis)

    per_device.__name__ = f"reduce_scatter_{axis}"
    return per_device


def global_input(devices: int, ring: int, dtype: DType) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((devices * ring * 2 * TILE_ROWS[dtype], 512), dtype)


@pytest.mark.parametrize("mesh_shape,names,axis,topology", [
    ((4, 4), ("y", "x"), "x", "v6e:4x4"),
    ((16, 16), ("y", "x"), "y", "v6e:16x16"),
    ((256,), ("x",), "x", "v6e:16x16"),
], ids=["v6e-4x4-x", "v6e-16x16-y", "v6e-256-ring"])
def test_compiles_for_large_v6e_meshes(mesh_shape: tuple[int, ...], names: tuple[str, ...],
                                       axis: str, topology: str) -> None:
    devices = int(np.prod(mesh_shape))
    ring = mesh_shape[names.index(axis)]
    report = compile_for_tpu(on(axis), global_input(devices, ring, BF16), topology=topology,
                             mesh_shape=mesh_shape, axis_names=names, in_specs=P(names),
                             out_specs=P(names))
    assert report.num_devices == devices
    assert report.kernel_names == ("reduce_scatter",)
    assert report.generated_code_size_in_bytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, dtype: DType) -> None:
    report = compile_for_tpu(on("x"), global_input(4, 4, dtype), topology=topology)
    assert report.topology == topology
    assert report.kernel_names == ("reduce_scatter",)
    assert report.generated_code_size_in_bytes > 0
