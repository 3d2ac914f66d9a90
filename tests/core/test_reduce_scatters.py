"""Reduce-scatters: barriers, capacity semaphores and copies of traced sizes around
remote writes.

* a direct-write reduce-scatter (vLLM tpu-inference's
  ``experimental/fused_moe/gmm_fused_rs_nodedup.py``): an all-device barrier, a
  double-buffered row gather in a ``fori_loop`` whose trip count is read from SMEM, per
  row a remote and a local copy of size 0 or 1 on triple-buffered semaphores drained by
  size, a second barrier, then the receive semaphore drained by the total read from SMEM;
* a bidirectional reduce-scatter matmul (tpu-inference's
  ``collectives/reduce_scatter_matmul.py``): two remote copies per grid step, each started
  in one ``pl.when`` after a REGULAR capacity semaphore is waited and waited in another
  (the epilogue) that hands the capacity back; the working buffers are outputs filled by
  ``emit_pipeline``.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

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
from safedma.testing import (
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

N = 4  # devices
TILE, GMS, SLOTS = 4, 6, 3  # rows per tile, most tiles, staging slots
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
