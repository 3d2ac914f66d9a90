"""Patterns from other authors' Pallas TPU DMA code (docs/held-out.md, session 8), on
kernels written here.

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
  by ``emit_pipeline``.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False


def _line_of(function: Callable[..., Any], text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _raising_lines(err: pytest.ExceptionInfo[BaseException]) -> list[int]:
    return [f.lineno or 0 for f in traceback.extract_tb(err.tb) if f.filename == __file__]


def _sharded(fn: Callable[..., Any], mesh: Any, n_in: int) -> Any:
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=(P("x"),) * n_in, out_specs=P("x"), check_vma=False)
    )


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
                        staging.at[stg, pl.ds(i, send)], out_hbm.at[pl.ds(pos, send)], recv_sem.at[0]
                    )
                    target = sd.device(x=dest)
                    if seed == "send_sem_is_the_recv_array":
                        out.with_send_sem(recv_sem).to(target).start()  # SEEDED
                    else:
                        out.with_send_sem(send_sems.at[stg]).to(target).start()  # SENT
                    dst = out_hbm.at[pl.ds(pos, keep)]
                    sd.LocalCopy(staging.at[stg, pl.ds(i, keep)], dst, local_sems.at[stg]).start()  # WRITTEN
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

        barrier()
        for s in range(2 * SLOTS):
            counts[s] = jnp.int32(0)

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
                staging[stg] = gathered[slot] * 2.0
                write_rows(gm, stg)

            return carry

        lax.fori_loop(0, max_gm, tile, None)

        @pl.when(max_gm > 0)
        def _epilogue() -> None:
            for s in range(SLOTS):

                @pl.when(max_gm > s)
                def _drain_slot() -> None:
                    drain(s)

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
    return _sharded(fn, mesh, 4), mesh


def test_direct_write_reduce_scatter_matches_raw() -> None:
    ours, mesh = _dw(SAFE)
    theirs, _ = _dw(RAW)
    assert_same_mosaic(ours, theirs, *_direct_write_args(mesh), mesh=mesh)
    text = mosaic_text(ours, *_direct_write_args(mesh), mesh=mesh)
    # Each row's write to its chip is a remote DMA (source semaphore and device id): one in
    # four of the kernel's DMAs (the gather at the first tile, the prefetch, the two writes).
    # (jax 0.10.2 prints the loop body twice.)
    remote = text.count("array<i32: 1, 1, 1, 1, 1, 0")
    assert remote in (TILE, 2 * TILE), text
    assert text.count('enqueue_dma"(') == 4 * remote, text


@pytest.mark.parametrize(
    ("seed", "where", "what"),
    [
        ("local_drain_dropped", "# WRITTEN", "LocalCopy staging.at[...]"),
        ("gather_wait_dropped", "# GATHERED", "LocalCopy hidden_hbm.at[...]"),
    ],
)
def test_direct_write_drain_dropped_is_t7_naming_the_start(seed: str, where: str, what: str) -> None:
    broken, mesh = _dw(SAFE, seed)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    message = str(err.value)
    assert f"{what}" in message, message
    assert f"started at {__file__}:{_line_of(_direct_write, where)}" in message, message


def test_direct_write_send_semaphore_array_is_s2_at_the_users_line() -> None:
    broken, mesh = _dw(SAFE, "send_sem_is_the_recv_array")
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    assert _line_of(_direct_write, "# SEEDED") in _raising_lines(err)


def test_direct_write_gather_into_both_slots_is_t1_at_the_users_line() -> None:
    broken, mesh = _dw(SAFE, "gather_into_both_slots")
    with pytest.raises(sd.CopyShapeMismatchError) as err:
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
    assert _line_of(_direct_write, "# GATHERED") in _raising_lines(err)


def test_direct_write_barrier_without_collective_id_is_t9() -> None:
    broken, mesh = _dw(SAFE, collective_id=None)
    with pytest.raises(sd.MissingCollectiveIdError):
        mosaic_text(broken, *_direct_write_args(mesh), mesh=mesh)
