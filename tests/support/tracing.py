"""Trace a kernel under safedma's entry points, for the trace-time error tests.

Every helper traces (``jax.eval_shape``: the kernel body runs, nothing is
lowered or executed) one kernel whose ``x_ref`` / ``o_ref`` are f32[2,8,128]
in HBM, alone or inside ``jax.shard_map`` over a 4-device or 2x4 mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import safedma

__all__ = [
    "ANY",
    "DMA",
    "ENTRIES",
    "F32",
    "SHAPE",
    "TWO_DMA",
    "VMEM",
    "Kernel",
    "assert_mentions",
    "mesh_of",
    "ring",
    "trace",
    "trace_on_mesh",
]

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
SHAPE = (2, 8, 128)  # the shape of x_ref / o_ref seen by each kernel instance

Kernel = Callable[..., None]


def _call(
    kernel: Kernel,
    out: jax.ShapeDtypeStruct,
    scratch: Sequence[object],
    *,
    entry: str,
    compiler_params: object | None,
    grid: tuple[int, ...] | None = None,
) -> Callable[..., Any]:
    kwargs: dict[str, Any] = {}
    if compiler_params is not None:
        kwargs["compiler_params"] = compiler_params
    if grid is not None:
        kwargs["grid"] = grid
    if entry == "safedma.pallas_call":
        return safedma.pallas_call(
            kernel, out, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch, **kwargs
        )
    body = safedma.checked(kernel) if entry == "pl.pallas_call(safedma.checked)" else kernel
    return pl.pallas_call(
        body, out_shape=out, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch, **kwargs
    )


def trace(
    kernel: Kernel,
    scratch: Sequence[object] = (),
    *,
    entry: str = "safedma.pallas_call",
    compiler_params: object | None = None,
    grid: tuple[int, ...] | None = None,
) -> None:
    """Trace ``kernel`` on one device: x_ref, o_ref are f32[2,8,128] in HBM."""
    x = jax.ShapeDtypeStruct(SHAPE, F32)
    call = _call(kernel, x, scratch, entry=entry, compiler_params=compiler_params, grid=grid)
    jax.eval_shape(call, x)


_MESHES: dict[tuple[int, ...], Mesh] = {}


def mesh_of(shape: tuple[int, ...]) -> Mesh:
    if shape not in _MESHES:
        names = ("x",) if len(shape) == 1 else ("x", "y")
        _MESHES[shape] = jax.make_mesh(shape, names)
    return _MESHES[shape]


def trace_on_mesh(
    kernel: Kernel,
    scratch: Sequence[object] = (),
    *,
    mesh_shape: tuple[int, ...] = (4,),
    entry: str = "safedma.pallas_call",
    collective_id: int | None = 0,
) -> None:
    """Trace ``kernel`` inside ``jax.shard_map`` over a 4-device ("x",) or 2x4 ("x", "y") mesh."""
    mesh = mesh_of(mesh_shape)
    spec = P(*mesh.axis_names)
    params = pltpu.CompilerParams(collective_id=collective_id)

    def per_device(x: jax.Array) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return _call(kernel, out, scratch, entry=entry, compiler_params=params)(x)

    global_shape = tuple(n * s for n, s in zip(SHAPE, mesh_shape)) + SHAPE[len(mesh_shape) :]
    x = jax.ShapeDtypeStruct(global_shape, F32, sharding=NamedSharding(mesh, spec))
    f = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )
    jax.eval_shape(f, x)


def assert_mentions(error: pytest.ExceptionInfo[BaseException], *words: str) -> str:
    message = str(error.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing!r}:\n{message}"
    return message


VMEM = safedma.vmem(SHAPE, F32)
DMA = safedma.dma_semaphore()
TWO_DMA = [safedma.dma_semaphore(), safedma.dma_semaphore()]
ENTRIES = ["safedma.pallas_call", "pl.pallas_call(safedma.checked)"]


def ring(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> Any:
    """An unstarted remote copy of x_ref into the right neighbour's o_ref."""
    return (
        safedma.RemoteCopy(x_ref, o_ref, recv_sem)
        .with_send_sem(send_sem)
        .to(safedma.neighbour("x"))
    )
