"""Unwritten parts of kernel outputs under verify: only what the program reads must be
written, and an unwritten part it does read is named exactly.

* padding rows the wrapper slices off (``out[:n]``, or a transpose/reshape/slice chain),
  and a block copied whole with its padding;
* an output the program never uses (HBM scratch declared as an output and dropped by
  the wrapper, as tpu-inference's fused MoE v2 drops its commit buffers);
* what a caller reads of a kernel's outputs crosses a nested ``jax.jit``.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_unwritten_outputs\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# --------------------------------------------- a padded block copied whole


def _padded_block(return_rows: int) -> Any:
    """Fill the first 5 rows of an 8-row block, forward the whole block (as a ring
    forwards a fixed-size kv block), then return ``return_rows`` rows of the copy."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, slots: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(
            x_ref.at[pl.ds(0, n_ref[0])], slots.at[0, pl.ds(0, n_ref[0])], sem
        )
        c.start()
        c.wait()
        c = pltpu.make_async_copy(slots.at[0], slots.at[1], sem)  # the padding goes too
        c.start()
        c.wait()
        c = pltpu.make_async_copy(slots.at[1, pl.ds(0, return_rows)], o_ref, sem)
        c.start()
        c.wait()

    def fn(n: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((return_rows, 128), F32),
            scratch=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA],
        )(n, x)

    return fn


def test_a_block_copied_whole_with_its_padding_is_clean() -> None:
    assert verify(_padded_block(5), np.array([5], np.int32), _s(8, 128)).dmas == 3


def test_the_padding_reaching_an_output_is_reported_with_the_copy_that_carried_it() -> None:
    with pytest.raises(UnwrittenReadError, match=r"filled it from slots") as caught:
        verify(_padded_block(8), np.array([5], np.int32), _s(8, 128))
    assert len(__import__("re").findall(HERE, str(caught.value))) >= 2, str(caught.value)


ANY = pl.BlockSpec(memory_space=pl.ANY)


# ------------------------------------------------------ an output the program drops


def _scratch_output(keep: bool) -> Any:
    """An HBM output used as scratch: rows 0:8 staged and copied on, 8:16 never
    written. The wrapper drops it (``keep=False``) or returns it."""

    def kernel(x_hbm: Any, o_hbm: Any, stage_hbm: Any, sem: Any) -> None:
        pltpu.sync_copy(x_hbm.at[pl.ds(0, 8)], stage_hbm.at[pl.ds(0, 8)])
        c = pltpu.make_async_copy(stage_hbm.at[pl.ds(0, 8)], o_hbm, sem)
        c.start()
        c.wait()

    def fn(x: jax.Array) -> Any:
        out, stage = pl.pallas_call(
            kernel,
            out_shape=(_s(8, 128), _s(16, 128)),
            in_specs=[ANY],
            out_specs=(ANY, ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)
        return (out, stage) if keep else out

    return fn


def test_an_output_the_program_drops_may_stay_partly_unwritten() -> None:
    assert verify(_scratch_output(keep=False), _s(16, 128)).dmas == 2


def test_the_same_output_returned_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match=r"8:16"):
        verify(_scratch_output(keep=True), _s(16, 128))


# -------------------------------- what the caller reads of a kernel under a nested jit


def _under_jit(use: str) -> Any:
    """The scratch-output kernel of ``_scratch_output`` wrapped in its own ``jax.jit``
    (kernels are often jitted by their module); the caller drops the scratch output,
    keeps only its written rows, or returns it whole."""
    call = _scratch_output(keep=True)
    inner = jax.jit(call)

    def fn(x: jax.Array) -> Any:
        out, stage = inner(x)
        if use == "drop":
            return out
        if use == "slice":
            return out, stage[0:8]
        return out, stage

    return fn


@pytest.mark.parametrize("use", ["drop", "slice"])
def test_what_the_caller_reads_reaches_a_kernel_under_a_nested_jit(use: str) -> None:
    assert verify(_under_jit(use), _s(16, 128)).dmas == 2


def test_an_unwritten_part_returned_through_a_nested_jit_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match=r"8:16"):
        verify(_under_jit("whole"), _s(16, 128))


# --------------------------------------------- padding rows the wrapper drops

N, PAD = 12, 4


def _padded(*, keep: int, chain: bool = False) -> Any:
    """Copy ``x`` (N rows) into an output of N + PAD rows; the wrapper keeps ``keep``."""

    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref.at[pl.ds(0, N)], sem)
        copy.start()
        copy.wait()

    def fn(x: Any) -> Any:
        out = pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=_s(N + PAD, 2, 128),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)
        if chain:  # a layout change first, as a wrapper restoring its public layout does
            out = out.swapaxes(0, 1).reshape(2, (N + PAD) * 128)
            return out[:, : keep * 128]
        return out[:keep]

    return fn


def test_padding_rows_the_wrapper_slices_off_may_stay_unwritten() -> None:
    assert verify(_padded(keep=N), _s(N, 2, 128)).dmas == 1


def test_padding_dropped_after_a_transpose_and_reshape_may_stay_unwritten() -> None:
    assert verify(_padded(keep=N, chain=True), _s(N, 2, 128)).dmas == 1


def test_a_slice_that_keeps_an_unwritten_row_is_caught_naming_the_row() -> None:
    with pytest.raises(UnwrittenReadError, match=HERE) as err:
        verify(_padded(keep=N + 1), _s(N, 2, 128))
    assert "o_ref[12:13, 0:2, 0:128]" in str(err.value)


def test_the_chain_that_keeps_an_unwritten_row_is_caught() -> None:
    with pytest.raises(UnwrittenReadError, match=HERE):
        verify(_padded(keep=N + 1, chain=True), _s(N, 2, 128))


def test_an_output_returned_whole_must_be_written_whole() -> None:
    with pytest.raises(UnwrittenReadError, match=HERE):
        verify(_padded(keep=N + PAD), _s(N, 2, 128))
