"""Inputs, meshes and call wrappers shared by the ppermute and all-gather tests.

Both collectives run along one axis of a 1-D ring or of a 2x4 mesh (either
axis), on blocks whose every value is distinct-ish, so a block delivered to the
wrong device shows up as a mismatch with jax's own collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from safedma.testing import compile_for_tpu
from tests.support.kernel_params import TOPOLOGIES

__all__ = ["MESHES", "MESH_IDS", "TOPOLOGIES", "blocks", "compile_on", "mapped", "spec"]

DType: TypeAlias = Any
Collective: TypeAlias = Callable[..., jax.Array]

# (mesh shape, axis names, the axis the collective runs along)
MESHES = [
    ((2,), ("x",), "x"),
    ((4,), ("x",), "x"),
    ((8,), ("x",), "x"),
    ((2, 4), ("y", "x"), "x"),
    ((2, 4), ("y", "x"), "y"),
]
MESH_IDS = ["2", "4", "8", "2x4-x", "2x4-y"]


def blocks(devices: int, shape: tuple[int, ...], dtype: DType, seed: int = 0) -> jax.Array:
    """``devices`` blocks of ``shape`` stacked along dimension 0, values distinct-ish."""
    rng = np.random.default_rng(seed)
    full = (devices * shape[0], *shape[1:])
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.asarray(rng.integers(info.min, info.max, full, endpoint=True), dtype=dtype)
    return jnp.asarray(rng.standard_normal(full) * 100, dtype=dtype)


def spec(names: tuple[str, ...]) -> P:
    """Dimension 0 split over every mesh axis."""
    return P(names[0] if len(names) == 1 else names)


def mapped(fn: Collective, mesh: Any, axis: str, **kwargs: Any) -> Callable[[jax.Array], jax.Array]:
    """``fn(block, axis=axis, **kwargs)`` per device, jitted under shard_map on ``mesh``."""
    s = spec(tuple(mesh.axis_names))
    out: Callable[[jax.Array], jax.Array] = jax.jit(
        jax.shard_map(
            lambda block: fn(block, axis=axis, **kwargs),
            mesh=mesh,
            in_specs=s,
            out_specs=s,
            check_vma=False,
        )
    )
    return out


def compile_on(
    fn: Collective, topology: str, mesh_shape: tuple[int, ...], axis: str, **kwargs: Any
) -> None:
    """Compile ``fn`` for ``topology`` on bf16 16x256 blocks: one kernel named after ``fn``,
    some code generated."""
    names = ("y", "x") if len(mesh_shape) == 2 else ("x",)

    def per_device(block: jax.Array) -> jax.Array:
        return fn(block, axis=axis, **kwargs)

    x = jax.ShapeDtypeStruct((int(np.prod(mesh_shape)) * 16, 256), jnp.bfloat16)
    report = compile_for_tpu(
        per_device,
        x,
        topology=topology,
        mesh_shape=mesh_shape,
        axis_names=names,
        in_specs=spec(names),
        out_specs=spec(names),
    )
    assert report.kernel_names == (fn.__name__,)
    assert report.generated_code_size_in_bytes > 0
