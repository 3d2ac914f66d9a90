"""Pass: shapes found in production DMA kernels (vLLM tpu-inference, simply, tokamax).

* a direct-write reduce-scatter: an all-device barrier through dict device ids (itself
  included); in a ``fori_loop`` whose trip count is read from SMEM, a row gather of copies
  of size 0 or 1 on one slot of a 2-semaphore array, the next tile prefetched under
  ``pl.when`` and the current one waited by size; per row a remote copy and a local copy
  of size 0 or 1, started and dropped, on triple-buffered semaphores, the rows counted in
  SMEM; each slot drained by size (``wait_bytes``) before reuse and after the loop; a
  second barrier and the receive semaphore drained by a total read from SMEM; the output
  zeroed first by ``priority=1`` copies in a ``fori_loop`` whose carry sums their rows;
* a bidirectional reduce-scatter matmul: two remote copies described once per grid step,
  started under one ``pl.when`` after a REGULAR capacity semaphore is waited and waited
  under another through ``started_elsewhere()``; a neighbour barrier and a second one on a
  scoped REGULAR semaphore; six DMA and two REGULAR scratch semaphores as a list sum; three
  outputs (two of them the HBM working buffers), unpacked;
* a ragged all-to-all as a DMA future: a start kernel that returns the output and a 3-D
  semaphore array (``[output, dma_semaphores((n, 2, 2))]``), starting the sends to every
  other device and a local copy; a wait kernel taking the semaphores as an operand that
  waits the sends, the receives (through ``incoming()``) and the local copy; an all-peer
  barrier, and a second one on a keyword ``run_scoped`` used as a ``functools.partial``
  decorator;
* gradient tiles accumulated by DMA inside a pipeline on each TensorCore: ``core_kernel``
  with a list of two output shapes, an ``emit_pipeline`` with HBM out-specs whose body gets
  four DMA semaphores through ``scratches=``; reads started under ``pl.when``, writes
  started in complementary ``pl.when`` blocks and waited after them through
  ``started_elsewhere()``; a column count computed in the kernel on both sides of a copy;
* a schedule read in windows into SMEM: a pytree schedule operand and in-spec, copies of a
  traced length HBM -> SMEM double-buffered across a ``fori_loop`` (prefetched under a
  parity ``pl.when``, waited on rebuilt descriptors through ``jax.tree.map``), and an
  ``emit_pipeline`` whose ``BufferedRef`` allocations come in as a scratch entry.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Generic, TypeVar

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import DataRef, Given, RegularSem, RemoteCopy, SemArray, SemArray3, SemRef

from _typed_jax import buffered_input, buffered_output, fori_loop, zeros

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
R = TypeVar("R")
ANY = pl.BlockSpec(memory_space=pl.ANY)
N, TILE, SLOTS = 4, 4, 3
SRC, VALID, DEST, POS, SEND, LOCAL = range(6)


# --- a direct-write reduce-scatter ------------------------------------------------------


def all_device_barrier() -> None:
    barrier = safedma.barrier_semaphore()
    for i in range(N):
        safedma.signal(barrier, 1, device=safedma.device(x=jnp.int32(i)))
    safedma.wait(barrier, N)


class DirectWrite:
    def __init__(
        self,
        rows_ref: DataRef,
        staging: DataRef,
        out_hbm: DataRef,
        counts: DataRef,
        sems: tuple[SemArray, SemArray, SemArray],
    ) -> None:
        self.rows_ref, self.staging, self.out_hbm, self.counts = rows_ref, staging, out_hbm, counts
        self.send_sems, self.local_sems, self.recv_sem = sems

    def drain(self, slot: int | jax.Array) -> None:
        sent, local = self.counts[slot], self.counts[SLOTS + slot]
        safedma.wait_bytes(self.send_sems.at[slot], self.staging.at[slot, pl.ds(0, sent)])
        safedma.wait_bytes(self.local_sems.at[slot], self.out_hbm.at[pl.ds(0, local)])

    def write_rows(self, gm: jax.Array, stg: jax.Array) -> None:
        sent = local = jnp.int32(0)
        for i in range(TILE):
            row = gm * TILE + i
            send, keep = self.rows_ref[SEND, row], self.rows_ref[LOCAL, row]
            pos = self.rows_ref[POS, row]
            out = RemoteCopy(
                self.staging.at[stg, pl.ds(i, send)],
                self.out_hbm.at[pl.ds(pos, send)],
                self.recv_sem.at[0],
            )
            target = safedma.device(x=self.rows_ref[DEST, row])
            out.with_send_sem(self.send_sems.at[stg]).to(target).start()
            safedma.LocalCopy(
                self.staging.at[stg, pl.ds(i, keep)],
                self.out_hbm.at[pl.ds(pos, keep)],
                self.local_sems.at[stg],
            ).start()
            sent, local = sent + send, local + keep
        self.counts[stg] = self.counts[stg] + sent
        self.counts[SLOTS + stg] = self.counts[SLOTS + stg] + local


def gather_start(
    rows_ref: DataRef,
    hidden: DataRef,
    gathered: DataRef,
    sems: SemArray,
    gm: jax.Array,
    slot: jax.Array,
) -> None:
    for i in range(TILE):
        row = gm * TILE + i
        valid = rows_ref[VALID, row]
        src = hidden.at[pl.ds(rows_ref[SRC, row], valid)]
        safedma.LocalCopy(src, gathered.at[slot, pl.ds(i, valid)], sems.at[slot]).start()


def direct_write_kernel(
    rows_ref: DataRef,
    tile_rows_ref: DataRef,
    nums_ref: DataRef,
    hidden_hbm: DataRef,
    out_hbm: DataRef,
    gathered: DataRef,
    staging: DataRef,
    counts: DataRef,
    gather_sems: SemArray,
    send_sems: SemArray,
    local_sems: SemArray,
    recv_sem: SemArray,
    zero_sem: SemArray,
) -> None:
    max_gm, local_gm = nums_ref[0], nums_ref[1]
    writer = DirectWrite(rows_ref, staging, out_hbm, counts, (send_sems, local_sems, recv_sem))
    source = staging.at[0]
    source[...] = zeros(source.shape, source.dtype)

    def fill(i: jax.Array, filled: jax.Array) -> jax.Array:
        rows = jnp.minimum(i * TILE + TILE, 16) - i * TILE
        dst = out_hbm.at[pl.ds(i * TILE, rows)]
        safedma.LocalCopy(source.at[pl.ds(0, rows)], dst, zero_sem.at[0]).start(priority=1)
        return filled + rows

    zeroed = fori_loop(0, 4, fill, jnp.int32(0))
    safedma.wait_bytes(zero_sem.at[0], out_hbm.at[pl.ds(0, zeroed)])  # before the barrier
    all_device_barrier()
    for s in range(2 * SLOTS):
        counts[s] = jnp.int32(0)

    def tile(gm: jax.Array, carry: None) -> None:
        slot, stg = gm % 2, gm % SLOTS

        @pl.when(gm >= SLOTS)
        def _drain_previous() -> None:
            writer.drain(stg)
            counts[stg] = jnp.int32(0)
            counts[SLOTS + stg] = jnp.int32(0)

        @pl.when(gm < local_gm)
        def _active() -> None:
            @pl.when(gm == 0)
            def _first() -> None:
                gather_start(rows_ref, hidden_hbm, gathered, gather_sems, gm, slot)

            @pl.when(gm + 1 < local_gm)
            def _prefetch() -> None:
                gather_start(rows_ref, hidden_hbm, gathered, gather_sems, gm + 1, 1 - slot)

            tile_rows = gathered.at[slot, pl.ds(0, tile_rows_ref[gm])]
            safedma.wait_bytes(gather_sems.at[slot], tile_rows)
            staging[stg] = gathered[slot] * 2.0
            writer.write_rows(gm, stg)

        return carry

    fori_loop(0, max_gm, tile, None)

    def drain_if_used(slot: int) -> None:
        @pl.when(max_gm > slot)
        def _drain_slot() -> None:
            writer.drain(slot)

    @pl.when(max_gm > 0)
    def _epilogue() -> None:
        for s in range(SLOTS):
            drain_if_used(s)

    all_device_barrier()
    safedma.wait_bytes(recv_sem.at[0], out_hbm.at[pl.ds(0, nums_ref[2])])


def direct_write(
    rows: jax.Array, tile_rows: jax.Array, nums: jax.Array, hidden: jax.Array
) -> jax.Array:
    return safedma.pallas_call(
        direct_write_kernel,
        ShapeDtype((16, 8, 128), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3,
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[
                safedma.vmem((2, TILE, 8, 128), jnp.float32),
                safedma.vmem((SLOTS, TILE, 8, 128), jnp.float32),
                safedma.smem((2 * SLOTS,), jnp.int32),
                safedma.dma_semaphores(2),
                safedma.dma_semaphores(SLOTS),
                safedma.dma_semaphores(SLOTS),
                safedma.dma_semaphores(1),
                safedma.dma_semaphores(1),
            ],
        ),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(rows, tile_rows, nums, hidden)


# --- a bidirectional reduce-scatter matmul with capacity semaphores ---------------------

LEFT, RIGHT = 0, 1
BM = 128


def rows_block(i: jax.Array, j: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return i, k


def cols_block(i: jax.Array, j: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return j, k


def out_block(i: jax.Array, j: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return i, j


def tile_block(i: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
    return i, j


def matmul(x_ref: DataRef, y_ref: DataRef, prev_ref: DataRef, z_ref: DataRef) -> None:
    z_ref[...] = prev_ref[...] + jnp.dot(x_ref[...], y_ref[...].T)


def save(x_ref: DataRef, o_ref: DataRef) -> None:
    o_ref[...] = x_ref[...]


def neighbour_barrier(left: safedma.Device, right: safedma.Device) -> None:
    barrier = safedma.barrier_semaphore()
    for to in (left, right):
        safedma.signal(barrier, 1, device=to)
    safedma.wait(barrier, 2)

    def second(sem: RegularSem) -> None:
        for to in (left, right):
            safedma.signal(sem, 1, device=to)
        safedma.wait(sem, 2)

    safedma.run_scoped(second, safedma.regular_semaphore())


def rs_matmul_kernel(
    x_hbm: DataRef,
    y_hbm: DataRef,
    o_hbm: DataRef,
    left_hbm: DataRef,
    right_hbm: DataRef,
    left_recv: SemRef,
    left_send: SemRef,
    left_copy_sem: SemRef,  # declared by the author, never used
    right_copy_sem: SemRef,
    right_recv: SemRef,
    right_send: SemRef,
    left_capacity: RegularSem,
    right_capacity: RegularSem,
) -> None:
    del left_copy_sem, right_copy_sem
    me = jax.lax.axis_index("x")
    outer, phase = pl.program_id(0), pl.program_id(1)
    step = outer * pl.num_programs(1) + phase
    steps = pl.num_programs(0) * pl.num_programs(1)
    is_start = jnp.logical_and(outer == 0, phase == 0)
    middle = jnp.logical_not(jnp.logical_or(is_start, step == steps - 1))
    left_work, right_work = jax.lax.rem(outer, 2), jax.lax.rem(pl.cdiv(step, 2), 2)
    left = safedma.mesh_coords(jax.lax.rem(me - 1 + N, N))
    right = safedma.mesh_coords(jax.lax.rem(me + 1 + N, N))

    def describe(
        hbm: DataRef, work: jax.Array, send: SemRef, recv: SemRef, to: safedma.Device
    ) -> RemoteCopy[Given, Given]:
        return RemoteCopy(hbm.at[work], hbm.at[1 - work], recv).with_send_sem(send).to(to)

    left_copy = describe(left_hbm, left_work, left_send, left_recv, left)
    right_copy = describe(right_hbm, right_work, right_send, right_recv, right)

    @pl.when(is_start)
    def _prologue() -> None:
        neighbour_barrier(left, right)
        safedma.signal(right_capacity, 1, device=left)
        safedma.signal(left_capacity, 1, device=right)

    @pl.when(middle)
    def _send() -> None:
        @pl.when(phase == LEFT)
        def _right() -> None:
            safedma.wait(right_capacity, 1)
            right_copy.start()

        @pl.when(phase == RIGHT)
        def _left() -> None:
            safedma.wait(left_capacity, 1)
            left_copy.start()

    matmul_pipeline = safedma.emit_pipeline(
        matmul,
        in_specs=[
            pl.BlockSpec((BM, BM), rows_block),
            pl.BlockSpec((BM, BM), cols_block),
            pl.BlockSpec((BM, BM), out_block),
        ],
        out_specs=pl.BlockSpec((BM, BM), out_block),
        grid=(1, 1, 1),
    )
    tile = pl.BlockSpec((BM, BM), tile_block)
    save_pipeline = safedma.emit_pipeline(save, in_specs=[tile], out_specs=tile, grid=(1, 1))

    @pl.when(step < steps - 2)
    def _accumulate() -> None:
        @pl.when(phase == LEFT)
        def _left() -> None:
            rows = x_hbm.at[pl.ds(jax.lax.rem(outer + me, N) * BM, BM)]
            work = left_hbm.at[left_work]
            matmul_pipeline(rows, y_hbm.at[pl.ds(0, BM), :], work, work)

        @pl.when(phase == RIGHT)
        def _right() -> None:
            rows = x_hbm.at[pl.ds(jax.lax.rem(me - outer + N, N) * BM, BM)]
            work = right_hbm.at[right_work]
            matmul_pipeline(rows, y_hbm.at[pl.ds(BM, BM), :], work, work)

    @pl.when(step >= steps - 2)
    def _save() -> None:
        @pl.when(phase == LEFT)
        def _left() -> None:
            save_pipeline(left_hbm.at[left_work], o_hbm.at[:, pl.ds(0, BM)])

        @pl.when(phase == RIGHT)
        def _right() -> None:
            save_pipeline(right_hbm.at[right_work], o_hbm.at[:, pl.ds(BM, BM)])

    @pl.when(middle)
    def _epilogue() -> None:
        @pl.when(phase == LEFT)
        def _right() -> None:
            right_copy.started_elsewhere().wait()
            safedma.signal(right_capacity, 1, device=left)

        @pl.when(phase == RIGHT)
        def _left() -> None:
            left_copy.started_elsewhere().wait()
            safedma.signal(left_capacity, 1, device=right)

    @pl.when(outer == pl.num_programs(0) - 1)
    def _drain_capacity() -> None:
        @pl.when(phase == LEFT)
        def _left() -> None:
            safedma.wait(right_capacity, 1)

        @pl.when(phase == RIGHT)
        def _right() -> None:
            safedma.wait(left_capacity, 1)


def rs_matmul(x: jax.Array, y: jax.Array) -> jax.Array:
    half = ShapeDtype((2, BM, BM), jnp.float32)
    out, _, _ = safedma.pallas_call(
        rs_matmul_kernel,
        (ShapeDtype((BM, 2 * BM), jnp.float32), half, half),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[ANY, ANY],
            out_specs=[ANY, ANY, ANY],
            grid=(N + 1, 2),
            scratch_shapes=[safedma.dma_semaphore()] * 6 + [safedma.regular_semaphore()] * 2,
        ),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x, y)
    return out


# --- a ragged all-to-all as a DMA future --------------------------------------------------

SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


class AllToAll:
    def __init__(
        self,
        src: DataRef,
        dst: DataRef,
        meta: tuple[DataRef, DataRef, DataRef, DataRef],
        sems: SemArray3,
    ) -> None:
        self.src, self.dst, self.sems = src, dst, sems
        self.in_off, self.send_sizes, self.out_off, self.recv_sizes = meta
        self.me = jax.lax.axis_index("x")

    def local(self) -> safedma.LocalCopy:
        me, size = self.me, self.send_sizes[self.me]
        src = self.src.at[pl.ds(self.in_off[me], size)]
        dst = self.dst.at[pl.ds(self.out_off[me], size)]
        return safedma.LocalCopy(src, dst, self.sems.at[jax.lax.rem(me + me, N), 0, 1])

    def remote(self, other: jax.Array, *, send: bool) -> RemoteCopy[Given, Given]:
        me = self.me
        src_id, dst_id = (me, other) if send else (other, me)
        size = jax.lax.select(me == src_id, self.send_sizes[dst_id], self.recv_sizes[src_id])
        src = self.src.at[pl.ds(self.in_off[dst_id], size)]
        dst = self.dst.at[pl.ds(self.out_off[dst_id], size)]
        slot = jax.lax.rem(me + other, N)
        direction = (src_id > dst_id).astype(jnp.int32)
        copy = RemoteCopy(src, dst, self.sems.at[slot, direction, 1])
        return copy.with_send_sem(self.sems.at[slot, direction, 0]).to(safedma.device(x=dst_id))

    def barriers(self, start: bool) -> None:
        others = [jax.lax.rem(self.me + i, N) for i in range(1, N)]
        barrier = safedma.barrier_semaphore()
        for to in others:
            safedma.signal(barrier, 1, device=safedma.device(x=to))
        safedma.wait(barrier, N - 1)
        sends = [self.remote(other, send=True) for other in others]
        receives = [self.remote(other, send=False) for other in others]
        if start:
            for copy in sends:
                copy.start()
            self.local().start()
        else:
            for copy in sends:
                copy.started_elsewhere().wait_send()
            for copy in receives:
                copy.incoming().wait_recv()
            self.local().started_elsewhere().wait()

        @functools.partial(safedma.run_scoped, second_barrier=safedma.regular_semaphore())
        def _final_barrier(second_barrier: RegularSem) -> None:
            for to in others:
                safedma.signal(second_barrier, 1, device=safedma.device(x=to))
            safedma.wait(second_barrier, N - 1)


def ra2a_start_kernel(
    src_ref: DataRef,
    out_ref: DataRef,
    in_off: DataRef,
    send_sizes: DataRef,
    out_off: DataRef,
    recv_sizes: DataRef,
    dst_ref: DataRef,
    sems: SemArray3,
) -> None:
    del out_ref  # aliased in dst_ref
    AllToAll(src_ref, dst_ref, (in_off, send_sizes, out_off, recv_sizes), sems).barriers(True)


def ra2a_wait_kernel(
    src_ref: DataRef,
    out_ref: DataRef,
    in_off: DataRef,
    send_sizes: DataRef,
    out_off: DataRef,
    recv_sizes: DataRef,
    sems: SemArray3,
    dst_ref: DataRef,
) -> None:
    del out_ref
    AllToAll(src_ref, dst_ref, (in_off, send_sizes, out_off, recv_sizes), sems).barriers(False)


def ra2a_start(
    src: jax.Array, output: jax.Array, meta: tuple[jax.Array, jax.Array, jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    out, sems = safedma.pallas_call(
        ra2a_start_kernel,
        [output, safedma.dma_semaphores((N, 2, 2))],
        in_specs=2 * [ANY] + 4 * [SMEM],
        out_specs=[ANY, SEM],
        input_output_aliases={1: 0},
        compiler_params=pltpu.CompilerParams(collective_id=1),
    )(src, output, *meta)
    return out, sems


def ra2a_wait(
    src: jax.Array,
    future: tuple[jax.Array, jax.Array],
    meta: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
) -> jax.Array:
    out, sems = future
    return safedma.pallas_call(
        ra2a_wait_kernel,
        out,
        in_specs=2 * [ANY] + 4 * [SMEM] + [SEM],
        out_specs=ANY,
        input_output_aliases={1: 0},
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(src, out, *meta, sems)


# --- gradient tiles accumulated by DMA in a pipeline on each TensorCore ------------------

BB, NV, CORES = 8, 4, 2


def grad_step(
    x_ref: DataRef,
    w_ref: DataRef,
    xg_hbm: DataRef,
    wg_hbm: DataRef,
    xw: DataRef,
    xg_tile: DataRef,
    wg_tile: DataRef,
    x_read_sem: SemRef,
    w_read_sem: SemRef,
    x_write_sem: SemRef,
    w_write_sem: SemRef,
) -> None:
    core = jax.lax.axis_index("core")
    b, v, stage, h = (pl.program_id(i) for i in range(4))
    gv = core * (NV // CORES) + v

    @pl.when(stage == 0)
    def _xw() -> None:
        xw[...] += jnp.dot(x_ref[...], w_ref[...])

    @pl.when(stage == 1)
    def _grads() -> None:
        cols = jnp.minimum(NV * BM - BM * gv, BM)
        xg_slice = xg_hbm.at[core, pl.ds(b * BB, BB), pl.ds(h * BM, BM)]
        wg_slice = wg_hbm.at[pl.ds(h * BM, BM), pl.ds(gv * BM, cols)]
        wg_part = wg_tile.at[:, pl.ds(0, cols)]
        x_write = safedma.LocalCopy(xg_tile, xg_slice, x_write_sem)
        w_write = safedma.LocalCopy(wg_part, wg_slice, w_write_sem)
        x_read = safedma.LocalCopy(xg_slice, xg_tile, x_read_sem)
        w_read = safedma.LocalCopy(wg_slice, wg_part, w_read_sem)

        @pl.when(b != 0)
        def _w_read() -> None:
            w_read.start()

        @pl.when(v != 0)
        def _x_read() -> None:
            x_read.start()

        @pl.when(b == 0)
        def _init_w() -> None:
            wg_tile[...] = jnp.dot(x_ref[...].T, xw[...])
            w_write.start()

        @pl.when(v == 0)
        def _init_x() -> None:
            xg_tile[...] = jnp.dot(xw[...], w_ref[...].T)
            x_write.start()

        @pl.when(b != 0)
        def _accumulate_w() -> None:
            w_read.started_elsewhere().wait()
            wg_tile[...] += jnp.dot(x_ref[...].T, xw[...])
            w_write.start()

        @pl.when(v != 0)
        def _accumulate_x() -> None:
            x_read.started_elsewhere().wait()
            xg_tile[...] += jnp.dot(xw[...], w_ref[...].T)
            x_write.start()

        w_write.started_elsewhere().wait()
        x_write.started_elsewhere().wait()


def grads_kernel(
    x_hbm: DataRef,
    w_hbm: DataRef,
    xg_hbm: DataRef,
    wg_hbm: DataRef,
    xw: DataRef,
    xg_tile: DataRef,
    wg_tile: DataRef,
    x_read_sem: SemRef,
    w_read_sem: SemRef,
    x_write_sem: SemRef,
    w_write_sem: SemRef,
) -> None:
    core = jax.lax.axis_index("core")

    def x_block(
        i: jax.Array, j: jax.Array, s: jax.Array, k: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        return i, k

    def w_block(
        i: jax.Array, j: jax.Array, s: jax.Array, k: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        return k, core * (NV // CORES) + j

    hbm = pl.BlockSpec(memory_space=pltpu.HBM)
    pipeline = safedma.emit_pipeline(
        grad_step,
        grid=(2, NV // CORES, 2, 2),
        in_specs=[pl.BlockSpec((BB, BM), x_block), pl.BlockSpec((BM, BM), w_block)],
        out_specs=[hbm, hbm],
    )
    sems = (x_read_sem, w_read_sem, x_write_sem, w_write_sem)
    pipeline(x_hbm, w_hbm, xg_hbm, wg_hbm, scratches=(xw, xg_tile, wg_tile, *sems))


def grads(x: jax.Array, w: jax.Array, mesh: object) -> tuple[jax.Array, jax.Array]:
    xg, wg = safedma.core_kernel(
        grads_kernel,
        [
            ShapeDtype((CORES, 2 * BB, 2 * BM), jnp.float32),
            ShapeDtype((2 * BM, NV * BM), jnp.float32),
        ],
        mesh=mesh,
        scratch_types=(
            safedma.vmem((BB, BM), jnp.float32),
            safedma.vmem((BB, BM), jnp.float32),
            safedma.vmem((BM, BM), jnp.float32),
            safedma.dma_semaphore(),
            safedma.dma_semaphore(),
            safedma.dma_semaphore(),
            safedma.dma_semaphore(),
        ),
    )(x, w)
    result: tuple[jax.Array, jax.Array] = (xg, wg)
    return result


# --- a schedule read in windows into SMEM, double-buffered across a loop ------------------

WINDOW = 4


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule(Generic[R]):
    steps: R
    rows: R


def row_block(i: jax.Array) -> tuple[jax.Array, int]:
    return i, 0


ROW_SPEC = pl.BlockSpec((8, 128), row_block)


class Windows:
    def __init__(
        self, sched: Schedule[DataRef], bufs: tuple[DataRef, DataRef], sems: SemArray
    ) -> None:
        self.sched, self.bufs, self.sems = sched, bufs, sems
        self.steps = sched.steps[0]

    def copies(self, window: jax.Array, slot: int) -> list[safedma.LocalCopy]:
        n = jnp.minimum(self.steps - window * WINDOW, WINDOW)
        src = self.sched.rows.at[pl.ds(pl.multiple_of(window * WINDOW, WINDOW), n)]
        return [safedma.LocalCopy(src, self.bufs[slot].at[pl.ds(0, n)], self.sems.at[slot])]


def wait_all(copies: list[safedma.LocalCopy]) -> None:
    for copy in copies:
        copy.started_elsewhere().wait()


def windows_kernel(
    sched: Schedule[DataRef],
    x_hbm: DataRef,
    o_hbm: DataRef,
    allocs: tuple[pltpu.BufferedRef, pltpu.BufferedRef],
    bufs: tuple[DataRef, DataRef],
    sems: SemArray,
) -> None:
    plan = Windows(sched, bufs, sems)
    windows = pl.cdiv(plan.steps, WINDOW)
    for copy in plan.copies(jnp.int32(0), 0):
        copy.start()

    def run(w: jax.Array, slot: int) -> None:
        wait_all(plan.copies(w, slot))

        def step(x_ref: DataRef, o_ref: DataRef) -> None:
            o_ref[...] = x_ref[...] + bufs[slot][0].astype(jnp.float32)

        grid = (jnp.minimum(plan.steps - w * WINDOW, WINDOW),)
        pipeline = safedma.emit_pipeline(step, grid=grid, in_specs=[ROW_SPEC], out_specs=[ROW_SPEC])
        pipeline(x_hbm, o_hbm, allocations=allocs)

    def prefetch(w: jax.Array, slot: int) -> None:
        for copy in plan.copies(w + 1, slot):
            copy.start()

    def window(w: jax.Array, carry: None) -> None:
        even = w % 2 == 0
        more = w + 1 < windows

        @pl.when(jnp.logical_and(more, even))
        def _prefetch_1() -> None:
            prefetch(w, 1)

        @pl.when(jnp.logical_and(more, jnp.logical_not(even)))
        def _prefetch_0() -> None:
            prefetch(w, 0)

        @pl.when(even)
        def _compute_0() -> None:
            run(w, 0)

        @pl.when(jnp.logical_not(even))
        def _compute_1() -> None:
            run(w, 1)

        return carry

    fori_loop(0, windows, window, None)


def schedule_windows(steps: jax.Array, rows: jax.Array, x: jax.Array) -> jax.Array:
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)
    allocs = (buffered_input(ROW_SPEC, jnp.float32), buffered_output(ROW_SPEC, jnp.float32))
    window_buf = safedma.smem((WINDOW,), jnp.int32)
    # jax's PrefetchScalarGridSpec annotates its scratch without BufferedRef allocations
    # (which it takes at run time); safedma.pallas_call's scratch_shapes takes them.
    return safedma.pallas_call(
        windows_kernel,
        ShapeDtype(x.shape, x.dtype),
        in_specs=[Schedule(pl.BlockSpec(memory_space=pltpu.SMEM), hbm), hbm],
        out_specs=hbm,
        scratch_shapes=(allocs, (window_buf, window_buf), safedma.dma_semaphores(2)),
        compiler_params=pltpu.CompilerParams(disable_semaphore_checks=True),
    )(Schedule(steps, rows), x)
