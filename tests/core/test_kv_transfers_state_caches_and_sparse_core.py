"""Trace-time checks on the DMA patterns of KV-cache transfers, host copies, state caches
and SparseCore kernels, on kernels written here.

* a chunked copy as a DMA future (vLLM tpu-inference's ``distributed/kv_transfer.py``): a
  start kernel with four scalar-prefetched tables starts, in a ``pl.loop`` whose trip count
  is read from SMEM, one copy per chunk (offsets and length read from SMEM) into the
  aliased destination, on the semaphore it returns; its refs after the inputs come as
  ``*args`` and the semaphore is ``args[-1]``; a wait kernel takes the semaphore, rebuilds
  each chunk's copy and waits it;
* a copy to pinned host memory (the same file's ``copy_to_host``): ``pl.HOST`` specs, the
  copy started and waited at once on a semaphore scoped with ``pl.run_scoped(body,
  pltpu.SemaphoreType.DMA)``;
* a per-token state cache double-buffered across the steps of an ``emit_pipeline``
  (tpu-inference's ``gdn/v2/gdn_decode_kernel.py``): the first block's rows started
  before the pipeline, the next block's prefetched under one ``pl.when`` per token, the
  current block waited by size, rows stored back per token and drained by size two steps
  later and after the pipeline; the SMEM index table and both semaphore arrays passed to
  the body through ``scratches=``; ``pl.BoundedSlice`` blocks.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import (
    RaceDetectedError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_text,
    verify,
)
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
HBM = pl.BlockSpec(memory_space=pltpu.HBM)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- a chunked copy as a DMA future -----------------------------------------------------

ROWS = 64


def _chunks_start(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        num: Any,
        src_off: Any,
        dst_off: Any,
        sizes: Any,
        src: Any,
        dep: Any,
        dst_in: Any,
        *args: Any,
    ) -> None:
        del dep  # only orders this kernel after the previous transfer
        sem = args[-1]  # with a scratch semaphore added (seed), args[-1] is that scratch

        @pl.loop(0, num[0])
        def _(i: Any) -> None:
            n = sizes[i]
            dst = dst_in.at[pl.ds(dst_off[i], n)]
            if seed == "whole_block_destination":
                dst = dst_in.at[pl.ds(dst_off[i], 16)]
            if safe:
                sd.LocalCopy(src.at[pl.ds(src_off[i], n)], dst, sem).start()  # CHUNK
            else:
                pltpu.make_async_copy(src.at[pl.ds(src_off[i], n)], dst, sem).start()

    return kernel


def _chunks_done(safe: bool) -> Callable[..., None]:
    def kernel(
        num: Any, src_off: Any, dst_off: Any, sizes: Any, src: Any, dep: Any, *args: Any
    ) -> None:
        del dep
        dst_in, sem = args[0], args[1]

        @pl.loop(0, num[0])
        def _(i: Any) -> None:
            n = sizes[i]
            copy_src, copy_dst = src.at[pl.ds(src_off[i], n)], dst_in.at[pl.ds(dst_off[i], n)]
            if safe:
                sd.LocalCopy(copy_src, copy_dst, sem).started_elsewhere().wait()
            else:
                pltpu.make_async_copy(copy_src, copy_dst, sem).wait()

    return kernel


def _transfer(safe: bool, seed: str | None = None) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call
    params = pltpu.CompilerParams(has_side_effects=True)

    def run(*operands: jax.Array) -> jax.Array:
        *tables, src, dep, dst = operands
        scratch = [pltpu.SemaphoreType.DMA(())] if seed == "scratch_semaphore" else []
        out, sem = entry(
            _chunks_start(safe, seed),
            out_shape=(jax.ShapeDtypeStruct(dst.shape, dst.dtype), pltpu.SemaphoreType.DMA(())),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4,
                grid=(1,),
                in_specs=(HBM, HBM, HBM),
                out_specs=(HBM, SEM),
                scratch_shapes=scratch,
            ),
            input_output_aliases={6: 0},
            compiler_params=params,
        )(*tables, src, dep, dst)
        done: jax.Array = entry(
            _chunks_done(safe),
            out_shape=jax.ShapeDtypeStruct(dst.shape, dst.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4, grid=(1,), in_specs=[HBM, HBM, HBM, SEM], out_specs=HBM
            ),
            input_output_aliases={6: 0},
            compiler_params=params,
        )(*tables, src, dep, out, sem)
        return done

    return jax.jit(run)


def _transfer_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    table = jax.ShapeDtypeStruct((16,), jnp.int32)
    cache = jax.ShapeDtypeStruct((ROWS, 8, 128), jnp.bfloat16)
    return (jax.ShapeDtypeStruct((1,), jnp.int32), table, table, table, cache, cache, cache)


def test_chunked_transfer_future_matches_raw() -> None:
    assert_same_mosaic(_transfer(SAFE), _transfer(RAW), *_transfer_args())


def test_chunked_transfer_on_a_scratch_semaphore_is_t7_at_the_chunks_start() -> None:
    # A scratch semaphore added to the start kernel shifts the author's ``args[-1]``: the
    # chunks are started on the scratch, which dies with the kernel, not on the returned one.
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_transfer(SAFE, "scratch_semaphore"), *_transfer_args())
    text = str(err.value)
    assert f"{__file__}:{line_in(_chunks_start, '# CHUNK')}" in text
    assert "started_elsewhere().wait()" in text


def test_chunk_written_as_a_whole_block_is_t1_at_the_users_line() -> None:
    # A traced length on the source, 16 rows on the destination: Mosaic rejects it on TPU.
    with pytest.raises(sd.CopyShapeMismatchError) as err:
        mosaic_text(_transfer(SAFE, "whole_block_destination"), *_transfer_args())
    assert line_in(_chunks_start, "# CHUNK") in raising_lines(err, __file__)


# --- a copy to pinned host memory -------------------------------------------------------


def _to_host(safe: bool, space: Any, seed: str | None = None) -> Any:
    def kernel(src: Any, host_in: Any, host_out: Any) -> None:
        del host_in
        if safe:

            def body(sem: sd.SemRef) -> None:
                handle = sd.LocalCopy(src, host_out, sem).start()  # TO HOST
                if seed != "wait_dropped":
                    handle.wait()

            sd.run_scoped(body, sd.dma_semaphore())
        else:

            def raw_body(sem: Any) -> None:
                pltpu.async_copy(src, host_out, sem).wait()

            pl.run_scoped(raw_body, pltpu.SemaphoreType.DMA)

    entry: Any = sd.pallas_call if safe else pl.pallas_call

    def run(src: jax.Array, dest: jax.Array) -> jax.Array:
        out: jax.Array = entry(
            kernel,
            in_specs=[ANY, pl.BlockSpec(memory_space=space)],
            out_specs=pl.BlockSpec(memory_space=space),
            input_output_aliases={1: 0},
            out_shape=jax.ShapeDtypeStruct(dest.shape, dest.dtype),
        )(src, dest)
        return out

    return jax.jit(run)


@pytest.mark.parametrize("space", [pltpu.HBM, pl.HOST], ids=["hbm", "host"])
def test_copy_to_host_matches_raw(space: Any) -> None:
    x = jax.ShapeDtypeStruct((ROWS, 8, 128), jnp.bfloat16)
    assert_same_mosaic(_to_host(SAFE, space), _to_host(RAW, space), x, x, mesh=_v5p())


def test_copy_to_host_never_waited_is_t7() -> None:
    x = jax.ShapeDtypeStruct((ROWS, 8, 128), jnp.bfloat16)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_to_host(SAFE, pl.HOST, "wait_dropped"), x, x, mesh=_v5p())
    assert f"{__file__}:{line_in(_to_host, '# TO HOST')}" in str(err.value)


# --- a state cache double-buffered across pipeline steps --------------------------------

T, H, D, STATES, BT = 32, 2, 128, 16, 4


def _state_cache(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def start(src: Any, dst: Any, sem: Any) -> None:
        if safe:
            sd.LocalCopy(src, dst, sem).start()  # STARTED
        else:
            pltpu.make_async_copy(src, dst, sem).start()

    def drain(sem: Any, rows: Any) -> None:
        if safe:
            sd.wait_bytes(sem, rows)
        else:
            pltpu.make_async_copy(rows, rows, sem).wait()

    def kernel(
        v_hbm: Any,
        idx_ref: Any,
        dist_ref: Any,
        state_init: Any,
        o_hbm: Any,
        state_hbm: Any,
        h_bufs: Any,
        load_sems: Any,
        store_sems: Any,
    ) -> None:
        del state_init  # aliased to state_hbm
        end = dist_ref[0]
        nb = pl.cdiv(end, BT)

        def token_map(i: Any) -> tuple[Any, int, int]:
            return (pl.ds(i * BT, jnp.minimum(BT, end - i * BT)), 0, 0)

        spec = pl.BlockSpec((pl.BoundedSlice(BT), H, D), token_map)
        for t in range(BT):

            @pl.when(t < end)
            def _(t: int = t) -> None:
                start(
                    state_hbm.at[pl.ds(idx_ref[t], 1)], h_bufs.at[0, pl.ds(t, 1)], load_sems.at[0]
                )

        def body(v_ref: Any, o_ref: Any, bufs: Any, idx: Any, lsems: Any, ssems: Any) -> None:
            b = pl.program_id(0)
            t0 = b * BT
            n = jnp.minimum(BT, end - t0)
            cur, nxt = b % 2, (b + 1) % 2
            n_next = jnp.maximum(jnp.minimum(BT, end - t0 - BT), 0)
            reuse_first = seed == "stores_drained_before_reuse"
            if reuse_first:
                # The previous block's stores read the buffer the prefetch is about to fill.
                last_len = jnp.where(b >= 1, jnp.minimum(BT, end - jnp.maximum(t0 - BT, 0)), 0)

                @pl.when(last_len > 0)
                def _() -> None:
                    drain(ssems.at[nxt], bufs.at[nxt, pl.ds(0, last_len)])

            for t in range(BT):

                @pl.when(t < n_next)
                def _(t: int = t) -> None:
                    row = state_hbm.at[pl.ds(idx[t0 + BT + t], 1)]
                    start(row, bufs.at[nxt, pl.ds(t, 1)], lsems.at[nxt])  # PREFETCH

            if seed == "current_block_waited_on_the_store_semaphores":
                drain(ssems.at[cur], bufs.at[cur, pl.ds(0, n)])
            elif seed != "current_block_wait_dropped":
                drain(lsems.at[cur], bufs.at[cur, pl.ds(0, n)])
            prev = jnp.where(b >= 2, jnp.minimum(BT, end - jnp.maximum((b - 2) * BT, 0)), 0)

            if seed != "store_drain_dropped" and not reuse_first:

                @pl.when(prev > 0)
                def _() -> None:
                    drain(ssems.at[cur], bufs.at[cur, pl.ds(0, prev)])

            o_ref[...] = v_ref[...]
            for t in range(BT):

                @pl.when(t < n)
                def _(t: int = t) -> None:
                    row = state_hbm.at[pl.ds(idx[t0 + t], 1)]
                    start(bufs.at[cur, pl.ds(t, 1)], row, ssems.at[cur])  # STORE

        emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline
        emit(body, grid=(nb,), in_specs=[spec], out_specs=spec)(
            v_hbm, o_hbm, scratches=[h_bufs, idx_ref, load_sems, store_sems]
        )
        last, other = (nb - 1) % 2, nb % 2
        drain(store_sems.at[last], h_bufs.at[last, pl.ds(0, jnp.minimum(BT, end - (nb - 1) * BT))])
        on_other = jnp.where(nb >= 2, jnp.minimum(BT, end - (nb - 2) * BT), 0)
        if seed == "stores_drained_before_reuse":
            on_other = jnp.int32(0)  # drained in the pipeline's last step

        @pl.when(on_other > 0)
        def _() -> None:
            drain(store_sems.at[other], h_bufs.at[other, pl.ds(0, on_other)])

    return kernel


def _decode(safe: bool, seed: str | None = None) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call

    def run(v: jax.Array, idx: jax.Array, dist: jax.Array, state: jax.Array) -> Any:
        return entry(
            _state_cache(safe, seed),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY, SMEM, SMEM, ANY],
                out_specs=[ANY, ANY],
                grid=(1,),
                scratch_shapes=[
                    pltpu.VMEM((2, BT, H, D, D), jnp.float32),
                    pltpu.SemaphoreType.DMA((2,)),
                    pltpu.SemaphoreType.DMA((2,)),
                ],
            ),
            input_output_aliases={0: 0, 3: 1},
            out_shape=[
                jax.ShapeDtypeStruct((T, H, D), jnp.float32),
                jax.ShapeDtypeStruct((STATES, H, D, D), jnp.float32),
            ],
            compiler_params=pltpu.CompilerParams(disable_bounds_checks=True),
            name="decoding_gdn",
        )(v, idx, dist, state)

    return jax.jit(run)


def _decode_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((T, H, D), jnp.float32),
        jax.ShapeDtypeStruct((T,), jnp.int32),
        jax.ShapeDtypeStruct((3,), jnp.int32),
        jax.ShapeDtypeStruct((STATES, H, D, D), jnp.float32),
    )


def test_state_cache_across_pipeline_steps_matches_raw() -> None:
    # Before the fix: T7 for the rows started before the pipeline, which its body waits.
    assert_same_mosaic(_decode(SAFE), _decode(RAW), *_decode_args(), mesh=_v5p())


@pytest.mark.parametrize(
    ("seed", "kernel", "called_from"),
    [
        # The pipeline body is checked as a kernel of its own, first: its prefetches and
        # stores are waited in its later steps (any slot of the same array counts). A copy
        # it leaves in flight on a kernel's semaphore is then the kernel's to wait after the
        # pipeline; the kernel waits no load semaphore there, and says so.
        ("current_block_wait_dropped", "kernel", "# PREFETCH"),
        ("current_block_waited_on_the_store_semaphores", "kernel", "# PREFETCH"),
    ],
)
def test_state_cache_rows_never_waited_are_t7_at_the_start_line(
    seed: str, kernel: str, called_from: str
) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_decode(SAFE, seed), *_decode_args(), mesh=_v5p())
    text = str(err.value)
    assert text.startswith(f"kernel {kernel!r}"), text
    started = f"{__file__}:{line_in(_state_cache, '# STARTED')}"
    assert f"{started} (called from {__file__}:{line_in(_state_cache, called_from)}" in text, text
    assert "started_elsewhere().wait() in a later loop iteration or grid step" in text
    assert "in the body 'body', started at" in text, text


def test_state_cache_store_drain_dropped_in_the_body_is_left_to_verify() -> None:
    # This was once rejected at trace time in the body. The kernel drains both store
    # slots after the pipeline (by size, a traced slot), so with at most two blocks every
    # store is waited: the program is correct on some paths, and trace time rejects only
    # what is wrong on every path. Wrong with more blocks: verify's.
    assert "tpu.wait_dma" in mosaic_text(
        _decode(SAFE, "store_drain_dropped"), *_decode_args(), mesh=_v5p()
    )


# --- the mechanism, on a small kernel -----------------------------------------------------


def _prologue_then_pipeline(wait_in_body: str) -> Any:
    """A copy started before an ``emit_pipeline`` and waited at every step of its body
    (``wait_in_body``: how), next to a copy on another semaphore that nothing waits."""

    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any, other: Any) -> None:
        sd.LocalCopy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[0]).start()  # PROLOGUE
        if wait_in_body == "leak":
            sd.LocalCopy(x_hbm.at[pl.ds(8, 8)], buf, other).start()  # LEAKED

        def body(x_ref: Any, o_ref: Any, b_ref: Any, s_ref: Any) -> None:
            slot = pl.program_id(0) % 2
            if wait_in_body == "wait_bytes":
                sd.wait_bytes(s_ref.at[slot], b_ref)
            else:
                sd.LocalCopy(
                    x_hbm.at[pl.ds(0, 8)], b_ref, s_ref.at[slot]
                ).started_elsewhere().wait()
            o_ref[...] = x_ref[...] + b_ref[...]

        block = pl.BlockSpec((8, 128), lambda i: (i, 0))
        sd.emit_pipeline(body, grid=(4,), in_specs=[block], out_specs=block)(
            x_hbm, o_hbm, scratches=[buf, sems]
        )

    x = jax.ShapeDtypeStruct((32, 128), jnp.float32)
    return sd.pallas_call(
        kernel,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=x,
        scratch_shapes=[
            pltpu.VMEM((8, 128), jnp.float32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA(()),
        ],
    ), x


@pytest.mark.parametrize("how", ["wait_bytes", "started_elsewhere"])
def test_a_wait_in_a_pipeline_body_stands_for_a_copy_started_before_it(how: str) -> None:
    call, x = _prologue_then_pipeline(how)
    assert "tpu.wait_dma" in mosaic_text(call, x, mesh=_v5p())  # before the fix: T7 (prologue)


def test_a_wait_in_a_pipeline_body_does_not_cover_another_semaphore() -> None:
    call, x = _prologue_then_pipeline("leak")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(call, x, mesh=_v5p())
    text = str(err.value)
    assert f"{__file__}:{line_in(_prologue_then_pipeline, '# LEAKED')}" in text
    assert f":{line_in(_prologue_then_pipeline, '# PROLOGUE')}" not in text


# --- a SparseCore histogram: copies kept as handles, a zero fill, a scatter-add ---------

W, WINDOWS, HIST = 16, 2, 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _TopKScratch:
    """The kernel's scratch as one dataclass, flattened for ``pl.kernel`` and rebuilt in the
    body (tokamax's ``TopKScratch``); its semaphore is the type ``pltpu.SemaphoreType.DMA``."""

    sem: Any
    keys: Any
    values: Any
    histogram: Any
    zeros: Any
    indices: Any
    global_histogram: Any


def _histogram(safe: bool, with_values: bool = True, seed: str | None = None) -> Any:
    """tokamax's SparseCore top-k (``experimental/tpu/topk``): per window the keys and
    (optionally: ``None`` otherwise) the values copied in on one semaphore and waited through
    their descriptors; in a ``while_loop`` over digits the leader starts zeroing the shared
    histogram on the last window (the descriptor dropped) and waits it, rebuilt, in nested
    ``pl.when`` blocks; between two subcore barriers every subcore scatter-adds its histogram
    into the shared one (``sync_copy(..., add=True)`` at ``global.at[indices]``)."""

    def start(src: Any, dst: Any, sem: Any) -> Any:
        if safe:
            return sd.LocalCopy(src, dst, sem).start()  # WINDOW
        return pltpu.async_copy(src, dst, sem)

    def sync(src: Any, dst: Any, add: bool = False) -> None:
        if safe:
            sd.sync_copy(src, dst, add=add)  # SYNC
        else:
            pltpu.sync_copy(src, dst, add=add)

    def kernel(keys_ref: Any, values_ref: Any, out_keys: Any, out_hist: Any, *flat: Any) -> None:
        from jax.experimental.pallas import tpu_sc as plsc

        s = tree.unflatten(flat)
        leader = jax.lax.axis_index("subcore") == 0
        sync(keys_ref.at[pl.ds(0, HIST)], s.indices)

        @pl.loop(0, WINDOWS)
        def _(window: Any) -> None:
            last = window == WINDOWS - 1
            keys_copy = start(keys_ref.at[pl.ds(window * W, W)], s.keys, s.sem)
            vals_copy = None
            if with_values:
                vals_copy = start(values_ref.at[pl.ds(window * W, W)], s.values, s.sem)
            keys_copy.wait()
            del keys_copy
            if vals_copy is not None:
                vals_copy.wait()
            del vals_copy

            def digit_step(digit: Any) -> Any:
                @pl.when(leader & last)
                def _() -> None:
                    start(s.zeros, s.global_histogram, s.sem)  # ZERO FILL

                s.histogram[...] = s.keys[...] + s.values[...]

                @pl.when(last)
                def _() -> None:
                    if seed != "zero_fill_wait_dropped":

                        @pl.when(leader)
                        def _() -> None:
                            if safe:
                                zero_fill = sd.LocalCopy(s.zeros, s.global_histogram, s.sem)
                                zero_fill.started_elsewhere().wait()
                            else:
                                pltpu.make_async_copy(s.zeros, s.global_histogram, s.sem).wait()

                    plsc.subcore_barrier()
                    target = s.global_histogram.at[s.indices]
                    if seed == "scatter_add_to_a_window":
                        target = s.global_histogram
                    sync(s.histogram, target, add=True)
                    plsc.subcore_barrier()
                    sync(s.global_histogram, s.histogram)

                return digit - 1

            jax.lax.while_loop(lambda d: d >= 0, digit_step, jnp.int32(1))

        sync(s.keys, out_keys)
        sync(s.histogram, out_hist)

    scratch = _TopKScratch(
        sem=pltpu.SemaphoreType.DMA,
        keys=pltpu.VMEM((W,), jnp.int32),
        values=pltpu.VMEM((W,), jnp.int32),
        histogram=pltpu.VMEM((HIST,), jnp.int32),
        zeros=pltpu.VMEM((HIST,), jnp.int32),
        indices=pltpu.VMEM((HIST,), jnp.int32),
        global_histogram=pltpu.VMEM_SHARED((HIST,), jnp.int32),
    )
    flat_scratch, tree = jax.tree.flatten(scratch)

    def run(keys: jax.Array, values: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        entry: Any = sd.core_kernel if safe else pl.kernel
        out = (jax.ShapeDtypeStruct((W,), jnp.int32), jax.ShapeDtypeStruct((HIST,), jnp.int32))
        return entry(kernel, out, mesh=mesh, scratch_types=flat_scratch, name="topk_multitile")(
            keys, values
        )

    return jax.jit(run)


def _histogram_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((W * WINDOWS,), jnp.int32),) * 2


@pytest.mark.parametrize("with_values", [True, False], ids=["values", "no_values"])
def test_sparse_core_histogram_matches_raw(with_values: bool) -> None:
    # Before the fix: T5 (UnsupportedDmaError) for the scatter-add, which SparseCore lowers.
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(
        _histogram(SAFE, with_values), _histogram(RAW, with_values), *_histogram_args(), mesh=mesh
    )
    text = mosaic_text(_histogram(SAFE, with_values), *_histogram_args(), mesh=mesh)
    assert "add = true" in text


def test_scatter_add_to_a_window_is_t5_naming_the_sparse_core_form() -> None:
    with pytest.raises(sd.UnsupportedDmaError) as err:
        mosaic_text(
            _histogram(SAFE, seed="scatter_add_to_a_window"),
            *_histogram_args(),
            mesh=abstract_mesh((), (), tpu="v5p"),
        )
    assert line_in(_histogram, "# SYNC") in raising_lines(err, __file__)
    assert "dst.at[indices]" in str(err.value) and "acc[...] += buf[...]" in str(err.value)


def test_zero_fill_wait_dropped_is_t7_at_its_start() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(
            _histogram(SAFE, seed="zero_fill_wait_dropped"),
            *_histogram_args(),
            mesh=abstract_mesh((), (), tpu="v5p"),
        )
    text = str(err.value)
    # The refs are named by the kernel's parameters (``flat[4] -> flat[6]``: the author
    # flattens the scratch dataclass for pl.kernel); the lines name the user's call.
    started = f"{__file__}:{line_in(_histogram, '# WINDOW')}"
    assert f"{started} (called from {__file__}:{line_in(_histogram, '# ZERO FILL')}" in text


# --- an MPMD SparseCore reduce-scatter step: a scalar-subcore body and a vector one -------

SC_N = 16


def _mpmd_bodies(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    """jax's ``tpu_sparsecore_pallas_distributed_test.py`` (``test_mpmd_reduce_scatter``),
    on one device: ``pl.kernel`` with a body per mesh (scalar subcores, vector subcores);
    keyword scratch, each REGULAR semaphore placed on one mesh (``@ mesh``); the scalar
    body moves the data with DMAs on ``run_scoped`` semaphores (keyword, the semaphore
    types themselves) and hands each round to the vector body with a signal addressed by
    ``{"subcore": 0}``; the vector body gather-adds the received rows
    (``sync_copy(recv.at[iota], vmem, add=True)``) and signals back ``{"core": 0}``."""

    def go_scs(x_hbm: Any, out_ref: Any, *, send: Any, recv: Any, to_scs: Any, to_vec: Any) -> None:
        del out_ref

        def body(send_sem: Any, recv_sem: Any) -> None:
            if safe:
                sd.LocalCopy(x_hbm, send, send_sem).start().wait()
            else:
                pltpu.async_copy(x_hbm, send, send_sem).wait()

            @pl.loop(1, 3)
            def _(i: Any) -> None:
                if safe:
                    handle = sd.LocalCopy(send, recv, recv_sem).start()  # ROUND
                    if seed != "round_wait_dropped":
                        handle.wait()
                    sd.signal(to_vec, device=sd.device(subcore=0))
                    sd.wait(to_scs, 1)
                else:
                    pltpu.async_copy(send, recv, recv_sem).wait()
                    pl.semaphore_signal(to_vec, device_id={"subcore": 0})
                    pl.semaphore_wait(to_scs, 1)

        if safe:
            sd.run_scoped(body, send_sem=sd.dma_semaphore(), recv_sem=sd.dma_semaphore())
        else:
            pl.run_scoped(body, send_sem=pltpu.SemaphoreType.DMA, recv_sem=pltpu.SemaphoreType.DMA)

    def go_vec(x_hbm: Any, out_ref: Any, *, send: Any, recv: Any, to_scs: Any, to_vec: Any) -> None:
        sync: Any = sd.sync_copy if safe else pltpu.sync_copy

        def body(vmem: Any, iota: Any) -> None:
            sync(x_hbm, iota)

            @pl.loop(1, 3)
            def _(i: Any) -> None:
                sync(x_hbm, vmem)
                if safe:
                    sd.wait(to_vec, 1)
                else:
                    pl.semaphore_wait(to_vec, 1)
                sync(recv.at[iota], vmem, add=True)
                sync(vmem, send)
                if safe:
                    sd.signal(to_scs, device=sd.device(core=0))
                else:
                    pl.semaphore_signal(to_scs, device_id={"core": 0})

            sync(vmem, out_ref)

        scoped: Any = sd.run_scoped if safe else pl.run_scoped
        scoped(body, pltpu.VMEM((SC_N,), jnp.int32), pltpu.VMEM((SC_N,), jnp.int32))

    return go_scs, go_vec


def _mpmd(safe: bool, seed: str | None = None) -> Any:
    def run(x: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        scs = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)
        vec = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        scratch = dict(
            send=pltpu.VMEM_SHARED((SC_N,), jnp.int32),
            recv=pltpu.VMEM_SHARED((SC_N,), jnp.int32),
            to_scs=pltpu.SemaphoreType.REGULAR(()) @ scs,
            to_vec=pltpu.SemaphoreType.REGULAR(()) @ vec,
        )
        out = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
        params = pltpu.CompilerParams(needs_layout_passes=False)
        bodies = list(_mpmd_bodies(safe, seed))
        if safe:
            call = sd.core_kernel(
                bodies, out, mesh=[scs, vec], scratch_types=scratch, compiler_params=params
            )
        else:
            call = pl.kernel(
                body=bodies,
                out_type=out,
                mesh=[scs, vec],
                scratch_types=scratch,
                compiler_params=params,
            )
        return call(x)

    return jax.jit(run)


# jax 0.10.2 cannot export an MPMD kernel whose device ids cross core types ("Cannot export
# MPMD kernels to a different core type when forward compatibility is enabled"), raw or not.
needs_012 = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12), reason="jax 0.12 MPMD export"
)


@needs_012
@pytest.mark.filterwarnings("ignore::Warning")  # 0.12's SparseCore push-stream notice
def test_mpmd_sparse_core_bodies_match_raw() -> None:
    # Before the fix: sd.core_kernel took one body (a list was wrapped as one kernel).
    x = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(_mpmd(SAFE), _mpmd(RAW), x, mesh=mesh)


@needs_012
@pytest.mark.filterwarnings("ignore::Warning")
def test_mpmd_body_checked_as_its_own_kernel() -> None:
    x = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_mpmd(SAFE, "round_wait_dropped"), x, mesh=abstract_mesh((), (), tpu="v5p"))
    assert str(err.value).startswith("kernel 'go_scs'")
    assert f"{__file__}:{line_in(_mpmd_bodies, '# ROUND')}" in str(err.value)


# --- verify on the state cache: the prefetch overwrites a buffer a store still reads ------


def _decode_values(end: int) -> tuple[jax.Array, ...]:
    return (
        jnp.zeros((T, H, D), jnp.float32),
        jnp.arange(T, dtype=jnp.int32) % STATES,  # distinct rows for the first STATES tokens
        jnp.array([end, 0, 0], jnp.int32),
        jnp.zeros((STATES, H, D, D), jnp.float32),
    )


@pytest.mark.parametrize("safe", [SAFE, RAW], ids=["safedma", "raw"])
def test_state_cache_prefetch_races_with_the_previous_blocks_store(safe: bool) -> None:
    # The author's order: at step b the next block is prefetched into buffer (b+1) % 2 while
    # block b-1's stores, started from that buffer, are waited only at step b+1.
    with pytest.raises(RaceDetectedError) as err:
        verify(_decode(safe), *_decode_values(10), mesh=_v5p())
    text = str(err.value)
    assert (
        f"called at test_kv_transfers_state_caches_and_sparse_core.py:{line_in(_state_cache, '# PREFETCH')}"
        in text
    ), text
    assert (
        f"called at test_kv_transfers_state_caches_and_sparse_core.py:{line_in(_state_cache, '# STORE')}"
        in text
    ), text


@pytest.mark.parametrize("safe", [SAFE, RAW], ids=["safedma", "raw"])
@pytest.mark.parametrize("end", [3, 10, 16])
def test_state_cache_stores_drained_before_reuse_verify(safe: bool, end: int) -> None:
    verify(_decode(safe, "stores_drained_before_reuse"), *_decode_values(end), mesh=_v5p())
