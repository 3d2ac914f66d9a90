"""verify on the DMA protocols of reduce-scatter rings, a MoE transport and signals
between the cores of a chip (vLLM tpu-inference, ejkernel). Each kernel here is written for this file in raw pltpu and keeps one
author's DMA/semaphore protocol with the compute reduced to nothing; each correct one
must verify clean and each seeded mistake must be caught, naming this file's line.

* a copy whose source nothing wrote (``emit_pipeline`` copies in an input block
  that is the kernel's own output, garbage at the first step, which the body
  overwrites without reading: tpu-inference's reduce-scatter matmul accumulates
  into HBM scratch outputs this way): garbage moves with the copy and is an error
  only where it is read, naming the copy that brought it;
* a bidirectional ring reduce-scatter over a ``(devices + 1, 2)`` grid whose two
  phases interleave the leftward and rightward rings, HBM scratch outputs in two
  slots, capacity credits on REGULAR semaphores behind a double barrier
  (tpu-inference ``kernels/collectives/reduce_scatter_matmul.py``);
* an output the program never uses (HBM scratch declared as an output and dropped
  by the wrapper, as tpu-inference's fused MoE v2 drops its commit buffers): its
  unwritten rows are garbage nobody reads, not R6;
* the expert-parallel MoE transport of tpu-inference ``kernels/fused_moe/v2``: a
  weight-slab prefetch ring, per-row token gathers and per-destination commits on
  parity-double-buffered semaphores waited by size, pushes at true length to every
  peer (zero-length ones skipped), an own-destination hop, drains by totals, an
  all-pairs double barrier at both ends;
* ejkernel's bidirectional reduce-scatter matmul: every step credits both neighbours and
  waits both credits before both sends; a send's own credit comes from the far neighbour,
  so only the pair makes it safe (interleaving them races from three devices);
* the distributed guide's megacore advice: DMAs from one index of a "parallel" axis;
* a copy started with ``add=True`` (SparseCore: the destination += the source) is
  refused, not verified as a copy that overwrites (which would hide an add into a
  buffer nothing wrote);
* ``semaphore_signal(..., core_index=k)`` signals core k of the target device (as the
  core axis of a ``device_id`` dict does); it was taken as a signal to the signalling
  core itself, a deadlock false alarm on a megacore chip;
* tpu-inference's long-context RPA pipeline (``batched_rpa_long_ctx/pipeline.py``): a
  manual triple buffer, fetches two steps ahead, an in-place kv writeback waited in the
  step, outputs waited two steps behind; its slot of step - 2 is ``lax.rem(step - 2, 3)``,
  negative at steps 0 and 1 (an out-of-range semaphore index, R5, under 0-byte waits);
* a blocked output aliased to an input passed in HBM is that input's memory: the
  pipeline's copy-outs and the kernel's own copies through the input are checked against
  each other (verify kept two arrays before, and missed their race);
* what a caller reads of a kernel's outputs crosses a nested ``jax.jit``: a jitted kernel
  whose scratch output the caller drops (or slices) was checked as if read whole.
"""

from __future__ import annotations

import functools
import re
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
    DeadlockError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SemaphoreIndexError,
    SignalAfterExitError,
    SimulationError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    abstract_mesh,
    verify,
)

F32 = jnp.float32
HERE = r"test_reduce_scatter_rings_moe_transport_and_core_signals\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
MESH = pl.DeviceIdType.MESH


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------ a copy of a source nothing wrote


def _staged(after: str) -> Any:
    """Copy a staging buffer nothing wrote into ``buf``, then ``after`` with ``buf``.

    ``overwrite``: write all of ``buf`` before copying it out (the copied garbage is
    never used: clean). ``read``: copy ``buf`` out (R6 at the kernel's return, naming
    both copies). ``over_written``: ``buf`` was written first, and the garbage lands on
    it before it is copied out (R6 too).
    """

    def kernel(x_hbm: Any, o_hbm: Any, stage: Any, buf: Any, sem: Any) -> None:
        if after == "over_written":
            pltpu.sync_copy(x_hbm, buf)
        c = pltpu.make_async_copy(stage, buf, sem)  # stage: nothing wrote it
        c.start()
        c.wait()
        if after == "overwrite":
            pltpu.sync_copy(x_hbm, buf)
        pltpu.sync_copy(buf, o_hbm)

    return pl.pallas_call(
        kernel,
        out_shape=_s(16, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.VMEM((16, 128), F32)]
        + [pltpu.SemaphoreType.DMA],
    )


def test_a_copy_of_garbage_that_is_overwritten_unread_is_clean() -> None:
    assert verify(_staged("overwrite"), _s(16, 128)).dmas == 3


@pytest.mark.parametrize("after", ["read", "over_written"])
def test_garbage_a_copy_brought_is_reported_where_it_is_read(after: str) -> None:
    with pytest.raises(UnwrittenReadError) as err:
        verify(_staged(after), _s(16, 128))
    text = str(err.value)
    assert "the kernel returns output o_hbm[0:16, 0:128]" in text, text
    # handed to verify bare (no user frame around the call): the kernel's own line
    assert re.search(rf"returns output o_hbm\[0:16, 0:128\] at \S*{HERE} \(kernel\)", text), text
    assert re.search(rf"the copy at \S*{HERE}.*filled it from buf\[0:16, 0:128\]", text), text
    assert "filled it from stage[0:16, 0:128], which nothing wrote" in text, text


# ------------------------------------ a bidirectional reduce-scatter ring with credits

LEFT, RIGHT = 0, 1


def _signal(sem: Any, to: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=(to,), device_id_type=MESH)


def _double_barrier(left: Any, right: Any) -> None:
    """Both neighbours, twice (the second round on a scoped REGULAR semaphore)."""
    barrier = pltpu.get_barrier_semaphore()
    _signal(barrier, left)
    _signal(barrier, right)
    pl.semaphore_wait(barrier, 2)

    def again(second: Any) -> None:
        _signal(second, left)
        _signal(second, right)
        pl.semaphore_wait(second, 2)

    pl.run_scoped(again, pltpu.SemaphoreType.REGULAR)


def _rs_kernel(
    x_ref: Any,
    o_ref: Any,
    lsc: Any,
    rsc: Any,
    lrecv: Any,
    lsend: Any,
    rrecv: Any,
    rsend: Any,
    lcap: Any,
    rcap: Any,
    *,
    n: int,
    seed: str,
) -> None:
    """Grid (n + 1, 2): phase LEFT computes the leftward ring's partial sum into its
    working slot and forwards the rightward ring's, phase RIGHT the other way round;
    ``lsc``/``rsc`` are HBM outputs of two slots (working, receiving) used as scratch.
    """
    me = lax.axis_index("x")
    right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
    outer, phase = pl.program_id(0), pl.program_id(1)
    g = outer * 2 + phase
    steps = pl.num_programs(0) * 2
    first = g == 0
    last = g == steps - 1
    middle = jnp.logical_not(jnp.logical_or(first, last))
    lw = lax.rem(outer, 2)
    rw = lax.rem(outer if seed == "wrong_slot" else (g + 1) // 2, 2)
    m, h = lsc.shape[1], lsc.shape[2]
    lcopy = pltpu.make_async_remote_copy(
        lsc.at[lw], lsc.at[1 - lw], lsend, lrecv, device_id=(left,), device_id_type=MESH
    )
    rcopy = pltpu.make_async_remote_copy(
        rsc.at[rw], rsc.at[1 - rw], rsend, rrecv, device_id=(right,), device_id_type=MESH
    )

    @pl.when(first)
    def _() -> None:
        if seed != "no_barrier":
            _double_barrier(left, right)
        _signal(rcap, left)  # the left neighbour may send to us (rightwards)
        _signal(lcap, right)

    @pl.when(jnp.logical_and(middle, phase == LEFT))
    def _() -> None:
        if seed != "no_credit":
            pl.semaphore_wait(rcap, 1)
        rcopy.start()

    @pl.when(jnp.logical_and(middle, phase == RIGHT))
    def _() -> None:
        pl.semaphore_wait(lcap, 1)
        lcopy.start()

    def accumulate(x_blk: Any, prev_blk: Any, z_blk: Any) -> None:
        @pl.when(outer == 0)
        def _() -> None:
            z_blk[...] = x_blk[...]  # prev_blk is the output's garbage here: unread

        @pl.when(outer != 0)
        def _() -> None:
            z_blk[...] = prev_blk[...] + x_blk[...]

    spec = pl.BlockSpec((8, h), lambda i: (i, 0))
    acc = pltpu.emit_pipeline(accumulate, in_specs=[spec, spec], out_specs=spec, grid=(m // 8,))

    @pl.when(jnp.logical_and(g < steps - 2, phase == LEFT))
    def _() -> None:
        rows = x_ref.at[pl.ds(lax.rem(outer + me, n) * m, m), pl.ds(0, h)]
        acc(rows, lsc.at[lw], lsc.at[lw])

    @pl.when(jnp.logical_and(g < steps - 2, phase == RIGHT))
    def _() -> None:
        rows = x_ref.at[pl.ds(lax.rem(me - outer + n, n) * m, m), pl.ds(h, h)]
        acc(rows, rsc.at[rw], rsc.at[rw])

    def move(a: Any, b: Any) -> None:
        b[...] = a[...]

    save = pltpu.emit_pipeline(move, in_specs=[spec], out_specs=spec, grid=(m // 8,))

    @pl.when(jnp.logical_and(g >= steps - 2, phase == LEFT))
    def _() -> None:
        save(lsc.at[lw], o_ref.at[:, pl.ds(0, h)])

    @pl.when(jnp.logical_and(g >= steps - 2, phase == RIGHT))
    def _() -> None:
        save(rsc.at[rw], o_ref.at[:, pl.ds(h, h)])

    @pl.when(jnp.logical_and(middle, phase == LEFT))
    def _() -> None:
        if seed != "no_wait":
            rcopy.wait()
        _signal(rcap, left)

    @pl.when(jnp.logical_and(middle, phase == RIGHT))
    def _() -> None:
        lcopy.wait()
        _signal(lcap, right)

    @pl.when(jnp.logical_and(outer == pl.num_programs(0) - 1, phase == LEFT))
    def _() -> None:
        pl.semaphore_wait(rcap, 1)  # the last credit, so the semaphore ends at zero

    @pl.when(jnp.logical_and(outer == pl.num_programs(0) - 1, phase == RIGHT))
    def _() -> None:
        pl.semaphore_wait(lcap, 1)


def _reduce_scatter(x: jax.Array, *, n: int, seed: str) -> jax.Array:
    rows, k = x.shape
    m, h = rows // n, k // 2
    out: Any = pl.pallas_call(
        functools.partial(_rs_kernel, n=n, seed=seed),
        out_shape=(_s(m, k), _s(2, m, h), _s(2, m, h)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[ANY],
            out_specs=[ANY, ANY, ANY],
            grid=(n + 1, 2),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 4 + [pltpu.SemaphoreType.REGULAR] * 2,
        ),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)
    return out[0]


def _verify_rs(n: int, seed: str = "", invocations: int = 1) -> Any:
    return verify(
        functools.partial(_reduce_scatter, n=n, seed=seed),
        _s(16 * n * n, 256),
        mesh=abstract_mesh((n,), ("x",), tpu="v5e"),  # emit_pipeline asks for the TPU
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=invocations,
    )


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_the_credit_ring_reduce_scatter_is_clean(n: int, invocations: int) -> None:
    report = _verify_rs(n, invocations=invocations)
    assert report.devices == n and report.dmas > 0


@pytest.mark.parametrize(
    ("seed", "error", "text"),
    [
        ("no_wait", RaceDetectedError, "data race"),
        ("wrong_slot", RaceDetectedError, "nothing orders the two"),
        ("no_credit", SignalAfterExitError, "after it left the kernel"),
        ("no_barrier", SignalAfterExitError, "before it has entered this kernel call"),
    ],
)
@pytest.mark.parametrize("n", [2, 4])
def test_seeded_mistakes_in_the_credit_ring_are_caught(
    seed: str, error: type[Exception], text: str, n: int
) -> None:
    with pytest.raises(error) as err:
        _verify_rs(n, seed)
    message = str(err.value)
    assert (
        text in message
        and "test_reduce_scatter_rings_moe_transport_and_core_signals.py:" in message
    ), message
    assert "device " in message, message


# ------------------------------------------------------ an output the program drops


def _scratch_output(keep: bool) -> Any:
    """An HBM output used as scratch: rows 0:8 staged and copied on, 8:16 never
    written. The wrapper drops it (``keep=False``) or returns it."""

    def kernel(x_hbm: Any, o_hbm: Any, stage_hbm: Any, sem: Any) -> None:
        pltpu.sync_copy(x_hbm.at[pl.ds(0, 8)], stage_hbm.at[pl.ds(0, 8)])
        c = pltpu.make_async_copy(stage_hbm.at[pl.ds(0, 8)], o_hbm, sem)
        c.start()
        c.wait()

    def fn(x: jax.Array) -> Any:
        out, stage = pl.pallas_call(
            kernel,
            out_shape=(_s(8, 128), _s(16, 128)),
            in_specs=[ANY],
            out_specs=(ANY, ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)
        return (out, stage) if keep else out

    return fn


def test_an_output_the_program_drops_may_stay_partly_unwritten() -> None:
    assert verify(_scratch_output(keep=False), _s(16, 128)).dmas == 2


def test_the_same_output_returned_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match=r"8:16"):
        verify(_scratch_output(keep=True), _s(16, 128))


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
    assert (
        text in message
        and "test_reduce_scatter_rings_moe_transport_and_core_signals.py:" in message
    ), message


# ------------------------- the distributed guide's megacore advice: DMAs from one core


def _one_core_permute(n: int, cores: int, core: int) -> Any:
    """A grid axis of ``cores`` steps, "parallel"; only grid index ``core`` runs the
    barrier and an HBM-to-HBM remote copy (the guide's "Final Notes: Megacore")."""

    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me = lax.axis_index("x")
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)

        @pl.when(pl.program_id(0) == core)
        def _() -> None:
            barrier = pltpu.get_barrier_semaphore()
            _signal(barrier, left)
            _signal(barrier, right)
            pl.semaphore_wait(barrier, 2)
            copy = pltpu.make_async_remote_copy(
                x_ref, o_ref, send, recv, device_id=(right,), device_id_type=MESH
            )
            copy.start()
            copy.wait()

    def fn(x: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(cores,),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            compiler_params=pltpu.CompilerParams(
                collective_id=0, dimension_semantics=("parallel",)
            ),
        )(x)

    return fn


@pytest.mark.parametrize(
    ("tpu", "cores", "core"),
    [("v5p", 2, 0), ("v5p", 2, 1), ("v5e", 2, 0), ("v5e", 2, 1), ("tpu7x", 1, 0)],
)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_dmas_from_one_core_of_a_parallel_axis_are_clean(
    n: int, tpu: str, cores: int, core: int
) -> None:
    report = verify(
        _one_core_permute(n, cores, core),
        _s(8 * n, 128),
        mesh=abstract_mesh((n,), ("x",), tpu=tpu),
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=2,
    )
    assert report.dmas == 2 * n


# ------------- a reduce-scatter whose credits come from both neighbours before both sends


def _credit_pair_kernel(
    x_ref: Any,
    out_ref: Any,
    slots: Any,
    partial: Any,
    send_l: Any,
    recv_l: Any,
    send_r: Any,
    recv_r: Any,
    copy_sem: Any,
    lcap: Any,
    rcap: Any,
    *,
    n: int,
    half: int,
    seed: str,
) -> None:
    """ejkernel's bidirectional reduce-scatter (M split into top and bottom halves): each
    step signals a credit to each neighbour, waits both credits, then starts both sends.
    The credit for the leftward send comes from the right neighbour, so a send is safe only
    because the other credit (from the receiver) is waited before it too."""
    step = pl.program_id(0)
    me = lax.axis_index("x")
    left, right = lax.rem(me + n - 1, n), lax.rem(me + 1, n)
    lw = lax.rem(step, 2)
    rw = 2 + lax.rem(step, 2)

    def sync(src: Any, dst: Any) -> None:
        copy = pltpu.make_async_copy(src, dst, copy_sem)
        copy.start()
        copy.wait()

    def compute() -> None:  # the two half-block products, reduced to copies
        sync(x_ref.at[pl.ds(lax.rem(me + step + 1, n) * 2 * half, half)], partial.at[0])
        sync(
            x_ref.at[pl.ds(lax.rem(me - step - 1 + 2 * n, n) * 2 * half + half, half)],
            partial.at[1],
        )

    @pl.when(step == 0)
    def _() -> None:
        if seed != "no_barrier":
            _double_barrier(left, right)
        compute()
        sync(partial.at[0], slots.at[lw])
        sync(partial.at[1], slots.at[rw])

    @pl.when(step > 0)
    def _() -> None:
        _signal(lcap, left)
        _signal(rcap, right)
        to_left = pltpu.make_async_remote_copy(
            slots.at[1 - lw], slots.at[lw], send_l, recv_l, device_id=(left,), device_id_type=MESH
        )
        to_right = pltpu.make_async_remote_copy(
            slots.at[5 - rw], slots.at[rw], send_r, recv_r, device_id=(right,), device_id_type=MESH
        )
        if seed == "interleaved":  # each send behind the credit named after its direction
            pl.semaphore_wait(lcap, 1)
            to_left.start()
            pl.semaphore_wait(rcap, 1)
            to_right.start()
        else:
            pl.semaphore_wait(lcap, 1)
            pl.semaphore_wait(rcap, 1)
            to_left.start()
            to_right.start()
        compute()
        to_left.wait()
        to_right.wait()
        sync(partial.at[0], slots.at[lw])  # the accumulation, reduced to a copy
        sync(partial.at[1], slots.at[rw])

        @pl.when(step == pl.num_programs(0) - 1)
        def _() -> None:
            sync(slots.at[lw], out_ref.at[pl.ds(0, half)])
            sync(slots.at[rw], out_ref.at[pl.ds(half, half)])


def _verify_credit_pair(n: int, seed: str = "", invocations: int = 1) -> Any:
    def fn(x: jax.Array) -> Any:
        half = x.shape[0] // n // 2
        out, _, _ = pl.pallas_call(
            functools.partial(_credit_pair_kernel, n=n, half=half, seed=seed),
            out_shape=(_s(2 * half, 128), _s(4, half, 128), _s(2, half, 128)),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY],
                out_specs=[ANY, ANY, ANY],
                grid=(n,),
                scratch_shapes=[pltpu.SemaphoreType.DMA] * 5 + [pltpu.SemaphoreType.REGULAR] * 2,
            ),
            compiler_params=pltpu.CompilerParams(
                collective_id=0, dimension_semantics=("arbitrary",)
            ),
        )(x)
        return out

    return verify(
        fn,
        _s(n * n * 16, 128),
        mesh=abstract_mesh((n,), ("x",)),
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=invocations,
    )


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_both_credits_before_both_sends_is_clean(n: int, invocations: int) -> None:
    assert _verify_credit_pair(n, invocations=invocations).devices == n


def test_interleaved_credits_are_safe_on_two_devices_only() -> None:
    # On two devices the left and right neighbour are one device: its credit comes from
    # the receiver either way. From three, a send waits only the far neighbour's credit.
    assert _verify_credit_pair(2, "interleaved").devices == 2
    with pytest.raises(RaceDetectedError) as err:
        _verify_credit_pair(4, "interleaved")
    assert "test_reduce_scatter_rings_moe_transport_and_core_signals.py:" in str(err.value), (
        err.value
    )


def test_the_credit_pair_without_its_barrier_is_caught() -> None:
    with pytest.raises(SignalAfterExitError, match="before it has entered"):
        _verify_credit_pair(4, "no_barrier")


# ---------------------------------------------------- a copy that adds into its target


def _adding_copy(add: bool) -> Any:
    """Each (core, subcore) of a SparseCore mesh copies its 8 rows into a fresh output,
    overwriting them or (``add=True``) adding into what is there: nothing, here."""
    from jax.experimental.pallas import tpu_sc as plsc

    def body(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        me = lax.axis_index(("core", "subcore"))
        pltpu.sync_copy(x_ref.at[pl.ds(me * 8, 8)], buf)
        copy = pltpu.make_async_copy(buf, o_ref.at[pl.ds(me * 8, 8)], sem)
        copy.start(add=add)
        copy.wait()

    def fn(x: jax.Array) -> Any:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=2, num_subcores=4
        )
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def test_a_copy_that_adds_into_its_destination_is_refused_not_taken_as_a_write() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="tpu7x")):
        assert verify(_adding_copy(False), _s(64, 128)).dmas == 16
        with pytest.raises(VerificationUnsupportedError, match=rf"add=True.*{HERE}"):
            verify(_adding_copy(True), _s(64, 128))


# ----------------------------------------- a signal to the other core by core_index


def _core_handoff(how: str) -> Any:
    """Grid (2,), "parallel": on a megacore chip each TensorCore runs one step. Core 0
    copies its half and signals core 1 (``core_index=1``, or the same by a ``device_id``
    dict, or wrongly itself); core 1 waits, then forwards core 0's half."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, ready: Any) -> None:
        core = pl.program_id(0)
        copy = pltpu.make_async_copy(
            x_ref.at[pl.ds(core * 8, 8)], o_ref.at[pl.ds(core * 8, 8)], sem
        )
        copy.start()
        copy.wait()

        @pl.when(core == 0)
        def _() -> None:
            if how == "core_index":
                pl.semaphore_signal(ready, 1, core_index=1)
            elif how == "dict":
                pl.semaphore_signal(ready, 1, device_id={"core": 1})
            else:
                pl.semaphore_signal(ready, 1, core_index=0)  # itself

        @pl.when(core == 1)
        def _() -> None:
            pl.semaphore_wait(ready, 1)
            forward = pltpu.make_async_copy(o_ref.at[pl.ds(0, 8)], buf, sem)
            forward.start()
            forward.wait()

    def fn(x: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(2,),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[
                pltpu.VMEM((8, 128), F32),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.REGULAR,
            ],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    return fn


@pytest.mark.parametrize("how", ["core_index", "dict"])
def test_a_signal_to_the_other_core_by_core_index_reaches_it(how: str) -> None:
    report = verify(_core_handoff(how), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5p"))
    assert report.signals == 1


def test_a_signal_by_core_index_to_the_wrong_core_is_caught() -> None:
    with pytest.raises(DeadlockError, match=HERE):
        verify(_core_handoff("self"), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5p"))


def test_a_core_index_past_the_cores_of_the_device_says_how_to_model_them() -> None:
    with pytest.raises(SimulationError, match=r"core index 1 .*tpu='v5p'"):
        verify(_core_handoff("core_index"), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5e"))


# ------------------------------------------ a manual triple buffer with in-place writeback

NIN, NOUT = 3, 3  # input slots (fetched two steps ahead), output slots (waited two behind)


def _triple_buffer(pages: np.ndarray, seed: str = "") -> Any:
    """tpu-inference's long-context RPA pipeline: q and a kv page fetched two steps ahead
    into three slots, the kv page updated and written back in place (waited in the step),
    the output copied out and waited two steps later; out-of-range steps copy 0 rows."""
    ahead = 3 if seed == "three_ahead" else 2

    def kernel(
        pages_sm: Any,
        q_hbm: Any,
        kv_hbm: Any,
        o_hbm: Any,
        kv_out: Any,
        qw: Any,
        kvw: Any,
        ow: Any,
        q_sems: Any,
        kv_in: Any,
        kv_back: Any,
        o_sems: Any,
    ) -> None:
        del kv_out  # aliased to kv_hbm: the cache is updated in place
        total = pages_sm.shape[0]

        def rows(step: Any) -> tuple[Any, Any]:  # (rows to move, the step clamped in range)
            off = jnp.logical_or(step < 0, step >= total)
            return jnp.where(off, 0, 8), jnp.where(off, 0, jnp.maximum(step, 0))

        def q_copy(step: Any, slot: Any) -> Any:
            n, i = rows(step)
            return pltpu.make_async_copy(
                q_hbm.at[pl.ds(i * 8, n)], qw.at[slot, pl.ds(0, n)], q_sems.at[slot]
            )

        def kv_copy(step: Any, slot: Any) -> Any:
            n, i = rows(step)
            page = kv_hbm.at[pages_sm[i], pl.ds(0, n)]
            return pltpu.make_async_copy(page, kvw.at[slot, pl.ds(0, n)], kv_in.at[slot])

        def kv_write(step: Any, slot: Any) -> Any:
            n, i = rows(step)
            page = kv_hbm.at[pages_sm[i], pl.ds(0, n)]
            return pltpu.make_async_copy(kvw.at[slot, pl.ds(0, n)], page, kv_back.at[slot])

        def o_copy(step: Any, slot: Any) -> Any:
            n, i = rows(step)
            return pltpu.make_async_copy(
                ow.at[slot, pl.ds(0, n)], o_hbm.at[pl.ds(i * 8, n)], o_sems.at[slot]
            )

        def behind(step: Any) -> Any:  # the output slot of step - 2
            if seed == "signed_rem":  # lax.rem keeps the sign: -2 and -1 at steps 0 and 1
                return lax.rem(step - 2, NOUT)
            return lax.rem(step - 2 + NOUT, NOUT)

        for s in range(ahead):
            q_copy(s, s).start()
            kv_copy(s, s).start()

        @pl.loop(0, total)
        def _(step: Any) -> None:
            comp, comm, out = lax.rem(step, NIN), lax.rem(step + ahead, NIN), lax.rem(step, NOUT)
            q_copy(step, comp).wait()
            kv_copy(step, comp).wait()
            if seed != "no_out_wait":
                o_copy(step - 2, behind(step)).wait()
            q_copy(step + ahead, comm).start()
            kv_copy(step + ahead, comm).start()
            kvw[comp] = kvw[comp] + 1.0  # the cache update
            kv_write(step, comp).start()
            ow[out] = qw[comp] + kvw[comp]
            if seed != "no_writeback_wait":
                kv_write(step, comp).wait()
            o_copy(step, out).start()

        o_copy(total - 2, behind(total)).wait()
        o_copy(total - 1, behind(total + 1)).wait()

    def fn(pages_arg: jax.Array, q: jax.Array, kv: jax.Array) -> Any:
        vmem = pltpu.VMEM((NIN, 8, 128), F32)
        return pl.pallas_call(
            kernel,
            out_shape=(_s(*q.shape), _s(*kv.shape)),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[ANY, ANY],
                out_specs=(ANY, ANY),
                grid=(),
                scratch_shapes=[vmem, vmem, pltpu.VMEM((NOUT, 8, 128), F32)]
                + [pltpu.SemaphoreType.DMA((NIN,))] * 3
                + [pltpu.SemaphoreType.DMA((NOUT,))],
            ),
            input_output_aliases={2: 1},
        )(pages_arg, q, kv)

    return verify(fn, pages, _s(len(pages) * 8, 128), _s(8, 8, 128))


DISTINCT = np.array([3, 1, 4, 0, 6, 2], np.int32)


@pytest.mark.parametrize("pages", [DISTINCT, DISTINCT[:2]], ids=["six_steps", "two_steps"])
def test_the_triple_buffer_is_clean_on_distinct_pages(pages: np.ndarray) -> None:
    assert _triple_buffer(pages).dmas > 0


@pytest.mark.parametrize(
    ("seed", "pages", "error", "text"),
    [
        ("signed_rem", DISTINCT, SemaphoreIndexError, "index -2"),
        ("no_out_wait", DISTINCT, RaceDetectedError, "ow["),
        ("no_writeback_wait", DISTINCT, RaceDetectedError, "kvw["),
        ("three_ahead", DISTINCT, RaceDetectedError, "kvw["),
        # step 2's fetch (started at step 0) reads page 1 while step 1 writes it back
        ("", np.array([3, 1, 1, 0], np.int32), RaceDetectedError, "kv_hbm[1:2"),
    ],
)
def test_seeded_mistakes_in_the_triple_buffer_are_caught(
    seed: str, pages: np.ndarray, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as err:
        _triple_buffer(pages, seed)
    message = str(err.value)
    assert (
        text in message
        and "test_reduce_scatter_rings_moe_transport_and_core_signals.py:" in message
    ), message


# ------------------- a blocked output aliased to an input the kernel addresses in HBM


def _blocked_alias(wait_in_step: bool) -> Any:
    """Output blocks of 8 rows over a grid of 2, aliased to an input passed in HBM (ANY).
    At step 0 the kernel also copies rows into block 0 of that memory through the input
    ref, waiting in the step (then the step's copy-out lands after it) or only at step 1
    (then the copy-out of block 0 and the copy write the same rows unordered)."""

    def kernel(src: Any, mem: Any, o_blk: Any, sem: Any) -> None:
        step = pl.program_id(0)
        o_blk[...] = jnp.zeros_like(o_blk)
        copy = pltpu.make_async_copy(src.at[pl.ds(0, 8)], mem.at[pl.ds(0, 8)], sem)

        @pl.when(step == 0)
        def _() -> None:
            copy.start()
            if wait_in_step:
                copy.wait()

        if not wait_in_step:
            pl.when(step == 1)(copy.wait)

    def fn(src: jax.Array, mem: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=_s(16, 128),
            grid=(2,),
            in_specs=[ANY, ANY],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={1: 0},
        )(src, mem)

    return fn


def test_a_blocked_output_aliased_to_an_hbm_input_shares_its_memory() -> None:
    assert verify(_blocked_alias(True), _s(16, 128), _s(16, 128)).dmas == 1
    with pytest.raises(RaceDetectedError, match=r"mem\[0:8, 0:128\].*copies an output block"):
        verify(_blocked_alias(False), _s(16, 128), _s(16, 128))


# -------------------------------- what the caller reads of a kernel under a nested jit


def _under_jit(use: str) -> Any:
    """The scratch-output kernel of ``_scratch_output`` wrapped in its own ``jax.jit``
    (kernels are often jitted by their module); the caller drops the scratch output,
    keeps only its written rows, or returns it whole."""
    call = _scratch_output(keep=True)
    inner = jax.jit(call)

    def fn(x: jax.Array) -> Any:
        out, stage = inner(x)
        if use == "drop":
            return out
        if use == "slice":
            return out, stage[0:8]
        return out, stage

    return fn


@pytest.mark.parametrize("use", ["drop", "slice"])
def test_what_the_caller_reads_reaches_a_kernel_under_a_nested_jit(use: str) -> None:
    assert verify(_under_jit(use), _s(16, 128)).dmas == 2


def test_an_unwritten_part_returned_through_a_nested_jit_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match=r"8:16"):
        verify(_under_jit("whole"), _s(16, 128))


def test_garbage_forwarded_many_times_names_the_last_two_copies_only() -> None:
    """A note per hop would grow with every copy of a ring forwarding padding."""

    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any) -> None:
        for hop in range(5):  # bufs[0] (never written) -> bufs[1] -> ... -> bufs[5]
            pltpu.sync_copy(bufs.at[hop], bufs.at[hop + 1])
        pltpu.sync_copy(bufs.at[5], o_hbm)
        del x_hbm, sem

    call = pl.pallas_call(
        kernel,
        out_shape=_s(8, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((6, 8, 128), F32), pltpu.SemaphoreType.DMA],
    )
    with pytest.raises(UnwrittenReadError) as err:
        verify(call, _s(8, 128))
    assert str(err.value).count("the copy at") == 2, err.value
