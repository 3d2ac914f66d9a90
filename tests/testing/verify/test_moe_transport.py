"""The expert-parallel MoE transport of tpu-inference ``kernels/fused_moe/v2`` under verify.

A weight-slab prefetch ring, per-row token gathers and per-destination commits on
parity-double-buffered semaphores waited by size, pushes at true length to every peer
(zero-length ones skipped), an own-destination hop, drains by totals, an all-pairs double
barrier at both ends.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SignalAfterExitError,
    abstract_mesh,
    verify,
)

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
MESH = pl.DeviceIdType.MESH


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------ the expert-parallel MoE transport

RB, TILE, NBUF, AHEAD = 8, 16, 3, 2  # rows per block, tile rows, weight slots, distance
TABLES = ("cstart", "clen", "coff", "pdst", "sends", "rows", "base", "tok", "visit", "nvisit")


def _moe_tables(ep: int, g: int) -> tuple[list[np.ndarray], int, int]:
    """Per device: expert e of device s sends ``(s + 2e + d) % 3`` blocks to device d."""
    runs = np.array(
        [[[(s + 2 * e + d) % 3 for d in range(ep)] for e in range(g)] for s in range(ep)],
        np.int32,
    )
    rows = runs.sum(-1) * RB
    base = np.zeros_like(rows)
    base[:, 1:] = np.cumsum(rows, -1)[:, :-1]
    cstart = np.zeros_like(runs)
    cstart[..., 1:] = np.cumsum(runs, -1)[..., :-1]
    coff = base[..., None] // RB + cstart  # block of run (e, d) in the commit buffer
    per_dest = runs.transpose(2, 0, 1).reshape(ep, ep * g)  # [d, s * g + e]
    off = np.zeros_like(per_dest)
    off[:, 1:] = np.cumsum(per_dest, -1)[:, :-1]
    pdst = off.reshape(ep, ep, g).transpose(1, 2, 0)  # block at d of (s, e)
    remote = ~np.eye(ep, dtype=bool)[:, None, :]
    sent = (runs * remote).sum((1, 2))
    got = np.array([(runs[:, :, d] * remote[:, 0, d][:, None]).sum() for d in range(ep)])
    sends = np.stack([sent, got], -1).astype(np.int32)  # blocks sent to / got from peers
    visit = np.array(
        [[e for e in range(g) if rows[s, e]] + [0] * int((rows[s] == 0).sum()) for s in range(ep)],
        np.int32,
    )
    nvisit = (rows > 0).sum(-1, keepdims=True).astype(np.int32)
    tok = np.array([np.arange(rows[s].sum() + TILE) % 7 for s in range(ep)], np.int32)
    tabs = dict(
        cstart=cstart,
        clen=runs,
        coff=coff,
        pdst=pdst,
        sends=sends,
        rows=rows,
        base=base,
        tok=tok,
        visit=visit,
        nvisit=nvisit,
    )
    recv = int(per_dest.sum(-1).min()) * RB  # rows every device receives at least
    return [np.ascontiguousarray(tabs[k]) for k in TABLES], int(per_dest.sum(-1).max()) * RB, recv


def _moe_kernel(*refs: Any, ep: int, g: int, seed: str, cols: int) -> None:
    it = iter(refs)
    cstart, clen, coff, pdst, sends, rows_sm, base_sm, tok, visit, nvisit = (
        next(it) for _ in TABLES
    )
    lhs_hbm, w_hbm, recv_hbm, contrib_hbm = (next(it) for _ in range(4))
    lhs_vm, w_vm, out_vm = (next(it) for _ in range(3))
    lhs_sems, w_sems, commit_sems, send_sem, recv_sem, hop_sem = (next(it) for _ in range(6))
    # shard i of ep: mesh coordinates (i,) on a 1-D mesh, (i // cols, i % cols) on a 2-D one
    me = lax.axis_index("x") if cols == 1 else lax.axis_index("x") * cols + lax.axis_index("y")

    def peer(i: Any) -> tuple[Any, ...]:
        return (i,) if cols == 1 else (i // cols, i % cols)

    def barrier() -> None:  # all pairs, twice (the second round on a scoped semaphore)
        sem = pltpu.get_barrier_semaphore()
        for i in range(ep):
            pl.semaphore_signal(sem, 1, device_id=peer(jnp.int32(i)), device_id_type=MESH)
        pl.semaphore_wait(sem, ep)

        def again(second: Any) -> None:
            for i in range(ep):
                pl.semaphore_signal(second, 1, device_id=peer(jnp.int32(i)), device_id_type=MESH)
            pl.semaphore_wait(second, ep)

        pl.run_scoped(again, pltpu.SemaphoreType.REGULAR)

    def weights(e: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(w_hbm.at[e], w_vm.at[slot], w_sems.at[slot])

    def wait_rows(sem: Any, ref: Any, n: Any) -> None:  # n rows' worth of bytes on sem
        pltpu.make_async_copy(ref.at[pl.ds(0, n)], ref.at[pl.ds(0, n)], sem).wait()

    def gather(row_base: Any, blocks: Any, slot: Any) -> None:
        def block(i: Any, c: Any) -> Any:
            for r in range(RB):
                t = tok[row_base + i * RB + r]
                dst = lhs_vm.at[slot, i * RB + r]
                pltpu.make_async_copy(lhs_hbm.at[t], dst, lhs_sems.at[slot]).start()
            return c

        lax.fori_loop(0, blocks, block, jnp.int32(0))

    for b in range(AHEAD):

        @pl.when(jnp.int32(b) < nvisit[0])
        def _(b: int = b) -> None:
            weights(visit[b], b).start(priority=1)

    if seed != "no_barrier":
        barrier()

    def expert(e: Any, vi: Any, carry: Any) -> Any:
        slot = lax.rem(vi, NBUF)
        weights(e, slot).wait()

        @pl.when(vi + AHEAD < nvisit[0])
        def _() -> None:
            weights(visit[vi + AHEAD], lax.rem(vi + AHEAD, NBUF)).start(priority=1)

        rows = rows_sm[e]
        n_tiles = (rows + TILE - 1) // TILE

        def tile(t: Any, c: Any) -> Any:
            count, p0, p1 = c
            live = jnp.minimum(rows - t * TILE, TILE)
            parity = lax.rem(count, 2)
            pending = jnp.where(parity == 0, p0, p1)
            if seed != "no_reuse_guard":

                @pl.when(pending > 0)
                def _() -> None:  # the commits that last read out_vm[parity]
                    wait_rows(commit_sems.at[parity], contrib_hbm, pending * RB)

            wait_rows(lhs_sems.at[parity], lhs_vm.at[parity], live)

            @pl.when(t + 1 < n_tiles)
            def _() -> None:
                nxt = jnp.minimum(rows - (t + 1) * TILE, TILE)
                gather(base_sm[e] + (t + 1) * TILE, nxt // RB, 1 - parity)

            value = lhs_vm[parity] + w_vm[slot][0:1, :]
            for sp in (0, 1):

                @pl.when(parity == sp)
                def _(sp: int = sp) -> None:
                    out_vm[sp] = value

            tbase = t * (TILE // RB)
            for d in range(ep):  # the tile's part of each destination's run
                lo = jnp.maximum(cstart[e, d], tbase)
                hi = jnp.minimum(cstart[e, d] + clen[e, d], tbase + live // RB)
                n = jnp.maximum(hi - lo, 0) * RB
                src = out_vm.at[parity, pl.ds((lo - tbase) * RB, n)]
                dst = contrib_hbm.at[pl.ds((coff[e, d] + lo - cstart[e, d]) * RB, n)]
                pltpu.make_async_copy(src, dst, commit_sems.at[parity]).start()
            blocks = live // RB
            return (
                count + 1,
                jnp.where(parity == 0, blocks, p0),
                jnp.where(parity == 1, blocks, p1),
            )

        carry = lax.fori_loop(0, n_tiles, tile, carry)

        @pl.when(vi + 1 < nvisit[0])
        def _() -> None:  # the next expert's first tile, into the parity it will use
            nx = visit[vi + 1]
            gather(base_sm[nx], jnp.minimum(rows_sm[nx], TILE) // RB, lax.rem(carry[0], 2))

        return carry

    def drain(c: Any) -> Any:
        for parity in (0, 1):

            @pl.when(c[1 + parity] > 0)
            def _(parity: int = parity) -> None:
                wait_rows(commit_sems.at[parity], contrib_hbm, c[1 + parity] * RB)

        return (c[0], jnp.int32(0), jnp.int32(0))

    def push(e: Any) -> None:
        for d in range(ep):
            n = clen[e, d] * RB
            src = contrib_hbm.at[pl.ds(coff[e, d] * RB, n)]
            dst = recv_hbm.at[pl.ds(pdst[e, d] * RB, n)]
            d_id = jnp.int32(d)
            remote = pltpu.make_async_remote_copy(
                src, dst, send_sem, recv_sem, device_id=peer(d_id), device_id_type=MESH
            )
            pl.when(jnp.logical_and(d_id != me, n > 0))(remote.start)  # to a peer
            hop = pltpu.make_async_copy(src, dst, hop_sem)
            pl.when(jnp.logical_and(d_id == me, n > 0))(hop.start)  # to itself, waited last

    def step(vi: Any, c: Any) -> Any:
        e = visit[vi]
        c = expert(e, vi, c)
        if seed != "no_drain":
            c = drain(c)
        push(e)
        return c

    @pl.when(nvisit[0] > 0)
    def _() -> None:
        gather(base_sm[visit[0]], jnp.minimum(rows_sm[visit[0]], TILE) // RB, jnp.int32(0))

    zero = jnp.int32(0)
    c = lax.fori_loop(0, nvisit[0], step, (zero, zero, zero))
    if seed == "no_drain":
        drain(c)
    wait_rows(send_sem, contrib_hbm, sends[0] * RB)
    if seed != "no_recv_wait":
        wait_rows(recv_sem, recv_hbm, sends[1] * RB)
    mine = clen[0, me]
    for e in range(1, g):
        mine = mine + clen[e, me]
    wait_rows(hop_sem, recv_hbm, mine * RB)
    barrier()


def _verify_moe(ep: int, seed: str = "", g: int = 3, cols: int = 1) -> Any:
    tabs, recv_rows, keep = _moe_tables(ep, g)
    contrib_rows = int(max(t.sum() for t in tabs[TABLES.index("rows")])) + TILE
    dma = pltpu.SemaphoreType.DMA
    call = pl.pallas_call(
        functools.partial(_moe_kernel, ep=ep, g=g, seed=seed, cols=cols),
        out_shape=(_s(recv_rows, 128), _s(contrib_rows, 128)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(TABLES),
            in_specs=[ANY, ANY],
            out_specs=(ANY, ANY),
            grid=(),
            scratch_shapes=[
                pltpu.VMEM((2, TILE, 128), F32),
                pltpu.VMEM((NBUF, 8, 128), F32),
                pltpu.VMEM((2, TILE, 128), F32),
                dma((2,)),
                dma((NBUF,)),
                dma((2,)),
                dma,
                dma,
                dma,
            ],
        ),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )

    axes: Any = "x" if cols == 1 else ("x", "y")
    mesh = abstract_mesh((ep,), ("x",)) if cols == 1 else abstract_mesh((ep // cols, cols), axes)

    def per_device(*args: Any) -> Any:
        recv, _commits = call(*[a[0] for a in args[: len(TABLES)]], *args[len(TABLES) :])
        return recv[None, :keep]  # the rows every device receives

    return verify(
        per_device,
        *tabs,
        _s(ep * 7, 128),
        _s(ep * g, 8, 128),
        mesh=mesh,
        in_specs=tuple([P(axes)] * (len(TABLES) + 2)),
        out_specs=P(axes),
    )


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_the_moe_transport_is_clean(ep: int) -> None:
    assert _verify_moe(ep).devices == ep


def test_the_moe_transport_is_clean_on_a_2x4_mesh() -> None:
    assert _verify_moe(8, cols=4).devices == 8
    with pytest.raises(RaceDetectedError, match=r"\(x=\d, y=\d\)"):
        _verify_moe(8, "no_drain", cols=4)


@pytest.mark.parametrize(
    ("seed", "error", "text"),
    [
        ("no_barrier", SignalAfterExitError, "before it has entered this kernel call"),
        ("no_reuse_guard", RaceDetectedError, "data race"),
        ("no_drain", RaceDetectedError, "data race"),
        ("no_recv_wait", LeftoverSemaphoreError, "was never waited"),
    ],
)
def test_seeded_mistakes_in_the_moe_transport_are_caught(
    seed: str, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as err:
        _verify_moe(4, seed)
    message = str(err.value)
    assert text in message and "test_moe_transport.py:" in message, message
