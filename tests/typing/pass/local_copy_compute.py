"""Pass: a local HBM -> VMEM -> HBM copy with compute in VMEM, run through safedma.pallas_call.

Must type-check under ``mypy --strict`` and pyright strict with no ``# type: ignore``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing import assert_type

import safedma
from safedma import DataRef, SemRef

# jax.ShapeDtypeStruct.__init__ is unannotated, so calling the class directly is a
# [no-untyped-call] error under --strict (jax 0.10.2 and 0.12). A typed alias avoids it.
ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct


def scale_kernel(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    load = safedma.LocalCopy(x_hbm, buf, sem)
    assert_type(load, safedma.LocalCopy)
    assert_type(load.src, DataRef)
    # None only for a SparseCore push stream (jax 0.12), which has no semaphore.
    assert_type(load.sem, SemRef | None)

    handle = load.start()
    assert_type(handle, safedma.LocalHandle)
    handle.wait()

    tile = buf[...]
    assert_type(tile, jax.Array)
    buf[...] = jnp.tanh(tile) * 2.0 + 1.0

    safedma.LocalCopy(buf, o_hbm, sem).start(priority=1).wait()


@safedma.checked
def scale_kernel_for_plain_pallas(
    x_hbm: DataRef, o_hbm: DataRef, buf: DataRef, sem: SemRef
) -> None:
    """The same body, decorated for use with pl.pallas_call directly."""
    safedma.LocalCopy(x_hbm, buf, sem).start().wait()
    buf[...] = buf[...] + 1.0
    safedma.LocalCopy(buf, o_hbm, sem).start().wait()


def scale(x: jax.Array, *, interpret: bool = True) -> jax.Array:
    call = safedma.pallas_call(
        scale_kernel,
        ShapeDtype(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[safedma.vmem(x.shape, x.dtype), safedma.dma_semaphore()],
        interpret=pltpu.InterpretParams() if interpret else False,
    )
    assert_type(call, safedma.KernelCall[jax.Array])
    out = call(x)
    assert_type(out, jax.Array)
    return out


def scale_pair(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
    """A tuple out_shape gives a Callable returning a tuple of arrays."""

    def pair_kernel(
        x_hbm: DataRef, y_hbm: DataRef, ox: DataRef, oy: DataRef, buf: DataRef, sem: SemRef
    ) -> None:
        safedma.LocalCopy(x_hbm, ox, sem).start().wait()
        safedma.LocalCopy(y_hbm, buf, sem).start().wait()
        buf[...] = buf[...] * 0.5
        safedma.LocalCopy(buf, oy, sem).start().wait()

    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = safedma.pallas_call(
        pair_kernel,
        (ShapeDtype(x.shape, x.dtype), ShapeDtype(y.shape, y.dtype)),
        in_specs=[any_spec, any_spec],
        out_specs=(any_spec, any_spec),
        scratch_shapes=[safedma.vmem(y.shape, np.float32), safedma.dma_semaphore()],
        interpret=pltpu.InterpretParams(),
    )
    assert_type(call, safedma.KernelCall[tuple[jax.Array, jax.Array]])
    return call(x, y)
