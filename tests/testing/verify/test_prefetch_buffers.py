"""A VMEM prefetch buffer handed on with one slot filled under verify: clean while the empty
slot is not read, caught when it is.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify

F32 = jnp.float32
HERE = r"test_prefetch_buffers\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------- a VMEM prefetch buffer handed on with one slot filled


def _prefetch_slot_zero(*, read_slot: int) -> Any:
    """A future fills slot 0 of a two-slot VMEM buffer; a third kernel reads one slot.

    The buffer is storage handed between kernels (a pipeline's prefetched window):
    its empty slot is not an error until something reads it.
    """

    def start_kernel(x_ref: Any, buf_ref: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_ref, buf_ref.at[0], sem).start()

    def done_kernel(x_ref: Any, buf_ref: Any, sem: Any, buf_alias: Any) -> None:
        del buf_alias
        pltpu.make_async_copy(x_ref, buf_ref.at[0], sem).wait()

    def use_kernel(buf_ref: Any, o_ref: Any) -> None:
        pltpu.sync_copy(buf_ref.at[read_slot], o_ref)

    def fn(x: Any) -> Any:
        buf, sem = pl.pallas_call(
            start_kernel,
            in_specs=[ANY],
            out_specs=(VMEM, SEM),
            out_shape=(pltpu.VMEM((2, *x.shape), x.dtype), pltpu.SemaphoreType.DMA(())),
        )(x)
        buf = pl.pallas_call(
            done_kernel,
            in_specs=[ANY, VMEM, SEM],
            out_specs=VMEM,
            out_shape=pltpu.VMEM((2, *x.shape), x.dtype),
            input_output_aliases={1: 0},
        )(x, buf, sem)
        return pl.pallas_call(
            use_kernel,
            in_specs=[VMEM],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(buf)

    return fn


def test_a_vmem_buffer_handed_on_with_an_empty_slot_is_clean() -> None:
    assert verify(_prefetch_slot_zero(read_slot=0), X).dmas == 2  # the future, sync_copy


def test_a_read_of_the_empty_slot_of_a_handed_on_buffer_is_caught() -> None:
    with pytest.raises(UnwrittenReadError, match=HERE):
        verify(_prefetch_slot_zero(read_slot=1), X)
