"""Pass: barriers by tag, reading the barrier, core meshes and typed scratch in grid specs.

* ``safedma.barrier_semaphore(tag=...)`` takes any hashable tag;
  ``safedma.read`` takes the barrier semaphore and gives a value.
* ``safedma.core_kernel`` (``pl.kernel`` over a TensorCore mesh, checked)
  returns a callable; the core axis names devices.
* ``Scratch[T]`` is accepted by ``pltpu.PrefetchScalarGridSpec(scratch_shapes=...)``.
* ``safedma.pallas_call`` options are one typed declaration (``PallasCallOptions``).

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing_extensions import assert_type

import safedma
from safedma import BarrierSem, DataRef, SemRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct


def tagged_barrier(x_ref: DataRef, o_ref: DataRef) -> None:
    barrier = safedma.barrier_semaphore(tag=("neighbours", 0))
    assert_type(barrier, BarrierSem)
    assert_type(safedma.read(barrier), jax.Array)
    safedma.signal(barrier, device=safedma.neighbour("x"))
    safedma.wait(barrier)


def swap_cores(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    other = safedma.device(core=1 - safedma.my_index("core"))
    copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(other)
    copy.start().wait()


def on_cores(mesh: object, x: jax.Array) -> Any:
    call = safedma.core_kernel(
        swap_cores,
        ShapeDtype(x.shape, x.dtype),
        mesh=mesh,
        scratch_types=[safedma.dma_semaphore(), safedma.dma_semaphore()],
    )
    return call(x)


def gather_kernel(idx: DataRef, x_ref: DataRef, o_ref: DataRef, buf: DataRef, sem: SemRef) -> None:
    safedma.LocalCopy(x_ref.at[idx[0]], buf, sem).start().wait()
    safedma.LocalCopy(buf, o_ref, sem).start().wait()


def gather(idx: jax.Array, x: jax.Array) -> jax.Array:
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[safedma.vmem(x.shape[1:], jnp.float32), safedma.dma_semaphore()],
    )
    options: safedma.PallasCallOptions = {"grid_spec": grid_spec, "name": "gather"}
    call = safedma.pallas_call(gather_kernel, ShapeDtype(x.shape[1:], x.dtype), **options)
    assert_type(call, safedma.KernelCall[jax.Array])
    return call(idx, x)
