"""Pass: shapes found in production DMA kernels (vLLM tpu-inference, SparseCore kernels).

* a chunked copy as a DMA future (a KV-cache transfer): a start kernel with four
  scalar-prefetched tables that starts, in a ``pl.loop`` whose trip count is read from
  SMEM, one copy per chunk of a length read from SMEM on the semaphore it returns (the
  copies write the aliased input, not the output ref); a wait kernel that rebuilds each chunk's copy and waits it through ``started_elsewhere()``;
* a copy to pinned host memory (``pl.HOST`` specs), started and waited at once on a
  scoped semaphore;
* a per-token state cache double-buffered across the steps of an ``emit_pipeline`` with
  bounded (``pl.BoundedSlice``) blocks: the first block's rows started before the
  pipeline, the next block's prefetched under one ``pl.when`` per token, the current one
  waited by size (``wait_bytes``), the rows stored back per token and drained by size
  two steps later and after the pipeline; the SMEM index table and both semaphore arrays
  passed to the body through ``scratches=``;
* a SparseCore histogram: copies kept as handles (or ``None``) and waited, a zero fill
  started in one ``pl.when`` and waited through ``started_elsewhere()`` in another, a
  scatter-add ``sync_copy(hist, shared.at[indices], add=True)`` (an index ref in ``.at``);
  a scratch list holding the semaphore type itself;
* MPMD: ``core_kernel`` with a list of bodies and a list of meshes, each body signalling
  the other mesh's REGULAR semaphore by a device id of that mesh's axis, keyword scratch
  and keyword ``run_scoped`` semaphores, a gather-add from ``recv.at[iota]``.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import DataRef, SemArray, SemRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
HBM = pl.BlockSpec(memory_space=pltpu.HBM)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
BT, H, D = 4, 2, 128


# --- a chunked copy as a DMA future -----------------------------------------------------


def chunks_start(
    num: DataRef,
    src_off: DataRef,
    dst_off: DataRef,
    sizes: DataRef,
    src_hbm: DataRef,
    dep_hbm: DataRef,
    dst_in: DataRef,
    dst_out: DataRef,
    sem: SemRef,
) -> None:
    del dep_hbm, dst_out

    @pl.loop(0, num[0])
    def _(i: jax.Array) -> None:
        n = sizes[i]
        src = src_hbm.at[pl.ds(src_off[i], n)]
        safedma.LocalCopy(src, dst_in.at[pl.ds(dst_off[i], n)], sem).start()


def chunks_done(
    num: DataRef,
    src_off: DataRef,
    dst_off: DataRef,
    sizes: DataRef,
    src_hbm: DataRef,
    dep_hbm: DataRef,
    dst_in: DataRef,
    sem: SemRef,
    dst_out: DataRef,
) -> None:
    del dep_hbm, dst_out

    @pl.loop(0, num[0])
    def _(i: jax.Array) -> None:
        n = sizes[i]
        src = src_hbm.at[pl.ds(src_off[i], n)]
        copy = safedma.LocalCopy(src, dst_in.at[pl.ds(dst_off[i], n)], sem)
        copy.started_elsewhere().wait()


def chunked_transfer(
    tables: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
    src: jax.Array,
    dep: jax.Array,
    dst: jax.Array,
) -> jax.Array:
    params = pltpu.CompilerParams(has_side_effects=True)
    dst, sem = safedma.pallas_call(
        chunks_start,
        out_shape=(ShapeDtype(dst.shape, dst.dtype), pltpu.SemaphoreType.DMA(())),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=(HBM, HBM, HBM), out_specs=(HBM, SEM)
        ),
        input_output_aliases={6: 0},
        compiler_params=params,
    )(*tables, src, dep, dst)
    return safedma.pallas_call(
        chunks_done,
        out_shape=ShapeDtype(dst.shape, dst.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[HBM, HBM, HBM, SEM], out_specs=HBM
        ),
        input_output_aliases={6: 0},
        compiler_params=params,
    )(*tables, src, dep, dst, sem)


# --- a copy to pinned host memory -------------------------------------------------------


def to_host(src: DataRef, host_in: DataRef, host_out: DataRef) -> None:
    del host_in

    def body(sem: SemRef) -> None:
        safedma.LocalCopy(src, host_out, sem).start().wait()

    safedma.run_scoped(body, safedma.dma_semaphore())


def copy_to_host(src: jax.Array, dest: jax.Array) -> jax.Array:
    host = pl.BlockSpec(memory_space=pl.HOST)
    return safedma.pallas_call(
        to_host,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY), host],
        out_specs=host,
        input_output_aliases={1: 0},
        out_shape=ShapeDtype(dest.shape, dest.dtype),
    )(src, dest)


# --- a state cache double-buffered across pipeline steps --------------------------------


def state_cache(
    v_hbm: DataRef,
    idx_ref: DataRef,
    dist_ref: DataRef,
    state_init: DataRef,
    o_hbm: DataRef,
    state_hbm: DataRef,
    h_bufs: DataRef,
    load_sems: SemArray,
    store_sems: SemArray,
) -> None:
    del state_init
    end = dist_ref[0]
    nb = pl.cdiv(end, BT)

    def token_map(i: jax.Array) -> tuple[pl.Slice | slice, int, int]:  # 0.10.2: pl.ds may be a slice
        return (pl.ds(i * BT, jnp.minimum(BT, end - i * BT)), 0, 0)

    spec = pl.BlockSpec((pl.BoundedSlice(BT), H, D), token_map)
    for t in range(BT):

        @pl.when(t < end)
        def _() -> None:
            row = state_hbm.at[pl.ds(idx_ref[t], 1)]
            safedma.LocalCopy(row, h_bufs.at[0, pl.ds(t, 1)], load_sems.at[0]).start()

    def body(
        v_ref: DataRef,
        o_ref: DataRef,
        bufs: DataRef,
        idx: DataRef,
        lsems: SemArray,
        ssems: SemArray,
    ) -> None:
        b = pl.program_id(0)
        t0 = b * BT
        n = jnp.minimum(BT, end - t0)
        cur, nxt = b % 2, (b + 1) % 2
        n_next = jnp.maximum(jnp.minimum(BT, end - t0 - BT), 0)
        for t in range(BT):

            @pl.when(t < n_next)
            def _() -> None:
                row = state_hbm.at[pl.ds(idx[t0 + BT + t], 1)]
                safedma.LocalCopy(row, bufs.at[nxt, pl.ds(t, 1)], lsems.at[nxt]).start()

        safedma.wait_bytes(lsems.at[cur], bufs.at[cur, pl.ds(0, n)])
        prev = jnp.where(b >= 2, jnp.minimum(BT, end - jnp.maximum((b - 2) * BT, 0)), 0)

        @pl.when(prev > 0)
        def _() -> None:
            safedma.wait_bytes(ssems.at[cur], bufs.at[cur, pl.ds(0, prev)])

        o_ref[...] = v_ref[...]
        for t in range(BT):

            @pl.when(t < n)
            def _() -> None:
                row = state_hbm.at[pl.ds(idx[t0 + t], 1)]
                safedma.LocalCopy(bufs.at[cur, pl.ds(t, 1)], row, ssems.at[cur]).start()

    safedma.emit_pipeline(body, grid=(nb,), in_specs=[spec], out_specs=spec)(
        v_hbm, o_hbm, scratches=[h_bufs, idx_ref, load_sems, store_sems]
    )
    last, other = (nb - 1) % 2, nb % 2
    safedma.wait_bytes(
        store_sems.at[last], h_bufs.at[last, pl.ds(0, jnp.minimum(BT, end - (nb - 1) * BT))]
    )
    on_other = jnp.where(nb >= 2, jnp.minimum(BT, end - (nb - 2) * BT), 0)

    @pl.when(on_other > 0)
    def _() -> None:
        safedma.wait_bytes(store_sems.at[other], h_bufs.at[other, pl.ds(0, on_other)])


def decode(v: jax.Array, idx: jax.Array, dist: jax.Array, state: jax.Array) -> jax.Array:
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    o, new_state = safedma.pallas_call(
        state_cache,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[any_spec, smem, smem, any_spec],
            out_specs=[any_spec, any_spec],
            grid=(1,),
            scratch_shapes=[
                safedma.vmem((2, BT, H, D, D), jnp.float32),
                safedma.dma_semaphores(2),
                safedma.dma_semaphores(2),
            ],
        ),
        input_output_aliases={0: 0, 3: 1},
        out_shape=[ShapeDtype(v.shape, v.dtype), ShapeDtype(state.shape, state.dtype)],
        compiler_params=pltpu.CompilerParams(disable_bounds_checks=True),
        name="decoding_gdn",
    )(v, idx, dist, state)
    return o + new_state.sum()


# --- a SparseCore histogram: handles kept or None, a zero fill, a scatter-add ----------

W, HIST = 16, 16


def histogram_window(
    keys_ref: DataRef,
    values_ref: DataRef | None,
    keys: DataRef,
    values: DataRef,
    histogram: DataRef,
    zeros: DataRef,
    indices: DataRef,
    shared: DataRef,
    sem: SemRef,
    window: jax.Array,
) -> None:
    leader = jax.lax.axis_index("subcore") == 0
    keys_copy = safedma.LocalCopy(keys_ref.at[pl.ds(window * W, W)], keys, sem).start()
    vals_copy: safedma.LocalHandle | None = None
    if values_ref is not None:
        src = values_ref.at[pl.ds(window * W, W)]
        vals_copy = safedma.LocalCopy(src, values, sem).start()
    keys_copy.wait()
    del keys_copy
    if vals_copy is not None:
        vals_copy.wait()
    del vals_copy

    @pl.when(leader)
    def _() -> None:
        safedma.LocalCopy(zeros, shared, sem).start()

    @pl.when(leader)
    def _() -> None:
        safedma.LocalCopy(zeros, shared, sem).started_elsewhere().wait()

    safedma.sync_copy(histogram, shared.at[indices], add=True)
    safedma.sync_copy(shared, histogram)


def sparse_core_scratch() -> list[object]:
    # A scratch tree flattened for pl.kernel; its semaphore is the type itself.
    return [
        pltpu.SemaphoreType.DMA,
        pltpu.VMEM((W,), jnp.int32),
        pltpu.VMEM_SHARED((HIST,), jnp.int32),
    ]


# --- MPMD: a scalar-subcore body and a vector-subcore body signalling each other -------


def go_scs(
    x_hbm: DataRef,
    out_ref: DataRef,
    *,
    send: DataRef,
    recv: DataRef,
    to_scs: safedma.RegularSem,
    to_vec: safedma.RegularSem,
) -> None:
    del out_ref

    def body(send_sem: SemRef, recv_sem: SemRef) -> None:
        safedma.LocalCopy(x_hbm, send, send_sem).start().wait()
        safedma.LocalCopy(send, recv, recv_sem).start().wait()
        safedma.signal(to_vec, device=safedma.device(subcore=0))
        safedma.wait(to_scs, 1)

    safedma.run_scoped(body, send_sem=safedma.dma_semaphore(), recv_sem=safedma.dma_semaphore())


def go_vec(
    x_hbm: DataRef,
    out_ref: DataRef,
    *,
    send: DataRef,
    recv: DataRef,
    to_scs: safedma.RegularSem,
    to_vec: safedma.RegularSem,
) -> None:
    def body(vmem: DataRef, iota: DataRef) -> None:
        safedma.sync_copy(x_hbm, iota)
        safedma.wait(to_vec, 1)
        safedma.sync_copy(recv.at[iota], vmem, add=True)
        safedma.sync_copy(vmem, send)
        safedma.signal(to_scs, device=safedma.device(core=0))
        safedma.sync_copy(vmem, out_ref)

    safedma.run_scoped(body, safedma.vmem((W,), jnp.int32), safedma.vmem((W,), jnp.int32))


def mpmd_step(x: jax.Array, scs: object, vec: object, scratch: dict[str, object]) -> jax.Array:
    out: jax.Array = safedma.core_kernel(
        [go_scs, go_vec], ShapeDtype((W,), jnp.int32), mesh=[scs, vec], scratch_types=scratch
    )(x)
    return out
