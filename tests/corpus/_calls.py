"""pallas_call set-ups of the corpus's small kernels: one body (safedma or its raw twin)
in the same call, on one device or inside shard_map over an abstract mesh, and the
:class:`~tests.corpus._case.Program` of each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh
from tests.corpus._case import MeshSpec, Program

HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)
MESH = abstract_mesh((4,), ("x",))
X_SHARDED = jax.ShapeDtypeStruct((4 * 32, 128), jnp.float32, sharding=NamedSharding(MESH, P("x")))


def local_call(
    kernel: Callable[..., None],
    scratch: Sequence[object] = (),
    *,
    checked: bool = True,
    out_dtype: Any = None,
    **options: Any,
) -> Callable[[jax.Array], jax.Array]:
    """``kernel(x_ref, o_ref, *scratch)`` with x and o in HBM; sd.pallas_call when checked."""

    def run(x: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct(x.shape, out_dtype or x.dtype)
        if checked:
            return sd.pallas_call(
                kernel, out, in_specs=[HBM], out_specs=HBM, scratch_shapes=list(scratch), **options
            )(x)
        raw_scratch: list[Any] = list(scratch)
        result: jax.Array = pl.pallas_call(
            kernel,
            out_shape=out,
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=raw_scratch,
            **options,
        )(x)
        return result

    return run


def mesh_call(
    kernel: Callable[..., None],
    scratch: Sequence[object] = (),
    *,
    checked: bool = True,
    mesh: AbstractMesh = MESH,
    **options: Any,
) -> Callable[[jax.Array], jax.Array]:
    """``local_call`` inside ``jax.shard_map`` over ``mesh``'s "x" axis."""
    per_device = local_call(kernel, scratch, checked=checked, **options)
    mapped: Callable[[jax.Array], jax.Array] = jax.shard_map(
        per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False
    )
    return mapped


def trace(fn: Callable[..., object], *args: object) -> None:
    """Trace ``fn`` (so every kernel body in it runs its safedma checks)."""
    jax.jit(fn).trace(*(args or (X,)))


TPU = MeshSpec((), (), "v5p")  # no axes: names the chip (jax 0.12 asks for one to lower)


def local(
    kernel: Callable[..., None],
    scratch: Sequence[object] = (),
    *,
    checked: bool = True,
    mesh: MeshSpec | None = None,
    lower: bool = False,
    **options: Any,
) -> Program:
    """:func:`local_call` of ``X`` as a program (``checked``: through ``sd.pallas_call``)."""
    return Program(local_call(kernel, scratch, checked=checked, **options), (X,), mesh, lower=lower)


def on_ring(
    kernel: Callable[..., None], scratch: Sequence[object] = (), *, checked: bool = True
) -> Program:
    """:func:`mesh_call` of ``X_SHARDED`` (a 4-device ring along "x") as a program."""
    return Program(mesh_call(kernel, scratch, checked=checked), (X_SHARDED,))
