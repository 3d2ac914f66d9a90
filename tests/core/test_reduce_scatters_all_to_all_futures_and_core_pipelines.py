"""Trace-time checks on the DMA patterns of reduce-scatters, all-to-all futures and
per-core pipelines, on kernels written here.

* a direct-write reduce-scatter (the DMA protocol of vLLM tpu-inference's
  ``experimental/fused_moe/gmm_fused_rs_nodedup.py``): an all-device barrier (every device
  signalled through a dict device id, itself included); in a ``fori_loop`` whose trip count
  is read from SMEM, a double-buffered row gather (one copy per row of size 0 or 1 on one
  semaphore slot, the next tile prefetched in ``pl.when``, the current one waited by size);
  then per row a remote copy of size 0 or 1 to the row's chip and a local copy of size 0 or
  1, fire and forget, on triple-buffered send and local-write semaphores, the bytes counted
  in SMEM; a slot is drained by size before it is reused, every slot again after the loop;
  a second barrier, then the receive semaphore drained by the total read from SMEM;
* a bidirectional reduce-scatter matmul (tpu-inference's
  ``collectives/reduce_scatter_matmul.py``): two remote copies described once per grid
  step, each started in one ``pl.when`` after a REGULAR capacity semaphore is waited, and
  waited in another ``pl.when`` (the epilogue) that then hands the capacity back to the
  neighbour; a neighbour barrier and the first capacity signals on the first step, the
  last capacity consumed on the last round; the working buffers are outputs (HBM), filled
  by ``emit_pipeline``;
* a ragged all-to-all as a DMA future (google-deepmind/simply's ``moe_lib.py``,
  ``_ra2a_3d_kernel_async``): a start kernel that returns the output and a 3-D semaphore
  array, starting the sends to every other device and a local copy; a wait kernel that
  takes the semaphores and waits the sends, the receives and the local copy; an all-peer
  barrier and a second one on a scoped REGULAR semaphore;
* gradient tiles read, accumulated and written back by DMA inside a pipeline on each
  TensorCore (tokamax's linear-softmax-cross-entropy backward): ``pl.kernel`` over a
  TensorCore mesh, ``emit_pipeline`` with the semaphores passed through ``scratches=``,
  reads started under ``pl.when``, each write started in one of two complementary
  ``pl.when`` blocks and waited after them, a column count computed in the kernel.

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
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma import _compat
from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_text,
    verify,
)
from tests.support.ring_twins import ALONG_X, sharded
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False


# --- a direct-write reduce-scatter --------------------------------------------------------

N, TILE, GMS, SLOTS = 4, 4, 6, 3  # devices, rows per tile, most tiles, staging slots
HIDDEN, OUT = 32, 16  # rows of the hidden states and of the output, per device
SRC, VALID, DEST, POS, SEND, LOCAL = range(6)  # the rows of the routing table


def _direct_write(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        rows_ref: Any,  # int32[6, GMS * TILE]: per row its source, and where it goes
        tile_rows_ref: Any,  # int32[GMS]: the rows a tile gathers
        nums_ref: Any,  # int32[3]: tiles of the loop, tiles with work, rows received
        hidden_hbm: Any,
        out_hbm: Any,
        gathered: Any,  # VMEM [2, TILE, 8, 128]
        staging: Any,  # VMEM [SLOTS, TILE, 8, 128]
        counts: Any,  # SMEM [2 * SLOTS]: rows sent and written locally, per staging slot
        gather_sems: Any,
        send_sems: Any,
        local_sems: Any,
        recv_sem: Any,
        zero_sem: Any,
    ) -> None:
        max_gm, local_gm = nums_ref[0], nums_ref[1]

        def barrier() -> None:
            if not safe:
                sem = pltpu.get_barrier_semaphore()
                for i in range(N):
                    pl.semaphore_signal(sem, device_id={"x": jnp.int32(i)})
                pl.semaphore_wait(sem, N)
                return
            sem = sd.barrier_semaphore()
            for i in range(N):
                sd.signal(sem, 1, device=sd.device(x=jnp.int32(i)))
            sd.wait(sem, N)

        def wait_rows(sem: Any, rows: Any) -> None:
            if safe:
                sd.wait_bytes(sem, rows)  # DRAIN
            else:
                pltpu.make_async_copy(rows, rows, sem).wait()

        def drain(slot: Any) -> None:
            wait_rows(send_sems.at[slot], staging.at[slot, pl.ds(0, counts[slot])])
            if seed != "local_drain_dropped":
                wait_rows(local_sems.at[slot], out_hbm.at[pl.ds(0, counts[SLOTS + slot])])

        def gather_start(gm: Any, slot: Any) -> None:
            for i in range(TILE):
                row = gm * TILE + i
                valid = rows_ref[VALID, row]
                src = hidden_hbm.at[pl.ds(rows_ref[SRC, row], valid)]
                dst = gathered.at[slot, pl.ds(i, valid)]
                if seed == "gather_into_both_slots":
                    dst = gathered.at[pl.ds(0, 2), pl.ds(i, valid)]
                if safe:
                    sd.LocalCopy(src, dst, gather_sems.at[slot]).start()  # GATHERED
                else:
                    pltpu.make_async_copy(src, dst, gather_sems.at[slot]).start()

        def write_rows(gm: Any, stg: Any) -> None:
            sent = local = jnp.int32(0)
            for i in range(TILE):
                row = gm * TILE + i
                send, keep = rows_ref[SEND, row], rows_ref[LOCAL, row]
                dest, pos = rows_ref[DEST, row], rows_ref[POS, row]
                if safe:
                    out = sd.RemoteCopy(
                        staging.at[stg, pl.ds(i, send)],
                        out_hbm.at[pl.ds(pos, send)],
                        recv_sem.at[0],
                    )
                    target = sd.device(x=dest)
                    if seed == "send_sem_is_the_recv_array":
                        out.with_send_sem(recv_sem).to(target).start()  # SEEDED
                    else:
                        out.with_send_sem(send_sems.at[stg]).to(target).start()  # SENT
                    dst = out_hbm.at[pl.ds(pos, keep)]
                    sd.LocalCopy(
                        staging.at[stg, pl.ds(i, keep)], dst, local_sems.at[stg]
                    ).start()  # WRITTEN
                else:
                    pltpu.make_async_remote_copy(
                        src_ref=staging.at[stg, pl.ds(i, send)],
                        dst_ref=out_hbm.at[pl.ds(pos, send)],
                        send_sem=send_sems.at[stg],
                        recv_sem=recv_sem.at[0],
                        device_id={"x": dest},
                    ).start()
                    pltpu.make_async_copy(
                        src_ref=staging.at[stg, pl.ds(i, keep)],
                        dst_ref=out_hbm.at[pl.ds(pos, keep)],
                        sem=local_sems.at[stg],
                    ).start()
                sent, local = sent + send, local + keep
            counts[stg] = counts[stg] + sent
            counts[SLOTS + stg] = counts[SLOTS + stg] + local

        # The output is zeroed by DMA from a staging slot, and other chips write rows into
        # it. The author zeroes it after the barrier, waiting at the first tile: a peer's
        # row can land before the zeros do (verify reports the race); zeroing it before
        # the barrier ("zeroed_before_barrier") is the race-free order.
        zeros = staging.at[0]

        def fill(i: Any, filled: Any) -> Any:
            start = i * TILE
            rows = jnp.minimum(start + TILE, OUT) - start
            src, dst = zeros.at[pl.ds(0, rows)], out_hbm.at[pl.ds(start, rows)]
            if safe:
                sd.LocalCopy(src, dst, zero_sem.at[0]).start(priority=1)  # ZEROED
            else:
                pltpu.make_async_copy(src, dst, zero_sem.at[0]).start(priority=1)  # RAW ZERO
            return filled + rows

        def zero_start() -> Any:
            zeros[...] = jnp.zeros(zeros.shape, zeros.dtype)
            return lax.fori_loop(0, pl.cdiv(OUT, TILE), fill, jnp.int32(0))

        early = seed == "zeroed_before_barrier"
        if early:
            wait_rows(zero_sem.at[0], out_hbm.at[pl.ds(0, zero_start())])
        barrier()
        for s in range(2 * SLOTS):
            counts[s] = jnp.int32(0)
        zeroed = None if early else zero_start()

        def zero_end() -> None:
            if zeroed is not None and seed != "zero_wait_dropped":
                wait_rows(zero_sem.at[0], out_hbm.at[pl.ds(0, zeroed)])

        def tile(gm: Any, carry: None) -> None:
            slot, stg = gm % 2, gm % SLOTS

            @pl.when(gm >= SLOTS)
            def _drain_previous() -> None:  # the slot's copies from SLOTS tiles ago
                drain(stg)
                counts[stg] = jnp.int32(0)
                counts[SLOTS + stg] = jnp.int32(0)

            @pl.when(gm < local_gm)
            def _active() -> None:
                @pl.when(gm == 0)
                def _first() -> None:
                    gather_start(gm, slot)

                @pl.when(gm + 1 < local_gm)
                def _prefetch() -> None:
                    gather_start(gm + 1, 1 - slot)

                if seed != "gather_wait_dropped":
                    wait_rows(gather_sems.at[slot], gathered.at[slot, pl.ds(0, tile_rows_ref[gm])])

                @pl.when(gm == 0)
                def _zeroed() -> None:
                    zero_end()

                staging[stg] = gathered[slot] * 2.0
                write_rows(gm, stg)

            return carry

        lax.fori_loop(0, max_gm, tile, None)

        @pl.when(jnp.logical_or(max_gm == 0, local_gm == 0))
        def _zeroed_without_work() -> None:
            zero_end()

        def drain_if_used(slot: int) -> None:
            @pl.when(max_gm > slot)
            def _drain_slot() -> None:
                drain(slot)

        @pl.when(max_gm > 0)
        def _epilogue() -> None:
            for s in range(SLOTS):
                drain_if_used(s)

        barrier()  # every chip's sends have landed
        wait_rows(recv_sem.at[0], out_hbm.at[pl.ds(0, nums_ref[2])])

    return kernel


def _direct_write_call(
    kernel: Callable[..., None], safe: bool, *, collective_id: int | None = 0
) -> Any:
    def per_device(
        rows: jax.Array, tile_rows: jax.Array, nums: jax.Array, hidden: jax.Array
    ) -> jax.Array:
        if safe:
            dmas: Callable[[int], Any] = sd.dma_semaphores
            buffers: Callable[..., Any] = sd.vmem
            smem: Callable[..., Any] = sd.smem
        else:
            dmas, buffers, smem = pltpu.SemaphoreType.DMA, pltpu.VMEM, pltpu.SMEM
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            kernel,
            jax.ShapeDtypeStruct((OUT, 8, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=3,
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=[
                    buffers((2, TILE, 8, 128), jnp.float32),
                    buffers((SLOTS, TILE, 8, 128), jnp.float32),
                    smem((2 * SLOTS,), jnp.int32),
                    dmas((2,)),
                    dmas((SLOTS,)),
                    dmas((SLOTS,)),
                    dmas((1,)),
                    dmas((1,)),
                ],
            ),
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(rows[0], tile_rows[0], nums[0], hidden)
        return out

    return per_device


def _direct_write_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    return (
        sds((N, 6, GMS * TILE), jnp.int32),
        sds((N, GMS), jnp.int32),
        sds((N, 3), jnp.int32),
        sds((N * HIDDEN, 8, 128), jnp.float32),
    )


def _dw(safe: bool, seed: str | None = None, **options: Any) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    fn = _direct_write_call(_direct_write(safe, seed), safe, **options)
    return sharded(fn, mesh, (ALONG_X,) * 4), mesh


def test_direct_write_reduce_scatter_matches_raw() -> None:
    ours, mesh = _dw(SAFE)
    theirs, _ = _dw(RAW)
    assert_same_mosaic(ours, theirs, *_direct_write_args(mesh), mesh=mesh)
    text = mosaic_text(ours, *_direct_write_args(mesh), mesh=mesh)
    # Each row's write to its chip is a remote DMA (source semaphore and device id): one in
    # four of the loop's DMAs (the gather at the first tile, the prefetch, the two writes),
    # plus the zero fill's one. (jax 0.10.2 prints the main loop's body twice.)
    remote = text.count("array<i32: 1, 1, 1, 1, 1, 0")
    assert remote in (TILE, 2 * TILE), text
    assert text.count('enqueue_dma"(') == 4 * remote + 1, text


@pytest.mark.parametrize(
    ("seed", "where", "what"),
    [
        ("local_drain_dropped", "# WRITTEN", "LocalCopy staging.at[...]"),
        ("gather_wait_dropped", "# GATHERED", "LocalCopy hidden_hbm.at[...]"),
    ],
)
def test_direct_write_drain_dropped_is_t7_naming_the_start(
    seed: str, where: str, what: str
) -> None:
    broken, mesh = _dw(SAFE, seed)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    message = str(err.value)
    assert f"{what}" in message, message
    assert f"started at {__file__}:{line_in(_direct_write, where)}" in message, message


def test_direct_write_send_semaphore_array_is_s2_at_the_users_line() -> None:
    broken, mesh = _dw(SAFE, "send_sem_is_the_recv_array")
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    assert line_in(_direct_write, "# SEEDED") in raising_lines(err, __file__)


def test_direct_write_gather_into_both_slots_is_t1_at_the_users_line() -> None:
    broken, mesh = _dw(SAFE, "gather_into_both_slots")
    with pytest.raises(sd.CopyShapeMismatchError) as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    assert line_in(_direct_write, "# GATHERED") in raising_lines(err, __file__)


def test_direct_write_barrier_without_collective_id_is_t9() -> None:
    broken, mesh = _dw(SAFE, collective_id=None)
    with pytest.raises(sd.MissingCollectiveIdError):
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)


def _direct_write_tables() -> tuple[jax.Array, ...]:
    """Two tiles per device; row r of device d goes to chip (d + r) % N at row 2d + r // 4
    (no two senders share a row), sent if that chip is another one, written if it is d."""
    tiles = 2
    rows = np.zeros((N, 6, GMS * TILE), np.int32)
    for d in range(N):
        for r in range(tiles * TILE):
            chip = (d + r) % N
            rows[d, :, r] = (r, 1, chip, 2 * d + r // TILE, chip != d, chip == d)
    tile_rows = np.full((N, GMS), TILE, np.int32)
    nums = np.tile(np.array([tiles, tiles, 2 * (N - 1)], np.int32), (N, 1))
    hidden = np.zeros((N * HIDDEN, 8, 128), np.float32)
    return tuple(jnp.asarray(a) for a in (rows, tile_rows, nums, hidden))


@pytest.mark.parametrize("safe", [RAW, SAFE], ids=["raw", "safedma"])
def test_direct_write_zero_fill_after_the_barrier_races_with_a_peers_row(safe: bool) -> None:
    # The author's order: the output is zeroed by DMA after the all-device barrier and
    # waited at the first tile, while a peer that passed the barrier may already be
    # writing its rows into it. Not a trace-time matter (the waits all balance).
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    fn = _direct_write_call(_direct_write(safe), safe)
    with pytest.raises(RaceDetectedError, match=r"out_hbm\[") as err:
        verify(fn, *_direct_write_tables(), mesh=mesh, in_specs=(P("x"),) * 4, out_specs=P("x"))
    zeroed = line_in(_direct_write, "# ZEROED" if safe else "# RAW ZERO")
    assert f"{__file__}:{zeroed}" in str(err.value), err.value


def test_direct_write_zeroed_before_the_barrier_verifies() -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    fn = _direct_write_call(_direct_write(SAFE, "zeroed_before_barrier"), SAFE)
    verify(fn, *_direct_write_tables(), mesh=mesh, in_specs=(P("x"),) * 4, out_specs=P("x"))


# --- a bidirectional reduce-scatter matmul with capacity semaphores -----------------------

LEFT, RIGHT = 0, 1
BM = 128  # block size of the pipelines
M_SHARD, N_HALF, K_DEV = BM, BM, BM  # rows per device, columns per direction, k per device


def _rs_matmul(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        x_hbm: Any,  # [N * M_SHARD, K_DEV]
        y_hbm: Any,  # [2 * N_HALF, K_DEV]
        o_hbm: Any,  # [M_SHARD, 2 * N_HALF]
        left_hbm: Any,  # [2, M_SHARD, N_HALF]: working and receiving halves, an output
        right_hbm: Any,
        left_recv: Any,
        left_send: Any,
        left_copy_sem: Any,  # declared by the author, never used
        right_copy_sem: Any,
        right_recv: Any,
        right_send: Any,
        left_capacity: Any,
        right_capacity: Any,
    ) -> None:
        del left_copy_sem, right_copy_sem
        me = lax.axis_index("x")
        outer, phase = pl.program_id(0), pl.program_id(1)
        num_outer, num_phases = pl.num_programs(0), pl.num_programs(1)
        step = outer * num_phases + phase
        steps = num_outer * num_phases
        is_start = jnp.logical_and(outer == 0, phase == 0)
        is_end = step == steps - 1
        left_work = lax.rem(outer, 2)
        right_work = lax.rem(pl.cdiv(step, 2), 2)
        left_id = lax.rem(me - 1 + N, N)
        right_id = lax.rem(me + 1 + N, N)

        def signal(sem: Any, to: Any) -> None:
            if safe:
                sd.signal(sem, 1, device=sd.mesh_coords(to))
            else:
                pl.semaphore_signal(sem, inc=1, device_id=(to,))

        def wait(sem: Any) -> None:
            if safe:
                sd.wait(sem, 1)
            else:
                pl.semaphore_wait(sem, 1)

        def describe(hbm: Any, work: Any, send: Any, recv: Any, to: Any) -> Any:
            src, dst = hbm.at[work], hbm.at[1 - work]
            if seed == "capacity_as_recv" and recv is right_recv:
                recv = right_capacity
            if not safe:
                return pltpu.make_async_remote_copy(
                    src_ref=src, dst_ref=dst, send_sem=send, recv_sem=recv, device_id=(to,)
                )
            copy = sd.RemoteCopy(src, dst, recv)  # DESCRIBED
            return copy.with_send_sem(send).to(sd.mesh_coords(to))

        left_copy = describe(left_hbm, left_work, left_send, left_recv, left_id)
        right_copy = describe(right_hbm, right_work, right_send, right_recv, right_id)

        @pl.when(is_start)
        def _prologue() -> None:
            # A barrier with both neighbours, then a second one on a scoped REGULAR
            # semaphore; then each neighbour may send one block.
            if safe:
                barrier = sd.barrier_semaphore()
                for to in (left_id, right_id):
                    sd.signal(barrier, 1, device=sd.mesh_coords(to))
                sd.wait(barrier, 2)

                def second(sem: sd.RegularSem) -> None:
                    for to in (left_id, right_id):
                        sd.signal(sem, 1, device=sd.mesh_coords(to))
                    sd.wait(sem, 2)

                sd.run_scoped(second, sd.regular_semaphore())
            else:
                barrier = pltpu.get_barrier_semaphore()
                for to in (left_id, right_id):
                    pl.semaphore_signal(barrier, inc=1, device_id=(to,))
                pl.semaphore_wait(barrier, 2)

                def raw_second(sem: Any) -> None:
                    for to in (left_id, right_id):
                        pl.semaphore_signal(sem, inc=1, device_id=(to,))
                    pl.semaphore_wait(sem, 2)

                pl.run_scoped(raw_second, pltpu.SemaphoreType.REGULAR)
            signal(right_capacity, left_id)
            signal(left_capacity, right_id)

        middle = jnp.logical_not(jnp.logical_or(is_start, is_end))
        started: list[Any] = []

        @pl.when(middle)
        def _send() -> None:
            @pl.when(phase == LEFT)
            def _right() -> None:
                wait(right_capacity)  # the right neighbour has room for a block
                started.append(right_copy.start())  # STARTED

            @pl.when(phase == RIGHT)
            def _left() -> None:
                wait(left_capacity)
                left_copy.start()

        def matmul(x_ref: Any, y_ref: Any, prev_ref: Any, z_ref: Any) -> None:
            z_ref[...] = prev_ref[...] + lax.dot_general(
                x_ref[...], y_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )

        emit = sd.emit_pipeline if safe else pltpu.emit_pipeline
        block = pl.BlockSpec((BM, BM), lambda i, j, k: (i, j))
        matmul_pipeline = emit(
            matmul,
            in_specs=[
                pl.BlockSpec((BM, BM), lambda i, j, k: (i, k)),
                pl.BlockSpec((BM, BM), lambda i, j, k: (j, k)),
                block,
            ],
            out_specs=block,
            grid=(M_SHARD // BM, N_HALF // BM, K_DEV // BM),
        )

        def save(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...]

        tile = pl.BlockSpec((BM, BM), lambda i, j: (i, j))
        save_pipeline = emit(
            save, in_specs=[tile], out_specs=tile, grid=(M_SHARD // BM, N_HALF // BM)
        )

        @pl.when(step < steps - 2)
        def _accumulate() -> None:
            @pl.when(phase == LEFT)
            def _left() -> None:
                rows = x_hbm.at[pl.ds(lax.rem(outer + me, N) * M_SHARD, M_SHARD)]
                work = left_hbm.at[left_work]
                matmul_pipeline(rows, y_hbm.at[pl.ds(0, N_HALF), :], work, work)

            @pl.when(phase == RIGHT)
            def _right() -> None:
                rows = x_hbm.at[pl.ds(lax.rem(me - outer + N, N) * M_SHARD, M_SHARD)]
                work = right_hbm.at[right_work]
                matmul_pipeline(rows, y_hbm.at[pl.ds(N_HALF, N_HALF), :], work, work)

        @pl.when(step >= steps - 2)
        def _save() -> None:
            @pl.when(phase == LEFT)
            def _left() -> None:
                save_pipeline(left_hbm.at[left_work], o_hbm.at[:, pl.ds(0, N_HALF)])

            @pl.when(phase == RIGHT)
            def _right() -> None:
                save_pipeline(right_hbm.at[right_work], o_hbm.at[:, pl.ds(N_HALF, N_HALF)])

        @pl.when(middle)
        def _epilogue() -> None:
            @pl.when(phase == LEFT)
            def _right() -> None:
                if not safe:
                    right_copy.wait()
                elif seed == "start_handle_kept":
                    started[0].wait()  # ESCAPED
                elif seed != "right_wait_dropped":
                    right_copy.started_elsewhere().wait()
                signal(right_capacity, left_id)  # hand the room back

            @pl.when(phase == RIGHT)
            def _left() -> None:
                if safe:
                    left_copy.started_elsewhere().wait()
                else:
                    left_copy.wait()
                signal(left_capacity, right_id)

        @pl.when(outer == num_outer - 1)
        def _drain_capacity() -> None:  # every semaphore leaves the kernel at zero
            @pl.when(phase == LEFT)
            def _left() -> None:
                wait(right_capacity)

            @pl.when(phase == RIGHT)
            def _right() -> None:
                wait(left_capacity)

    return kernel


def _rs_matmul_call(
    kernel: Callable[..., None], safe: bool, *, collective_id: int | None = 0
) -> Any:
    def per_device(x: jax.Array, y: jax.Array) -> jax.Array:
        dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
        regular = sd.regular_semaphore() if safe else pltpu.SemaphoreType.REGULAR
        half = jax.ShapeDtypeStruct((2, M_SHARD, N_HALF), jnp.float32)
        call = sd.pallas_call if safe else pl.pallas_call
        out, _, _ = call(
            kernel,
            (jax.ShapeDtypeStruct((M_SHARD, 2 * N_HALF), jnp.float32), half, half),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY, ANY],
                out_specs=[ANY, ANY, ANY],
                grid=(N + 1, 2),
                scratch_shapes=[dma] * 6 + [regular] * 2,
            ),
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(x, y)
        result: jax.Array = out
        return result

    return per_device


def _rs_matmul_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, P("x")))

    return sds((N * N * M_SHARD, K_DEV)), sds((N * 2 * N_HALF, K_DEV))


def _rsm(safe: bool, seed: str | None = None, **options: Any) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")  # emit_pipeline asks for the generation
    return sharded(
        _rs_matmul_call(_rs_matmul(safe, seed), safe, **options), mesh, (ALONG_X,) * 2
    ), mesh


def test_bidirectional_reduce_scatter_matmul_matches_raw() -> None:
    ours, mesh = _rsm(SAFE)
    theirs, _ = _rsm(RAW)
    assert_same_mosaic(ours, theirs, *_rs_matmul_args(mesh), mesh=mesh)


def test_reduce_scatter_matmul_epilogue_wait_dropped_is_t7() -> None:
    broken, mesh = _rsm(SAFE, "right_wait_dropped")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_rs_matmul_args(mesh), mesh=mesh)
    message = str(err.value)
    start = line_in(_rs_matmul, "# STARTED")
    assert "RemoteCopy right_hbm.at[...]" in message, message
    assert f"started at {__file__}:{start}" in message, message
    assert "wait_send() and wait_recv() never called" in message, message
    # The author's epilogue waits both sides with one wait(): the fix names it .
    assert "copy.started_elsewhere().wait() for both sides" in message, message


def test_reduce_scatter_matmul_start_handle_waited_in_the_epilogue_names_both() -> None:
    broken, mesh = _rsm(SAFE, "start_handle_kept")
    with pytest.raises(sd.HandleEscapedError, match=r"pl\.when / lax\.cond") as err:
        mosaic_text(broken, *_rs_matmul_args(mesh), mesh=mesh)
    message = str(err.value)
    assert f"{__file__}:{line_in(_rs_matmul, '# ESCAPED')}" in message, message
    assert "copy.started_elsewhere().wait()" in message, message


def test_reduce_scatter_matmul_capacity_semaphore_as_receive_semaphore_is_s3() -> None:
    broken, mesh = _rsm(SAFE, "capacity_as_recv")
    with pytest.raises(sd.SemaphoreKindError, match=r"REGULAR semaphore \(right_capacity ") as err:
        mosaic_text(broken, *_rs_matmul_args(mesh), mesh=mesh)
    assert line_in(_rs_matmul, "# DESCRIBED") in raising_lines(err, __file__)


def test_reduce_scatter_matmul_barrier_without_collective_id_is_t9() -> None:
    broken, mesh = _rsm(SAFE, collective_id=None)
    with pytest.raises(sd.MissingCollectiveIdError):
        mosaic_text(broken, *_rs_matmul_args(mesh), mesh=mesh)


# --- a ragged all-to-all as a DMA future: sends started in one kernel, waited in another ---

SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
A2A_ROWS = 32


def _ra2a(safe: bool, start: bool, seed: str | None = None) -> Callable[..., None]:
    """One body for both kernels (google-deepmind/simply's ``_ra2a_3d_kernel_async``): the
    start kernel starts the sends to every other device and the local copy, on a 3-D
    semaphore array it returns; the wait kernel rebuilds them and waits the sends, the
    receives (never started here: another device's sends) and the local copy."""

    def body(
        src_ref: Any,
        out_ref: Any,
        in_off: Any,
        send_sizes: Any,
        out_off: Any,
        recv_sizes: Any,
        dst_ref: Any,
        sems: Any,
    ) -> None:
        del out_ref  # aliased in dst_ref
        me = lax.axis_index("x")

        def local() -> Any:
            sem = sems.at[lax.rem(me + me, N), 0, 1]
            src = src_ref.at[pl.ds(in_off[me], send_sizes[me])]
            dst = dst_ref.at[pl.ds(out_off[me], send_sizes[me])]
            return sd.LocalCopy(src, dst, sem) if safe else pltpu.make_async_copy(src, dst, sem)

        def remote(other: Any, send: bool) -> Any:
            src_id, dst_id = (me, other) if send else (other, me)
            size = lax.select(me == src_id, send_sizes[dst_id], recv_sizes[src_id])
            src = src_ref.at[pl.ds(in_off[dst_id], size)]
            dst = dst_ref.at[pl.ds(out_off[dst_id], size)]
            slot = lax.rem(me + other, N)
            direction = (src_id > dst_id).astype(jnp.int32)
            send_sem, recv_sem = sems.at[slot, direction, 0], sems.at[slot, direction, 1]
            if seed == "recv_on_the_pair" and not start:
                recv_sem = sems.at[slot, direction]
            if not safe:
                return pltpu.make_async_remote_copy(
                    src, dst, send_sem, recv_sem, device_id={"x": dst_id}
                )
            copy = sd.RemoteCopy(src, dst, recv_sem)  # DESCRIBED
            if seed == "unknown_axis":
                return copy.with_send_sem(send_sem).to(sd.device(y=dst_id))  # AXIS
            return copy.with_send_sem(send_sem).to(sd.device(x=dst_id))

        def barrier(sem: Any) -> None:
            for i in range(1, N):
                to = lax.rem(me + i, N)
                if safe:
                    sd.signal(sem, 1, device=sd.device(x=to))
                else:
                    pl.semaphore_signal(sem, inc=1, device_id={"x": to})
            if safe:
                sd.wait(sem, N - 1)
            else:
                pl.semaphore_wait(sem, N - 1)

        barrier(sd.barrier_semaphore() if safe else pltpu.get_barrier_semaphore())
        copy = local()
        others = [lax.rem(me + i, N) for i in range(1, N)]
        sends = [remote(other, send=True) for other in others]
        receives = [remote(other, send=False) for other in others]
        if start:
            for send in sends:
                send.start()  # STARTED
            if seed != "local_not_started":
                copy.start()
        elif not safe:
            for op in sends:
                op.wait_send()
            for op in receives:
                op.wait_recv()
            copy.wait()
        else:
            if seed != "send_waits_dropped":
                for send in sends:
                    send.started_elsewhere().wait_send()
            for receive in receives:
                if seed == "receive_waited_as_send":
                    receive.incoming().wait_send()  # WRONG SIDE
                else:
                    receive.incoming().wait_recv()
            copy.started_elsewhere().wait()

        scoped = sd.run_scoped if safe else pl.run_scoped
        regular = sd.regular_semaphore() if safe else pltpu.SemaphoreType.REGULAR
        scoped(barrier, regular)  # the second barrier, on a scoped REGULAR semaphore

    if start:
        return body

    def wait_kernel(*refs: Any) -> None:  # the semaphores come in before the output
        *operands, sems, dst_ref = refs
        body(*operands, dst_ref, sems)

    return wait_kernel


def _ra2a_calls(safe: bool, seed: str | None = None) -> Any:
    call = sd.pallas_call if safe else pl.pallas_call
    sems = sd.dma_semaphores((N, 2, 2)) if safe else pltpu.SemaphoreType.DMA((N, 2, 2))

    def per_device(*args: jax.Array) -> jax.Array:
        src, output, in_off, send_sizes, out_off, recv_sizes = args
        meta = (in_off, send_sizes, out_off, recv_sizes)
        out, future_sems = call(
            _ra2a(safe, True, seed),
            [output, sems],  # the output array as its own shape, and the semaphores
            in_specs=2 * [ANY] + 4 * [SMEM],
            out_specs=[ANY, SEM],
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(collective_id=1),
        )(src, output, *meta)
        done: jax.Array = call(
            _ra2a(safe, False, seed),
            output,
            in_specs=2 * [ANY] + 4 * [SMEM] + [SEM],
            out_specs=ANY,
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(src, out, *meta, future_sems)
        return done

    return per_device


def _ra2a_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    rows = sds((N * A2A_ROWS, 128), jnp.float32)
    table = sds((N * N,), jnp.int32)
    return rows, rows, table, table, table, table


def _future(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    return sharded(_ra2a_calls(safe, seed), mesh, (ALONG_X,) * 6), mesh


def test_ragged_all_to_all_future_matches_raw() -> None:
    ours, mesh = _future(SAFE)
    theirs, _ = _future(RAW)
    assert_same_mosaic(ours, theirs, *_ra2a_args(mesh), mesh=mesh)


def _ra2a_tables() -> tuple[jax.Array, ...]:
    """Every device sends 2 rows to every device (itself included); sender s's rows land at
    rows 2s of each receiver."""
    in_off = np.tile(2 * np.arange(N, dtype=np.int32), N)
    sizes = np.full(N * N, 2, np.int32)
    out_off = np.repeat(2 * np.arange(N, dtype=np.int32), N)
    rows = np.zeros((N * A2A_ROWS, 128), np.float32)
    return tuple(jnp.asarray(a) for a in (rows, rows, in_off, sizes, out_off, sizes))


def test_ragged_all_to_all_future_verifies_across_its_two_kernels() -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    for safe in (RAW, SAFE):
        verify(
            _ra2a_calls(safe), *_ra2a_tables(), mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x")
        )


def test_ragged_all_to_all_future_send_waits_dropped_is_r2_in_verify() -> None:
    # Not a trace-time matter: the start kernel leaves its sends in flight on purpose (on
    # the semaphores it returns), and the wait kernel starts nothing.
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    fn = _ra2a_calls(SAFE, "send_waits_dropped")
    with pytest.raises(LeftoverSemaphoreError, match="passed between kernels") as err:
        verify(fn, *_ra2a_tables(), mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x"))
    assert f"{__file__}:{line_in(_ra2a, '# STARTED')}" in str(err.value)


def test_ragged_all_to_all_future_receive_on_a_semaphore_pair_is_s2() -> None:
    broken, mesh = _future(SAFE, "recv_on_the_pair")
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# DESCRIBED") in raising_lines(err, __file__)


def test_ragged_all_to_all_future_unknown_axis_is_t3() -> None:
    broken, mesh = _future(SAFE, "unknown_axis")
    with pytest.raises(sd.DeviceIdError, match="'y'") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# AXIS") in raising_lines(err, __file__)


def test_ragged_all_to_all_future_receive_waited_as_a_send_is_s5() -> None:
    broken, mesh = _future(SAFE, "receive_waited_as_send")
    with pytest.raises(sd.WrongOperationError, match=r"wait_recv\(\)") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# WRONG SIDE") in raising_lines(err, __file__)


# --- gradient tiles read, accumulated and written back inside a pipeline on each core ------

BB, BH, BV = 8, 128, 128  # block sizes
NB, NH, NV, CORES = 2, 2, 4, 2  # blocks of b, h, v; TensorCores


def _core_mesh() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(pltpu, "TensorCoreMesh"):
            return pltpu.TensorCoreMesh(axis_name="core", num_cores=CORES)
        return pltpu.create_tensorcore_mesh("core", num_cores=CORES)


def _grads(safe: bool, seed: str | None = None) -> Callable[..., None]:
    """tokamax's linear-softmax-cross-entropy backward (``bwd_kernel``): ``pl.kernel`` over the
    TensorCores, an ``emit_pipeline`` whose body gets four DMA semaphores through
    ``scratches=``. At the second stage of each step the body describes four copies of a
    gradient tile (read and write of x's and of w's), starts the reads under ``pl.when``
    (not on the first block, which has nothing to accumulate), starts each write in one of
    two complementary ``pl.when`` blocks (initialise, or wait the read and accumulate), and
    waits both writes after them, unconditionally."""

    def body(
        x_hbm: Any,
        w_hbm: Any,
        xg_hbm: Any,
        wg_hbm: Any,
        xw: Any,
        xg_tile: Any,
        wg_tile: Any,
        x_read_sem: Any,
        w_read_sem: Any,
        x_write_sem: Any,
        w_write_sem: Any,
    ) -> None:
        core = lax.axis_index("core")
        per_core = NV // CORES

        def step(
            x_ref: Any,
            w_ref: Any,
            xg_hbm: Any,
            wg_hbm: Any,
            xw: Any,
            xg_tile: Any,
            wg_tile: Any,
            x_read_sem: Any,
            w_read_sem: Any,
            x_write_sem: Any,
            w_write_sem: Any,
        ) -> None:
            b, v, stage, h = (pl.program_id(i) for i in range(4))
            gv = core * per_core + v

            @pl.when(stage == 0)
            def _xw() -> None:
                @pl.when(h == 0)
                def _init() -> None:
                    xw[...] = jnp.zeros_like(xw)

                xw[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

            @pl.when(stage == 1)
            def _grads() -> None:
                cols = jnp.minimum(NV * BV - BV * gv, BV)  # the last block may be short
                xg_slice = xg_hbm.at[core, pl.ds(b * BB, BB), pl.ds(h * BH, BH)]
                wg_slice = wg_hbm.at[pl.ds(h * BH, BH), pl.ds(gv * BV, cols)]
                wg_part = wg_tile.at[:, pl.ds(0, cols)]
                if seed == "write_from_the_whole_tile":
                    wg_part = wg_tile
                copy = sd.LocalCopy if safe else pltpu.make_async_copy
                x_write = copy(xg_tile, xg_slice, x_write_sem)
                w_write = copy(wg_part, wg_slice, w_write_sem)  # W WRITE
                x_read = copy(xg_slice, xg_tile, x_read_sem)
                w_read = copy(wg_slice, wg_part, w_read_sem)  # W READ

                def waited(desc: Any) -> Any:  # a copy started in another pl.when
                    return desc.started_elsewhere() if safe else desc

                @pl.when(b != 0)
                def _w_read() -> None:
                    w_read.start()  # READ STARTED

                @pl.when(v != 0)
                def _x_read() -> None:
                    x_read.start()

                x_part = jnp.dot(xw[...], w_ref[...].T, preferred_element_type=jnp.float32)
                w_part = jnp.dot(x_ref[...].T, xw[...], preferred_element_type=jnp.float32)

                @pl.when(b == 0)
                def _init_w() -> None:
                    wg_tile[...] = w_part
                    w_write.start()  # WRITE STARTED

                @pl.when(v == 0)
                def _init_x() -> None:
                    xg_tile[...] = x_part
                    x_write.start()

                @pl.when(b != 0)
                def _accumulate_w() -> None:
                    if seed != "read_wait_dropped":
                        waited(w_read).wait()
                    wg_tile[...] += w_part
                    w_write.start()

                @pl.when(v != 0)
                def _accumulate_x() -> None:
                    waited(x_read).wait()
                    xg_tile[...] += x_part
                    x_write.start()

                if seed == "write_waited_on_the_read":
                    waited(w_read).wait()
                else:
                    waited(w_write).wait()
                waited(x_write).wait()

        emit = sd.emit_pipeline if safe else pltpu.emit_pipeline
        hbm = pl.BlockSpec(memory_space=pltpu.HBM)
        emit(
            step,
            grid=(NB, per_core, 2, NH),
            in_specs=[
                pl.BlockSpec((BB, BH), lambda i, j, s, k: (i, k)),
                pl.BlockSpec((BH, BV), lambda i, j, s, k: (k, core * per_core + j)),
            ],
            out_specs=[hbm, hbm],
        )(
            x_hbm,
            w_hbm,
            xg_hbm,
            wg_hbm,
            scratches=(xw, xg_tile, wg_tile, x_read_sem, w_read_sem, x_write_sem, w_write_sem),
        )

    return body


def _grads_call(safe: bool, seed: str | None = None) -> Any:
    dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
    vmem = sd.vmem if safe else pltpu.VMEM
    entry = sd.core_kernel if safe else pl.kernel
    return entry(
        _grads(safe, seed),
        [
            jax.ShapeDtypeStruct((CORES, NB * BB, NH * BH), jnp.float32),
            jax.ShapeDtypeStruct((NH * BH, NV * BV), jnp.float32),
        ],
        mesh=_core_mesh(),
        scratch_types=(
            vmem((BB, BV), jnp.float32),
            vmem((BB, BH), jnp.float32),
            vmem((BH, BV), jnp.float32),
            dma,
            dma,
            dma,
            dma,
        ),
    )


GRAD_ARGS = (
    jax.ShapeDtypeStruct((NB * BB, NH * BH), jnp.float32),
    jax.ShapeDtypeStruct((NH * BH, NV * BV), jnp.float32),
)


def test_gradient_tiles_accumulated_by_dma_in_a_core_pipeline_match_raw() -> None:
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(_grads_call(SAFE), _grads_call(RAW), *GRAD_ARGS, mesh=mesh)


def _grads_seed(seed: str) -> None:
    mosaic_text(_grads_call(SAFE, seed), *GRAD_ARGS, mesh=abstract_mesh((), (), tpu="v5p"))


def test_gradient_read_never_waited_is_t7_in_the_pipeline_body() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        _grads_seed("read_wait_dropped")
    message = str(err.value)
    assert f"started at {__file__}:{line_in(_grads, '# READ STARTED')}" in message, message
    assert "LocalCopy wg_hbm.at[...]" in message, message


def test_gradient_write_waited_on_the_read_semaphore_is_t7_naming_the_write() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        _grads_seed("write_waited_on_the_read")
    message = str(err.value)
    assert f"started at {__file__}:{line_in(_grads, '# WRITE STARTED')}" in message, message


def test_gradient_whole_tile_written_to_a_traced_slice_is_t1_at_the_users_line() -> None:
    # The tile's static 128 columns opposite the slice's traced column count: Mosaic's
    # verifier rejects the copy on TPU ("Pallas encountered an internal verification
    # error. Please file a bug"); it passed trace time formerly .
    # Where a wait does not compare the shapes (jax 0.10.2) a descriptor is rejected where
    # it is started, since one only waited lowers there: the read back into
    # the whole tile (the same two refs, swapped) is started first.
    at_build = _compat.waits_compare_shapes()
    shapes = r"\(128, 128\) and \(128, \?\)" if at_build else r"\(128, \?\) and \(128, 128\)"
    with pytest.raises(sd.CopyShapeMismatchError, match=shapes) as err:
        _grads_seed("write_from_the_whole_tile")
    message = str(err.value)
    static = "source" if at_build else "destination"
    assert f"dimension 1 has a size fixed while tracing on the {static}" in message, message
    assert f"slice the {static} with the same traced size" in message, message
    line = line_in(_grads, "# W WRITE" if at_build else "# READ STARTED")
    assert line in raising_lines(err, __file__)


# --- a schedule read in windows into SMEM, double-buffered across a loop ------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Schedule:
    """The schedule: a step count and a per-step table (a pytree operand and in-spec)."""

    steps: Any
    rows: Any


WINDOW = 4  # schedule entries per window
SCHED_SPEC = pl.BlockSpec((8, 128), lambda i: (i, 0))


def _windows(safe: bool, seed: str | None = None) -> Callable[..., None]:
    """tpu-inference's stacked-RPA sliding-window decode (``rpa_kernel``): the schedule is
    copied HBM -> SMEM one window at a time (copies of a traced length); the first window
    is started before a ``fori_loop`` over windows, each iteration prefetches the next
    window into the other SMEM buffer under a parity ``pl.when`` and, under another, waits
    its own window on rebuilt descriptors (``jax.tree.map`` over the list) and runs an
    ``emit_pipeline`` whose allocations are ``BufferedRef``s given in ``scratch_shapes``."""

    def kernel(sched: _Schedule, x_hbm: Any, o_hbm: Any, allocs: Any, bufs: Any, sems: Any) -> None:
        steps = sched.steps[0]
        windows = pl.cdiv(steps, WINDOW)

        def copies(window: Any, slot: int) -> list[Any]:
            n = jnp.minimum(steps - window * WINDOW, WINDOW)
            src = sched.rows.at[pl.ds(pl.multiple_of(window * WINDOW, WINDOW), n)]
            dst = bufs[slot].at[pl.ds(0, n)]
            if seed == "whole_buffer":
                dst = bufs[slot]
            sem = sems if seed == "semaphore_array" else sems.at[slot]
            if safe:
                return [sd.LocalCopy(src, dst, sem)]  # DESCRIBED
            return [pltpu.make_async_copy(src, dst, sem)]

        for copy in copies(0, 0):
            copy.start()

        def run(w: Any, slot: int) -> None:
            waited = 0 if seed == "one_slot_waited" else slot
            jax.tree.map(lambda c: (c.started_elsewhere() if safe else c).wait(), copies(w, waited))

            def step(x_ref: Any, o_ref: Any) -> None:
                o_ref[...] = x_ref[...] + bufs[slot][0].astype(jnp.float32)

            emit = sd.emit_pipeline if safe else pltpu.emit_pipeline
            steps_here = jnp.minimum(steps - w * WINDOW, WINDOW)
            pipeline = emit(step, grid=(steps_here,), in_specs=[SCHED_SPEC], out_specs=[SCHED_SPEC])
            pipeline(x_hbm, o_hbm, allocations=allocs)

        def window(w: Any, carry: None) -> None:
            even = w % 2 == 0
            more = w + 1 < windows

            @pl.when(jnp.logical_and(more, even))
            def _prefetch_1() -> None:
                for copy in copies(w + 1, 1):
                    copy.start()  # PREFETCHED

            @pl.when(jnp.logical_and(more, jnp.logical_not(even)))
            def _prefetch_0() -> None:
                for copy in copies(w + 1, 0):
                    copy.start()

            @pl.when(even)
            def _compute_0() -> None:
                run(w, 0)

            @pl.when(jnp.logical_not(even))
            def _compute_1() -> None:
                run(w, 1)

            return carry

        lax.fori_loop(0, windows, window, None)

    return kernel


def _windows_call(safe: bool, seed: str | None = None) -> Any:
    allocs = (
        pltpu.BufferedRef.input(SCHED_SPEC, jnp.float32),
        pltpu.BufferedRef.output(SCHED_SPEC, jnp.float32),
    )
    smem = (sd.smem if safe else pltpu.SMEM)((WINDOW,), jnp.int32)
    sems = sd.dma_semaphores(2) if safe else pltpu.SemaphoreType.DMA((2,))
    call = sd.pallas_call if safe else pl.pallas_call
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)

    def per_call(steps: jax.Array, rows: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = call(
            _windows(safe, seed),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[_Schedule(pl.BlockSpec(memory_space=pltpu.SMEM), hbm), hbm],
                out_specs=hbm,
                # The pipeline's BufferedRef allocations are scratch entries, as the author
                # declares them; then the two SMEM windows and the semaphores.
                scratch_shapes=(allocs, (smem, smem), sems),
            ),
            compiler_params=pltpu.CompilerParams(disable_semaphore_checks=True),
        )(_Schedule(steps, rows), x)
        return out

    return per_call


WINDOW_ARGS = (
    jax.ShapeDtypeStruct((1,), jnp.int32),
    jax.ShapeDtypeStruct((16 * WINDOW,), jnp.int32),
    jax.ShapeDtypeStruct((16 * WINDOW * 8, 128), jnp.float32),
)


def _windows_seed(seed: str) -> None:
    mosaic_text(_windows_call(SAFE, seed), *WINDOW_ARGS, mesh=abstract_mesh((), (), tpu="v5p"))


def test_schedule_windows_double_buffered_in_smem_match_raw() -> None:
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(_windows_call(SAFE), _windows_call(RAW), *WINDOW_ARGS, mesh=mesh)


def test_schedule_window_wait_on_the_other_slot_is_t7_naming_the_prefetch() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        _windows_seed("one_slot_waited")
    message = str(err.value)
    assert f"started at {__file__}:{line_in(_windows, '# PREFETCHED')}" in message, message
    assert "LocalCopy sched.rows.at[...]" in message, message


def test_schedule_window_into_the_whole_buffer_is_t1_at_the_users_line() -> None:
    # The window's traced length against the SMEM buffer's fixed 4 entries .
    with pytest.raises(sd.CopyShapeMismatchError, match=r"\(\?,\) and \(4,\)") as err:
        _windows_seed("whole_buffer")
    built = "# DESCRIBED" if _compat.waits_compare_shapes() else "copy.start()"
    assert line_in(_windows, built) in raising_lines(err, __file__)


def test_schedule_window_on_the_semaphore_array_is_s2_at_the_users_line() -> None:
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        _windows_seed("semaphore_array")
    assert line_in(_windows, "# DESCRIBED") in raising_lines(err, __file__)
