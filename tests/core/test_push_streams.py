"""Push streams: SparseCore copies without a semaphore (jax 0.12).

On SparseCore a local copy from VMEM to HBM, VMEM_SHARED or SMEM is a push stream, whose
completion the hardware tracks without a destination semaphore; jax lowers ``sem=None``.
The kernel here double-buffers rows through VMEM, pushing each block out with
``sem=None`` and waiting the push before the next gather into that buffer. Anywhere else
(a pull, a scatter, a TensorCore copy, a plain ``pallas_call``) a copy without a
semaphore is still T6, and a raw push fence does not stand for a copy on a semaphore.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import _compat
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, marker_line, raising_lines

SAFE, RAW = True, False
ROWS, BLOCK, LANES = 64, 8, 16
BLOCKS = ROWS // BLOCK

needs_012 = pytest.mark.skipif(
    not _compat.push_streams_supported(), reason="push streams: jax 0.12"
)


def _sc_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- a push stream without a semaphore ---------------------------------------------------


def _push_rows(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, shared: Any, sems: Any) -> None:
        def rows(b: Any) -> Any:
            return pl.ds(b * BLOCK, BLOCK)

        def gather(b: Any, slot: Any) -> None:
            if safe:
                sd.LocalCopy(x_hbm.at[rows(b)], bufs.at[slot], sems.at[slot]).start().wait()
            else:
                pltpu.async_copy(x_hbm.at[rows(b)], bufs.at[slot], sems.at[slot]).wait()

        def push(b: Any, slot: Any) -> None:
            if safe:
                dst = o_hbm.at[rows(b)]
                if seed == "pull_without_semaphore":
                    sd.LocalCopy(dst, bufs.at[slot], None).start()  # PULL
                    return
                sd.LocalCopy(bufs.at[slot], dst, None).start()  # PUSH
            else:
                pltpu.make_async_copy(bufs.at[slot], o_hbm.at[rows(b)]).start()

        def push_done(b: Any, slot: Any) -> None:
            if safe:
                pushed = sd.LocalCopy(bufs.at[slot], o_hbm.at[rows(b)], None)  # PUSH DONE
                pushed.started_elsewhere().wait()
            else:
                pltpu.make_async_copy(bufs.at[slot], o_hbm.at[rows(b)]).wait()

        @pl.loop(0, BLOCKS)
        def _(b: Any) -> None:
            slot = b % 2

            @pl.when(b >= 2)
            def _() -> None:
                if seed != "push_never_waited":
                    push_done(b - 2, slot)

            gather(b, slot)
            bufs[slot] = bufs[slot] * 2
            push(b, slot)

        for b in (BLOCKS - 2, BLOCKS - 1):
            if seed != "push_never_waited":
                push_done(b, b % 2)
        if safe and seed == "scatter_without_semaphore":
            idx = jnp.arange(BLOCK, dtype=jnp.int32)
            sd.LocalCopy(bufs.at[0], shared.at[idx], None).start().wait()  # SCATTER

    return kernel


def _push(safe: bool, seed: str | None = None) -> Any:
    def run(x: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        entry: Any = sd.core_kernel if safe else pl.kernel
        return entry(
            _push_rows(safe, seed),
            jax.ShapeDtypeStruct((ROWS, LANES), jnp.int32),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((2, BLOCK, LANES), jnp.int32),
                pltpu.VMEM_SHARED((BLOCK, LANES), jnp.int32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        )(x)

    return jax.jit(run)


X = jax.ShapeDtypeStruct((ROWS, LANES), jnp.int32)


@needs_012
def test_push_stream_without_a_semaphore_matches_raw() -> None:
    # Before the fix: MissingSemaphoreError (T6) for the push, which jax asks to write so.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # jax's push-stream warning would mean a semaphore
        assert_same_mosaic(_push(SAFE), _push(RAW), X, mesh=_sc_mesh())
    text = mosaic_text(_push(SAFE), X, mesh=_sc_mesh())
    # The push: enqueue_dma with no semaphore operand (source, target only).
    assert "operandSegmentSizes = array<i32: 1, 0, 1, 0, 0, 0, 0>" in text


@pytest.mark.skipif(_compat.push_streams_supported(), reason="this jax has push streams")
def test_push_stream_without_a_semaphore_on_jax_0_10_names_the_version() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE), X, mesh=_sc_mesh())
    # The first copy without a semaphore traced: the wait for block b - 2's push.
    assert line_in(_push_rows, "# PUSH DONE") in raising_lines(err, __file__)
    assert "jax 0.12 lets a SparseCore push stream go without one" in str(err.value)
    assert jax.__version__ in str(err.value)


@needs_012
def test_pull_without_a_semaphore_is_t6_naming_the_memory_spaces() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE, "pull_without_semaphore"), X, mesh=_sc_mesh())
    assert line_in(_push_rows, "# PULL") in raising_lines(err, __file__)
    text = str(err.value)
    assert "o_hbm.at[...] int32[8,16] (hbm) -> bufs.at[...] int32[8,16] (vmem)" in text
    assert "from VMEM to HBM, VMEM_SHARED or SMEM" in text and "safedma.dma_semaphore()" in text


@needs_012
def test_scatter_without_a_semaphore_is_t6() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE, "scatter_without_semaphore"), X, mesh=_sc_mesh())
    assert line_in(_push_rows, "# SCATTER") in raising_lines(err, __file__)
    assert "scatter or gather" in str(err.value)


@needs_012
def test_push_never_waited_is_t7_at_its_start() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_push(SAFE, "push_never_waited"), X, mesh=_sc_mesh())
    assert f"{__file__}:{line_in(_push_rows, '# PUSH')}" in str(err.value)


def _tensor_core_push(x: jax.Array) -> jax.Array:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x_hbm, buf, sem).start().wait()
        sd.LocalCopy(buf, o_hbm, None).start().wait()  # TC PUSH

    out: jax.Array = sd.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


def test_a_tensor_core_copy_without_a_semaphore_is_t6_naming_tensor_cores() -> None:
    # VMEM -> ANY is a push stream by its memory spaces, but sd.pallas_call runs on a
    # TensorCore, whose lowering rejects sem=None ("Local DMA semaphore cannot be None").
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(jax.jit(_tensor_core_push), X, mesh=abstract_mesh((1,), ("x",), tpu="v5p"))
    assert line_in(_tensor_core_push, "# TC PUSH") in raising_lines(err, __file__)
    if _compat.push_streams_supported():
        assert "this kernel runs on TensorCores" in str(err.value)


def _v5p() -> Any:
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- a raw push-stream fence next to safedma copies ----------------------------------------


def _fenced(seed: str | None = None) -> Any:
    """A raw push stream waited by jax 0.12's fence (``make_async_copy(buf, o).wait()``,
    no semaphore: jax's ``emit_pipeline(..., output_wait_read_only=True)`` ends with one)
    next to a safedma copy on a DMA semaphore."""

    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, staged: Any, sem: Any) -> None:
        staged_copy = sd.LocalCopy(x_hbm, staged, sem).start()  # STAGED
        if seed != "staged_wait_dropped":
            staged_copy.wait()
        sd.sync_copy(x_hbm, buf)
        pltpu.make_async_copy(buf, o_hbm).start()
        pltpu.make_async_copy(buf, o_hbm).wait()

    def run(x: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        return sd.core_kernel(
            kernel,
            jax.ShapeDtypeStruct((LANES,), jnp.int32),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((LANES,), jnp.int32),
                pltpu.VMEM((LANES,), jnp.int32),
                pltpu.SemaphoreType.DMA,
            ],
        )(x)

    return jax.jit(run)


@needs_012
@pytest.mark.filterwarnings("ignore::Warning")  # sd.sync_copy's push stream (jax's notice)
def test_a_raw_push_fence_does_not_stand_for_a_copy_on_a_semaphore() -> None:
    # Before the fix: the fence, a dma_wait with no semaphore, counted as a wait on every
    # semaphore, so the dropped wait passed trace time.
    x = jax.ShapeDtypeStruct((LANES,), jnp.int32)
    mosaic_text(_fenced(), x, mesh=_sc_mesh())
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_fenced("staged_wait_dropped"), x, mesh=_sc_mesh())
    assert f"{__file__}:{line_in(_fenced, '# STAGED')}" in str(err.value)


def test_under_a_plain_pallas_call_a_copy_without_a_semaphore_is_t6() -> None:
    # Before: an sd.checked body under pl.pallas_call had no known core type, so the push
    # by memory spaces passed trace time and failed jax's TensorCore lowering ("Local DMA
    # semaphore cannot be None on TensorCore"). jax lowers pl.pallas_call for TensorCores.
    @sd.checked
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x_hbm, buf, sem).start().wait()
        sd.LocalCopy(buf, o_hbm, None).start().wait()  # RAW ENTRY PUSH

    def run(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(jax.jit(run), X, mesh=_v5p())
    assert marker_line(__file__, "# RAW ENTRY PUSH") in raising_lines(err, __file__)
    if _compat.push_streams_supported():
        assert "this kernel runs on TensorCores (a pallas_call" in str(err.value)
