"""Inputs, meshes and rounding bounds shared by the reduce-scatter and all-reduce tests.

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

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from safedma.testing import TpuCompileReport, abstract_mesh, compile_for_tpu, simulate
from tests.support.kernel_params import BF16, EACH_DTYPE, F32, TILE_ROWS, TOPOLOGIES, DType

# Re-exported: the reduction tests take their dtypes and parametrisations from here.
__all__ = ["BF16", "EACH_DTYPE", "F32", "TILE_ROWS", "TOPOLOGIES", "DType"]

UNIT_ROUNDOFF = {F32: 2.0**-24, BF16: 2.0**-8}
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
ON_MESHES = pytest.mark.parametrize("mesh_shape,names,axis", MESHES, ids=MESH_IDS)
# mesh shape, axis names, ring axis, topology: the large v6e meshes each kernel compiles for
LARGE_V6E = pytest.mark.parametrize(
    "mesh_shape,names,axis,topology",
    [
        ((4, 4), ("y", "x"), "x", "v6e:4x4"),
        ((16, 16), ("y", "x"), "y", "v6e:16x16"),
        ((256,), ("x",), "x", "v6e:16x16"),
    ],
    ids=["v6e-4x4-x", "v6e-16x16-y", "v6e-256-ring"],
)


def gamma(k: int, u: float) -> float:
    return k * u / (1 - k * u)


def example(
    mesh: Mesh, ring: int, chunk: tuple[int, int], dtype: DType, seed: int = 0
) -> jax.Array:
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


def assert_sum_close(
    out: jax.Array,
    x: jax.Array,
    mesh: Mesh,
    axis: str,
    collective: Callable[[jax.Array, str], jax.Array],
    exact: np.ndarray,
    abs_sum: np.ndarray,
) -> None:
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


def global_input(devices: int, ring: int, dtype: DType) -> jax.ShapeDtypeStruct:
    """A compile-only input: two tiles of rows per chunk, 512 lanes."""
    return jax.ShapeDtypeStruct((devices * ring * 2 * TILE_ROWS[dtype], 512), dtype)


def identity_input(
    sizes: tuple[int, ...], names: tuple[str, ...], axis: str, dtype: DType
) -> tuple[Mesh, jax.ShapeDtypeStruct]:
    """A device-free mesh and a sharded input with two tiles of rows per chunk."""
    mesh = abstract_mesh(sizes, names)
    n = sizes[names.index(axis)]
    rows = int(np.prod(sizes)) * n * 2 * TILE_ROWS[dtype]
    return mesh, jax.ShapeDtypeStruct((rows, 256), dtype, sharding=NamedSharding(mesh, P(names)))


def compile_large(
    per_device: Callable[[jax.Array], jax.Array],
    mesh_shape: tuple[int, ...],
    names: tuple[str, ...],
    axis: str,
    topology: str,
) -> TpuCompileReport:
    """Compile ``per_device`` on bfloat16 for ``topology``: every device, some code."""
    devices = int(np.prod(mesh_shape))
    report = compile_for_tpu(
        per_device,
        global_input(devices, mesh_shape[names.index(axis)], BF16),
        topology=topology,
        mesh_shape=mesh_shape,
        axis_names=names,
        in_specs=P(names),
        out_specs=P(names),
    )
    assert report.num_devices == devices
    assert report.generated_code_size_in_bytes > 0
    return report
