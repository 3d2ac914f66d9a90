"""pallas_call set-ups shared by the interpret, equivalence and compile tests.

Each ``*_call(kernel, ...)`` wraps one kernel body, from kernels_safedma or
its twin from kernels_pltpu, in the same pallas_call, so the only difference
between the two programs is the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec as P

from tests.support import kernels_safedma

HBM = pl.BlockSpec(memory_space=pl.ANY)
Interpret = bool | pltpu.InterpretParams


def strict_interpret() -> pltpu.InterpretParams:
    """Interpret mode with races fatal and DMAs executed when started."""
    return pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager")


def hbm_call(
    kernel: Callable[..., None], scratch: list[Any], **options: Any
) -> Callable[[jax.Array], jax.Array]:
    """A per-device function running ``kernel`` by ``pl.pallas_call`` on its input's
    shape and dtype, input and output left in HBM."""

    def call(x: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        result: jax.Array = pl.pallas_call(
            kernel,
            out_shape=out,
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            **options,
        )(x)
        return result

    return call


def scale_copy_call(
    kernel: Callable[..., None], x: jax.ShapeDtypeStruct, interpret: Interpret = False
) -> Callable[[jax.Array], jax.Array]:
    scratch = [pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())]
    return hbm_call(kernel, scratch, interpret=interpret)


def reverse_halves_call(
    kernel: Callable[..., None], x: jax.ShapeDtypeStruct, interpret: Interpret = False
) -> Callable[[jax.Array], jax.Array]:
    scratch = [pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA((2,))]
    return hbm_call(kernel, scratch, interpret=interpret)


def double_buffered_call(
    kernel: Callable[..., None], x: jax.ShapeDtypeStruct, interpret: Interpret = False
) -> Callable[[jax.Array], jax.Array]:
    chunk = (kernels_safedma.CHUNK, *x.shape[1:])
    scratch = [
        pltpu.VMEM((2, *chunk), x.dtype),
        pltpu.VMEM(chunk, x.dtype),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.DMA(()),
    ]
    return hbm_call(kernel, scratch, interpret=interpret)


def ring_permute_call(
    kernel: Callable[..., None], mesh: Mesh, axis: str = "x", interpret: Interpret = False
) -> Callable[[jax.Array], jax.Array]:
    """The ring permute over ``axis`` of ``mesh``, as a jitted shard_map."""

    scratch = [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]
    per_device = hbm_call(kernel, scratch, interpret=interpret)
    mapped = jax.shard_map(
        per_device, mesh=mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False
    )
    return jax.jit(mapped)


def example_input(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    return (
        jnp.arange(int(jnp.prod(jnp.array(shape))), dtype=jnp.float32).reshape(shape).astype(dtype)
    )
