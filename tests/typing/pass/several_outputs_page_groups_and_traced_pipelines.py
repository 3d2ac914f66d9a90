"""Pass: shapes found in production DMA kernels (paged attention, grouped matmuls).

* ``safedma.pallas_call`` with two, three or four output shapes returns as many arrays,
  so the result may be annotated ``tuple[jax.Array, jax.Array]`` or unpacked;
* ``safedma.emit_pipeline`` with a traced grid dimension (a block count read in the
  kernel), and used as the ``pallas_call`` body;
* a page-group helper holding a list of ``LocalCopy`` with optional scale copies
  (``DataRef | None`` parameters, ``None`` scratch), started in one grid step and waited
  through ``started_elsewhere()`` in the next;
* one generic pytree dataclass for an operand's refs and its scratch, and zero-fill copies
  started with ``priority=1`` in a ``fori_loop`` body, waited once by size.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Generic, TypeVar

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing import assert_type

import safedma
from safedma import DataRef, SemArray, SemRef

from _typed_jax import fori_loop, zeros

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
ANY = pl.BlockSpec(memory_space=pl.ANY)
T = TypeVar("T")


def two_outputs(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    def body(x_ref: DataRef, o_ref: DataRef, l_ref: DataRef, sem: SemRef) -> None:
        safedma.LocalCopy(x_ref, o_ref, sem).start().wait()
        safedma.LocalCopy(x_ref, l_ref, sem).start().wait()

    like = ShapeDtype(x.shape, x.dtype)
    call = safedma.pallas_call(
        body,
        (like, like),
        in_specs=[ANY],
        out_specs=(ANY, ANY),
        scratch_shapes=[safedma.dma_semaphore()],
    )
    assert_type(call, safedma.KernelCall[tuple[jax.Array, jax.Array]])
    outs: tuple[jax.Array, jax.Array] = call(x)
    return outs


def three_outputs(x: jax.Array) -> jax.Array:
    def body(x_ref: DataRef, a: DataRef, b: DataRef, c: DataRef, sem: SemRef) -> None:
        for out in (a, b, c):
            safedma.LocalCopy(x_ref, out, sem).start().wait()

    like = ShapeDtype(x.shape, x.dtype)
    first, second, third = safedma.pallas_call(
        body,
        (like, like, like),
        in_specs=[ANY],
        out_specs=(ANY, ANY, ANY),
        scratch_shapes=[safedma.dma_semaphore()],
    )(x)
    assert_type(third, jax.Array)
    return first + second + third


def pipeline_with_a_traced_grid(end_ref: DataRef, x_hbm: DataRef, o_hbm: DataRef) -> None:
    blocks = pl.cdiv(end_ref[0], 8)

    def copy_block(x_block: DataRef, o_block: DataRef) -> None:
        o_block[...] = x_block[...]

    def rows(i: jax.Array) -> tuple[jax.Array, int]:
        return (i, 0)

    spec = pl.BlockSpec((8, 128), rows)
    safedma.emit_pipeline(copy_block, grid=(blocks,), in_specs=(spec,), out_specs=spec)(
        x_hbm, o_hbm
    )


class PageGroup:
    """The page copies of one block, and their scales when quantized, on one semaphore."""

    def __init__(
        self,
        pages: DataRef,
        scales: DataRef | None,
        buf: DataRef,
        scale_buf: DataRef | None,
        sem: SemRef,
        table: DataRef,
        first: jax.Array,
    ) -> None:
        self.copies = [
            safedma.LocalCopy(pages.at[table[first + i]], buf.at[i], sem) for i in range(2)
        ]
        if scales is not None and scale_buf is not None:
            self.copies += [
                safedma.LocalCopy(scales.at[table[first + i]], scale_buf.at[i], sem)
                for i in range(2)
            ]

    def start(self) -> None:
        for copy in self.copies:
            copy.start()

    def wait(self) -> None:
        for copy in self.copies:
            copy.started_elsewhere().wait()


def paged(
    table: DataRef,
    slot_ref: DataRef,
    pages: DataRef,
    scales: DataRef | None,
    o_ref: DataRef,
    buf: DataRef,
    scale_buf: DataRef | None,
    sems: SemArray,
) -> None:
    i = pl.program_id(0)
    slot = slot_ref[0]

    @pl.when(i == 0)
    def _first() -> None:
        PageGroup(pages, scales, buf.at[slot], None, sems.at[slot], table, i * 2).start()

    PageGroup(pages, scales, buf.at[slot], scale_buf, sems.at[slot], table, i * 2).wait()
    o_ref[...] = buf.at[slot][...]


def paged_call(table: jax.Array, slot: jax.Array, pages: jax.Array) -> jax.Array:
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        in_specs=[ANY, None],
        out_specs=ANY,
        grid=(2,),
        scratch_shapes=[safedma.vmem((2, 2, 8, 128), jnp.float32), None, safedma.dma_semaphores(2)],
    )
    out: jax.Array = safedma.pallas_call(
        paged, ShapeDtype((2, 8, 128), jnp.float32), grid_spec=grid_spec
    )(table, slot, pages, None)
    return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metadata(Generic[T]):
    """One pytree class for the scratch declaration and the refs the kernel receives."""

    offsets: T
    groups: T


def zero_fill(o_ref: DataRef, meta: Metadata[DataRef], zero_ref: DataRef, sems: SemArray) -> None:
    zero_ref[...] = zeros((8, 128), jnp.float32)
    end = meta.offsets[0] // 8

    def fill(i: jax.Array, total: jax.Array) -> jax.Array:
        size = jnp.minimum((i + 1) * 8, end) - i * 8
        safedma.LocalCopy(
            src=zero_ref.at[pl.ds(0, size)], dst=o_ref.at[pl.ds(i * 8, size)], sem=sems.at[0]
        ).start(priority=1)
        return total + size

    total = fori_loop(0, pl.cdiv(end, 8), fill, jnp.int32(0))
    safedma.wait_bytes(sems.at[0], o_ref.at[pl.ds(0, total)])


def zero_fill_call() -> jax.Array:
    scratch = [
        Metadata(offsets=safedma.smem((4,), jnp.int32), groups=safedma.smem((4,), jnp.int32)),
        safedma.vmem((8, 128), jnp.float32),
        safedma.dma_semaphores(1),
    ]
    out: jax.Array = safedma.pallas_call(
        zero_fill, ShapeDtype((64, 128), jnp.float32), out_specs=ANY, scratch_shapes=scratch
    )()
    return out
