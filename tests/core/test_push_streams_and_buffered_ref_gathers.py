"""SparseCore DMA the typed API could not express.

* a push stream without a semaphore (jax 0.12): on SparseCore a local copy from VMEM to
  HBM, VMEM_SHARED or SMEM is a push stream, whose completion the hardware tracks without
  a destination semaphore; jax warns when one is given ("pass ``sem=None``") and lowers
  ``sem=None``. ``sd.LocalCopy`` required a semaphore (T6). The kernel here double-buffers
  rows through VMEM: each block gathered in on a DMA semaphore, doubled, and pushed out with
  ``sem=None``; the push from a buffer is waited (``started_elsewhere()``) before the next
  gather into that buffer, the last two after the loop.

* a per-token row gather as a ``BufferedRef`` subclass (tokamax's DeepSeek-V4 RoPE,
  ``experimental/tpu/rope/pallas_mosaic_tpu_kernel.py``, ``CosSinRef``): a frozen,
  registered dataclass built from ``BufferedRef.create(...)``'s fields; its ``copy_in``
  takes a tuple of refs (the table and the SMEM positions) as its source and starts one row
  copy per token (``pl.loop(..., unroll=True)``) into the window slot on the slot's
  semaphore, its ``wait_in`` waits the slot by size; the allocations are made by
  ``pl.with_scoped(allocations=...)`` and handed to ``emit_pipeline``, with an
  ``input_output`` buffer for the aliased activations.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import dataclasses
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
from safedma.testing import (
    RaceDetectedError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_text,
    verify,
)
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


# --- a per-token row gather as a BufferedRef subclass ------------------------------------

T, TILE, WIDTH, POSITIONS = 32, 8, 128, 64


def _row_gather_ref(safe: bool, seed: str | None = None) -> Any:
    base: Any = pltpu.BufferedRef

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class RowGather(base):  # type: ignore[misc]
        tile_n: int = dataclasses.field(metadata=dict(static=True))

        @classmethod
        def make(cls, spec: Any, dtype: Any, tile_n: int) -> Any:
            made = pltpu.BufferedRef.create(
                spec=spec,
                dtype_or_type=dtype,
                buffer_type=pltpu.BufferType.INPUT,
                buffer_count=2,
                grid_rank=1,
                use_lookahead=False,
            )
            fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(base)}
            return cls(tile_n=tile_n, **fields)

        def copy_in(self, src_ref: Any, grid_indices: Any) -> None:
            table, positions = src_ref
            slot = self.current_copy_in_slot
            sem, dest, step = self.sem_recvs.at[slot], self.window_ref.at[slot], grid_indices[0]
            width = WIDTH // 2 if seed == "half_rows" else WIDTH

            @pl.loop(0, self.tile_n, unroll=True)
            def _(i: Any) -> None:
                row = table.at[positions[step * self.tile_n + i], pl.ds(0, width)]
                if safe:
                    sd.LocalCopy(row, dest.at[i, :], sem).start()  # ROW
                else:
                    pltpu.make_async_copy(row, dest.at[i, :], sem).start()

        def wait_in(self, src_ref: Any, grid_indices: Any) -> None:
            slot = self.current_wait_in_slot
            window = self.window_ref.at[slot]
            if seed == "wait_in_dropped":
                return
            if safe:
                sd.wait_bytes(self.sem_recvs.at[slot], window)
            else:
                pltpu.make_async_copy(window, window, self.sem_recvs.at[slot]).wait()

    return RowGather


def _rope(safe: bool, seed: str | None = None) -> Any:
    row_gather = _row_gather_ref(safe, seed)

    def body(x_ref: Any, cos_sin_ref: Any) -> None:
        x_ref[...] = x_ref[...] * cos_sin_ref[...]

    def kernel(positions: Any, x_hbm: Any, table_hbm: Any, out_hbm: Any) -> None:
        del x_hbm  # aliased to the output, read and written through it
        spec = pl.BlockSpec((TILE, WIDTH), lambda i: (i, 0), memory_space=pltpu.VMEM)
        allocations = (
            pltpu.BufferedRef.input_output(spec, jnp.float32, buffer_count=2),
            row_gather.make(spec, jnp.float32, TILE),
        )
        emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline
        pipeline = emit(body, grid=(T // TILE,), in_specs=[spec, spec], out_specs=[])

        @pl.with_scoped(allocations=allocations)
        def run_pipeline(allocations: Any) -> None:
            pipeline(out_hbm, (table_hbm, positions), allocations=allocations)

        run_pipeline()

    entry: Any = sd.pallas_call if safe else pl.pallas_call

    def run(positions: jax.Array, x: jax.Array, table: jax.Array) -> Any:
        hbm = pl.BlockSpec(memory_space=pltpu.HBM)
        return entry(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, in_specs=(hbm, hbm), out_specs=hbm
            ),
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(disable_bounds_checks=True),
        )(positions, x, table)

    return jax.jit(run)


ROPE_ARGS = (
    jax.ShapeDtypeStruct((T,), jnp.int32),
    jax.ShapeDtypeStruct((T, WIDTH), jnp.float32),
    jax.ShapeDtypeStruct((POSITIONS, WIDTH), jnp.float32),
)


def _v5p() -> Any:
    return abstract_mesh((1,), ("x",), tpu="v5p")


def test_row_gather_buffered_ref_matches_raw() -> None:
    assert_same_mosaic(_rope(SAFE), _rope(RAW), *ROPE_ARGS, mesh=_v5p())
    text = mosaic_text(_rope(SAFE), *ROPE_ARGS, mesh=_v5p())
    assert text.count("enqueue_dma") >= TILE  # the unrolled row copies are there


def test_row_of_half_the_window_is_t1_at_the_row_copy() -> None:
    with pytest.raises(sd.CopyShapeMismatchError) as err:
        mosaic_text(_rope(SAFE, "half_rows"), *ROPE_ARGS, mesh=_v5p())
    assert line_in(_row_gather_ref, "# ROW") in raising_lines(err, __file__)
    assert "table_hbm.at[...] float32[64]" in str(err.value)


def test_wait_in_dropped_passes_trace_time_and_verify_reports_the_race() -> None:
    # A miss at trace time: the row copies are on a
    # semaphore pl.with_scoped allocates, and the kernel-scope check counts any raw wait on
    # a semaphore allocated inside a block (here the pipeline's waits on the activations'
    # semaphores) as one on every such semaphore. verify tells the semaphores apart.
    mosaic_text(_rope(SAFE, "wait_in_dropped"), *ROPE_ARGS, mesh=_v5p())
    values = (
        jnp.arange(T, dtype=jnp.int32) % POSITIONS,
        jnp.ones((T, WIDTH), jnp.float32),
        jnp.ones((POSITIONS, WIDTH), jnp.float32),
    )
    if not _compat.push_streams_supported():
        # jax 0.10.2's emit_pipeline: verify reports a race between the input_output
        # buffer's copy-in and copy-out of one slot, raw and safedma alike (not analysed
        # here). The trace-time part above holds.
        return
    verify(_rope(SAFE), *values, mesh=_v5p())
    with pytest.raises(RaceDetectedError) as err:
        verify(_rope(SAFE, "wait_in_dropped"), *values, mesh=_v5p())
    assert f"{__file__}:{line_in(_row_gather_ref, '# ROW')}" in str(err.value)


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
