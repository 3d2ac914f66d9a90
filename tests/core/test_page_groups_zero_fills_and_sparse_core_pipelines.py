"""Trace-time checks on the DMA patterns of paged attention, grouped matmuls and
SparseCore pipelines, on kernels written here.

* a helper class holding the page copies of one block (optional scale copies on the same
  semaphore, ``None`` operands and ``None`` scratch when unquantized), started in
  ``pl.when`` prefetch branches and waited in the main body on rebuilt copies
  (``started_elsewhere()``), the buffer slot kept in a scalar-prefetch ref;
* the next block prefetched inside a ``lax.while_loop`` body and the current one waited
  there (a ragged paged attention);
* zero-fill copies started with ``priority=1`` in ``fori_loop`` bodies and waited once by
  their total size (``wait_bytes``) after an ``emit_pipeline`` (a grouped matmul): an
  ``emit_pipeline`` in the body no longer hides an unwaited copy ;
* a SparseCore ``core_kernel`` whose ``emit_pipeline`` has a traced grid and no specs,
  starts one copy per row in Python loops and waits them in order in a ``pl.loop``;
* an ``emit_pipeline`` used as the ``pallas_call`` body, three outputs.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False
PAGES, PAGE, D, BLOCK_PAGES = 8, 8, 128, 2


def _tpu_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- a page group prefetched in one grid step and waited in the next ---------------------


class _PageGroup:
    """The copies of one block's pages (and their scales), all on one semaphore."""

    def __init__(
        self,
        safe: bool,
        pages: Any,
        scales: Any,
        buf: Any,
        scale_buf: Any,
        sem: Any,
        table: Any,
        first: Any,
    ) -> None:
        make = sd.LocalCopy if safe else pltpu.make_async_copy
        self.safe = safe
        self.copies = [make(pages.at[table[first + i]], buf.at[i], sem) for i in range(BLOCK_PAGES)]
        if scales is not None and scale_buf is not None:
            self.copies += [
                make(scales.at[table[first + i]], scale_buf.at[i], sem) for i in range(BLOCK_PAGES)
            ]

    def start(self) -> None:
        for copy in self.copies:
            copy.start()

    def wait(self, *, drop: bool = False) -> None:
        if drop:
            return
        for copy in self.copies:
            (copy.started_elsewhere() if self.safe else copy).wait()


def _paged(safe: bool, *, drop_waits: bool = False) -> Callable[..., None]:
    def kernel(
        table: Any,
        slot_ref: Any,
        q_ref: Any,
        pages: Any,
        scales: Any,
        o_ref: Any,
        buf: Any,
        scale_buf: Any,
        sems: Any,
    ) -> None:
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = slot_ref[0]

        def group(block: Any, at: Any) -> _PageGroup:
            return _PageGroup(
                safe,
                pages,
                scales,
                buf.at[at],
                scale_buf.at[at] if scale_buf is not None else None,
                sems.at[at],
                table,
                block * BLOCK_PAGES,
            )

        @pl.when(i == 0)
        def _first() -> None:
            group(i, slot).start()  # first prefetch

        @pl.when(i + 1 < n)
        def _next() -> None:
            following = jnp.where(slot == 0, 1, 0)
            group(i + 1, following).start()
            slot_ref[0] = following

        group(i, slot).wait(drop=drop_waits)
        loaded = buf.at[slot][...].reshape(-1, D)
        if scale_buf is not None:
            loaded = loaded * scale_buf.at[slot][...].reshape(-1, D)
        o_ref[...] = q_ref[...] + loaded[: q_ref.shape[0]]

    return kernel


def _paged_call(kernel: Callable[..., None], entry: Any, *, quantized: bool) -> Any:
    blocks = PAGES // BLOCK_PAGES
    spec = pl.BlockSpec((PAGE, D), lambda i, *_: (i, 0))

    def run(table: jax.Array, q: jax.Array, pages: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            in_specs=[spec, ANY, ANY if quantized else None],
            out_specs=spec,
            grid=(blocks,),
            scratch_shapes=[
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32),
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32) if quantized else None,
                sd.dma_semaphores(2),
            ],
        )
        slot = jnp.zeros((1,), jnp.int32)
        call = entry(kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid_spec=grid_spec)
        return call(table, slot, q, pages, pages if quantized else None)

    return jax.jit(run)


def _paged_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    blocks = PAGES // BLOCK_PAGES
    return (
        jax.ShapeDtypeStruct((PAGES,), jnp.int32),
        jax.ShapeDtypeStruct((blocks * PAGE, D), jnp.float32),
        jax.ShapeDtypeStruct((PAGES, PAGE, D), jnp.float32),
    )


@pytest.mark.parametrize("quantized", [False, True])
def test_page_group_prefetched_in_a_branch_waited_next_step_matches_raw(quantized: bool) -> None:
    assert_same_mosaic(
        _paged_call(_paged(SAFE), sd.pallas_call, quantized=quantized),
        _paged_call(_paged(RAW), pl.pallas_call, quantized=quantized),
        *_paged_args(),
    )


def test_page_group_waits_dropped_names_the_helper_and_each_caller() -> None:
    broken = _paged_call(_paged(SAFE, drop_waits=True), sd.pallas_call, quantized=True)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        jax.eval_shape(broken, *_paged_args())
    message = str(err.value)
    start = line_in(_PageGroup.start, "copy.start()")
    first = line_in(_paged, "# first prefetch")
    assert f"{__file__}:{start} (called from {__file__}:{first}" in message, message
    # Both prefetches (page and scale copies of each) are listed, none waited: one line
    # per start site and buffers, with the count of the page loop's copies.
    assert message.count("wait() never called") == 2 * 2, message
    assert message.count(f"  - {BLOCK_PAGES} copies of LocalCopy pages.at[...]") == 2, message
    assert message.count(f"  - {BLOCK_PAGES} copies of LocalCopy scales.at[...]") == 2, message
    assert f"{2 * 2 * BLOCK_PAGES} copies were started" in message, message


# --- the next block prefetched inside a while_loop body -----------------------------------


def _while_prefetch(safe: bool, *, wait_on_other: bool = False) -> Callable[..., None]:
    make = sd.LocalCopy if safe else pltpu.make_async_copy

    def kernel(count_ref: Any, pages: Any, o_ref: Any, buf: Any, sems: Any, others: Any) -> None:
        count = count_ref[0]

        def copy(block: Any, slot: Any, on: Any) -> Any:
            return make(
                pages.at[pl.ds(block * BLOCK_PAGES, BLOCK_PAGES)], buf.at[slot], on.at[slot]
            )

        copy(0, 0, sems).start()

        def more(state: tuple[Any, Any]) -> Any:
            return state[0] < count

        def step(state: tuple[Any, Any]) -> tuple[Any, Any]:
            block, slot = state
            following = jax.lax.select(slot == 0, 1, 0)

            @pl.when(block + 1 < count)
            def _prefetch() -> None:
                copy(block + 1, following, sems).start()

            current = copy(block, slot, others if wait_on_other else sems)
            (current.started_elsewhere() if safe else current).wait()
            o_ref[...] += buf.at[slot][...].reshape(o_ref.shape)
            return block + 1, following

        jax.lax.while_loop(more, step, (0, 0))

    return kernel


def _while_call(kernel: Callable[..., None], entry: Any) -> Any:
    def run(count: jax.Array, pages: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[ANY],
            out_specs=pl.BlockSpec((BLOCK_PAGES * PAGE, D), lambda i, *_: (0, 0)),
            grid=(1,),
            scratch_shapes=[
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32),
                sd.dma_semaphores(2),
                sd.dma_semaphores(2),
            ],
        )
        shape = jax.ShapeDtypeStruct((BLOCK_PAGES * PAGE, D), jnp.float32)
        return entry(kernel, out_shape=shape, grid_spec=grid_spec)(count, pages)

    return jax.jit(run)


def _while_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((PAGES, PAGE, D), jnp.float32),
    )


def test_prefetch_inside_a_while_loop_body_matches_raw() -> None:
    assert_same_mosaic(
        _while_call(_while_prefetch(SAFE), sd.pallas_call),
        _while_call(_while_prefetch(RAW), pl.pallas_call),
        *_while_args(),
        mesh=_tpu_mesh(),
    )


def test_while_loop_wait_on_the_other_semaphore_array_is_t7() -> None:
    broken = _while_call(_while_prefetch(SAFE, wait_on_other=True), sd.pallas_call)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_while_args(), mesh=_tpu_mesh())
    message = str(err.value)
    prefetch = line_in(_while_prefetch, "copy(block + 1, following, sems).start()")
    assert f"{__file__}:{prefetch}" in message, message
    assert "on the semaphore the copy was started on" in message


# --- zero fill by priority copies in fori_loops, one wait by size, an emit_pipeline -----

SUB, ROWS, COLS, ZERO_ROWS = 8, 64, 256, 16


def _zero_fill(
    safe: bool, *, drop_wait: bool = False, priority: int = 1, raw_pipeline: bool = False
) -> Callable[..., None]:
    def kernel(offset_ref: Any, x_ref: Any, o_ref: Any, zero_ref: Any, sems: Any) -> None:
        zero_ref[...] = jnp.zeros_like(zero_ref)
        zero = zero_ref.reshape(-1, SUB, 128)
        out = o_ref.reshape(-1, SUB, o_ref.shape[-1])
        rows = zero.shape[0]
        end = offset_ref[0] // SUB

        def fill(i: Any, total: Any) -> Any:
            start = i * rows
            size = jnp.minimum(start + rows, end) - start
            for col in range(0, out.shape[-1], 128):
                src, dst = zero.at[pl.ds(0, size)], out.at[pl.ds(start, size), :, col : col + 128]
                if safe:
                    sd.LocalCopy(src=src, dst=dst, sem=sems.at[0]).start(priority=priority)  # USER
                else:
                    pltpu.make_async_copy(src_ref=src, dst_ref=dst, sem=sems.at[0]).start(
                        priority=1
                    )
            return total + size

        total = jax.lax.fori_loop(0, pl.cdiv(end, rows), fill, 0)
        pipeline = (sd.emit_pipeline if safe and not raw_pipeline else pltpu.emit_pipeline)(
            _copy_block,
            grid=(ROWS // SUB - end,),
            in_specs=(pl.BlockSpec((None, SUB, COLS), lambda g: (g + end, 0, 0)),),
            out_specs=pl.BlockSpec((None, SUB, COLS), lambda g: (g + end, 0, 0)),
        )
        pipeline(x_ref.reshape(-1, SUB, COLS), out)
        if drop_wait:
            return
        if safe:
            sd.wait_bytes(sems.at[0], out.at[pl.ds(0, total)])
        else:
            pltpu.make_async_copy(
                out.at[pl.ds(0, total)], out.at[pl.ds(0, total)], sems.at[0]
            ).wait()

    return kernel


def _copy_block(x_block: Any, o_block: Any) -> None:
    o_block[...] = x_block[...]


def _zero_call(kernel: Callable[..., None], entry: Any) -> Any:
    def run(offset: jax.Array, x: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.HBM),
            scratch_shapes=[pltpu.VMEM((ZERO_ROWS, 128), jnp.float32), sd.dma_semaphores(1)],
        )
        shape = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)
        return entry(kernel, out_shape=shape, grid_spec=grid_spec)(offset, x)

    return jax.jit(run)


def _zero_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32))


def test_priority_zero_fill_waited_by_size_after_a_pipeline_matches_raw() -> None:
    assert_same_mosaic(
        _zero_call(_zero_fill(SAFE), sd.pallas_call),
        _zero_call(_zero_fill(RAW), pl.pallas_call),
        *_zero_args(),
        mesh=_tpu_mesh(),
    )


@pytest.mark.parametrize("pipeline", ["safedma", "raw"])
def test_an_emit_pipeline_does_not_hide_an_unwaited_copy(pipeline: str) -> None:
    # the pipeline's own waits (on semaphores it allocates) stood for every
    # semaphore of the body, so dropping the zero fill's wait passed at trace time.
    kernel = _zero_fill(SAFE, drop_wait=True, raw_pipeline=pipeline == "raw")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_zero_call(kernel, sd.pallas_call), *_zero_args(), mesh=_tpu_mesh())
    message = str(err.value)
    assert f"{__file__}:{line_in(_zero_fill, '# USER')}" in message, message
    # a size read at run time is shown as '?', not as a tracer's repr.
    assert "float32[?,8,128]" in message and "Tracer" not in message, message


def test_zero_fill_priority_2_is_rejected_at_the_users_line() -> None:
    broken = _zero_call(_zero_fill(SAFE, priority=2), sd.pallas_call)
    with pytest.raises(sd.PriorityError) as err:
        mosaic_text(broken, *_zero_args(), mesh=_tpu_mesh())
    assert line_in(_zero_fill, "# USER") in raising_lines(err, __file__)


# --- SparseCore: a pipeline with a traced grid, row copies waited in order ---------------

SIMD, LANES, COL, OUT, HID = 8, 128, 256, 64, 256


def _sc_gather(safe: bool, *, forget_bitcast: bool = False, drop_row_waits: bool = False) -> Any:
    make = sd.LocalCopy if safe else pltpu.make_async_copy

    def kernel(
        end_ref: Any,
        x_hbm: Any,
        idx_hbm: Any,
        o_hbm: Any,
        end_buf: Any,
        rows_buf: Any,
        idx_buf: Any,
        sems: Any,
    ) -> None:
        recv, send = sems.at[0], sems.at[1]
        cores = jax.lax.axis_size(("core", "subcore"))
        copies = [make(end_ref.at[:1], end_buf.at[:1], recv)]
        if safe:
            for handle in [c.start() for c in copies]:
                handle.wait()
        else:
            jax.tree.map(lambda c: c.start(), copies)
            jax.tree.map(lambda c: c.wait(), copies)
        blocks = pl.cdiv(end_buf[...][0], SIMD * cores)

        def inner() -> None:
            row0 = (pl.program_id(0) * cores + pl.program_id(1)) * SIMD
            (sd.sync_copy if safe else pltpu.sync_copy)(idx_hbm.at[pl.ds(row0, SIMD)], idx_buf)
            idx = idx_buf[...]
            src = x_hbm if forget_bitcast else x_hbm.bitcast(jnp.uint32)
            out = o_hbm.bitcast(jnp.uint32)
            for col in range(0, COL, LANES):
                for row in range(SIMD):
                    row_copy = make(  # USER
                        src.at[idx[row], pl.ds(col, LANES)],
                        rows_buf.at[row, pl.ds(col, LANES)],
                        recv,
                    )
                    row_copy.start()  # STARTED

            @pl.loop(0, COL, step=LANES)
            def _(col: Any) -> None:
                one = make(src.at[0, :LANES], rows_buf.at[0, :LANES], recv)
                for _row in range(0 if drop_row_waits else SIMD):
                    (one.started_elsewhere() if safe else one).wait()
                for row in range(SIMD):
                    make(
                        rows_buf.at[row, pl.ds(col, LANES)],
                        out.at[row0 + row, pl.ds(col, LANES)],
                        send,
                    ).start()

            one = make(rows_buf.at[0, :LANES], out.at[0, :LANES], send)
            for _col in range(0, COL, LANES):
                for _row in range(SIMD):
                    (one.started_elsewhere() if safe else one).wait()

        (sd.emit_pipeline if safe else pltpu.emit_pipeline)(
            inner,
            grid=(blocks, cores),
            core_axis_name=("core", "subcore"),
            dimension_semantics=(pltpu.ARBITRARY, pltpu.PARALLEL),
        )()

    return kernel


def _sc_call(kernel: Any, entry: Any) -> Any:
    from jax.experimental.pallas import tpu_sc as plsc

    def run(end: jax.Array, x: jax.Array, idx: jax.Array) -> Any:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        scratch = [
            pltpu.VMEM((SIMD,), jnp.int32),
            pltpu.VMEM((SIMD, COL), jnp.uint32),
            pltpu.VMEM((SIMD,), jnp.int32),
            sd.dma_semaphores(2),
        ]
        params = pltpu.CompilerParams(use_tc_tiling_on_sc=True, needs_layout_passes=False)
        out = jax.ShapeDtypeStruct((OUT, HID), jnp.float32)
        return entry(kernel, out, mesh=mesh, scratch_types=scratch, compiler_params=params)(
            end, x, idx
        )

    return jax.jit(run)


def _sc_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((OUT, HID), jnp.float32),
        jax.ShapeDtypeStruct((OUT,), jnp.int32),
    )


def test_sparse_core_pipeline_with_a_traced_grid_matches_raw() -> None:
    assert_same_mosaic(
        _sc_call(_sc_gather(SAFE), sd.core_kernel),
        _sc_call(_sc_gather(RAW), pl.kernel),
        *_sc_args(),
        mesh=_tpu_mesh(),
    )


def test_sparse_core_forgotten_bitcast_is_t2_at_the_users_line() -> None:
    broken = _sc_call(_sc_gather(SAFE, forget_bitcast=True), sd.core_kernel)
    with pytest.raises(sd.CopyDtypeMismatchError, match="float32 and uint32") as err:
        mosaic_text(broken, *_sc_args(), mesh=_tpu_mesh())
    assert line_in(_sc_gather, "# USER") in raising_lines(err, __file__)


def test_sparse_core_ordered_waits_dropped_is_t7_in_the_pipeline_body() -> None:
    broken = _sc_call(_sc_gather(SAFE, drop_row_waits=True), sd.core_kernel)
    # A copy the body leaves in flight on a kernel's semaphore is the kernel's
    # to wait after the pipeline; nothing waits it there either, so the kernel reports it.
    with pytest.raises(sd.CopyNeverWaitedError, match="in the body 'inner'") as err:
        mosaic_text(broken, *_sc_args(), mesh=_tpu_mesh())
    message = str(err.value)
    assert f"{__file__}:{line_in(_sc_gather, '# STARTED')}" in message, message
    # refs the pipeline body closes over keep the kernel's names.
    assert "x_hbm.at[...] uint32[128] -> rows_buf.at[...] uint32[128]" in message, message
    # The row loop's copies share one start line and buffers: one line with their count
    # , not one line per row.
    assert message.count("wait() never called") == 1, message
    assert f"  - {SIMD * COL // LANES} copies of LocalCopy x_hbm.at[...]" in message, message


# --- an emit_pipeline as the pallas_call body, three outputs ------------------------------

T, S, E, TB = 64, 4, 128, 16


def _three_outputs(pallas_call: Any, emit_pipeline: Any) -> Any:
    def body(x_ref: Any, w_ref: Any, *refs: Any) -> None:
        outs = iter(refs)
        s = x_ref[...].sum(axis=-1) * w_ref[0, 0]
        for ref, value in zip(
            outs, (s, s * 2, jnp.broadcast_to(s[:, :, None], (TB, S, S))), strict=True
        ):
            ref[...] = value

    def rows(*shape: int) -> pl.BlockSpec:
        return pl.BlockSpec((TB, *shape), lambda i: (i, *(0,) * len(shape)))

    pipeline = emit_pipeline(
        body,
        grid=(T // TB,),
        in_specs=(rows(S, E), pl.BlockSpec((8, 128), lambda i: (0, 0))),
        out_specs=(rows(S), rows(S), rows(S, S)),
        dimension_semantics=(pltpu.PARALLEL,),
    )
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)

    def run(x: jax.Array, w: jax.Array) -> Any:
        shapes = (
            jax.ShapeDtypeStruct((T, S), jnp.float32),
            jax.ShapeDtypeStruct((T, S), jnp.float32),
            jax.ShapeDtypeStruct((T, S, S), jnp.float32),
        )
        first, second, third = pallas_call(
            pipeline, out_shape=shapes, in_specs=[hbm] * 2, out_specs=[hbm] * 3
        )(x, w)
        return first + second + third.sum(-1)

    return jax.jit(run)


def test_emit_pipeline_as_the_kernel_body_with_three_outputs_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((T, S, E), jnp.float32)
    w = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert_same_mosaic(
        _three_outputs(sd.pallas_call, sd.emit_pipeline),
        _three_outputs(pl.pallas_call, pltpu.emit_pipeline),
        x,
        w,
        mesh=_tpu_mesh(),
    )
