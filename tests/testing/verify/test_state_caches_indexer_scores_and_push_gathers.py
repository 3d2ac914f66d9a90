"""verify on the DMA protocols of state caches, an indexer's scores and push all-gathers
(vLLM tpu-inference and DeepSeek-V4 kernels). Each kernel here is written for this file in raw pltpu and keeps one
author's DMA/semaphore protocol with the compute reduced to nothing; each correct one
must verify clean and each seeded mistake must be caught, naming this file's line
(the lines are found by the ``# <- name`` markers).

* tpu-inference's GDN decode (``kernels/gdn/v2/gdn_decode_kernel.py``): a pallas_call
  whose grid is computed from an SMEM value, an ``emit_pipeline`` over a traced
  block count with ``pl.BoundedSlice`` blocks, per-token state loads double-buffered
  across pipeline steps and waited by the block's length, state stores waited two
  blocks later. The author's order races from three blocks on: the prefetch of
  block b + 2 lands in the buffer the stores of block b still read (their wait comes
  a step later); waiting the stores of block b - 1 before the prefetch is clean;
* the DeepSeek-v4 indexer's scores kernel (``deepseek_v4/indexer/streamindex_topk.py``):
  scalar-prefetch refs the kernel writes (slot ids, the row count of each output
  buffer's copy in flight) carrying state across grid steps, q and kv blocks prefetched
  across sequences in nested ``fori_loop``s whose trip counts are read from SMEM,
  waits on self-copies, outputs double-buffered and waited by their stored size;
* a chunked copy as a DMA future (``distributed/kv_transfer.py``): a ``pl.loop`` over a
  chunk count from SMEM starts every chunk on one semaphore the call returns, and a
  second call rebuilds and waits each. An XLA operation on the array between the two
  calls was not checked ;
* the dedup push all-gather of tpu-inference's fused MoE (``experimental/fused_moe/
  gmm_fused/gmm_v2_ag_rs.py``): rows pushed per round to every device's cache (local
  ones on the receive semaphore too), receive semaphores of two slots drained by the
  round's total, send semaphores per (slot, target) drained two rounds later, rows
  gathered per tile into two VMEM slots. With two receive slots a fast peer's round
  r + 2 rows can release this device's drain of round r (no flow control between
  rounds): verify reports it where a routing leaves the peer free; one receive
  semaphore per round is clean.
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
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
HBM = pl.BlockSpec(memory_space=pltpu.HBM)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


def _at(marker: str) -> str:
    """``path:line`` of the line carrying ``# <- marker`` in this file (as messages print it)."""
    return f"{__file__}:{marker_line(__file__, f'# <- {marker}')}"


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------------------------ GDN decode

H, K, V = 1, 8, 128


def _gdn_kernel(
    v_hbm: Any,
    idx: Any,
    dist: Any,
    st_in: Any,
    o_hbm: Any,
    st_hbm: Any,
    h_bufs: Any,
    load_sems: Any,
    store_sems: Any,
    *,
    bt: int,
    order: str,
    seed: str,
) -> None:
    """``order="author"``: the prefetch first, the stores of two blocks ago waited after
    the compute; ``"fixed"``: the stores of the previous block (the prefetch's buffer)
    waited before the prefetch, only the last block drained after the pipeline."""
    del st_in
    end = dist[0]
    nb = pl.cdiv(end, bt)
    fixed = order == "fixed"

    def token_map(i: Any) -> Any:
        return (pl.ds(i * bt, jnp.minimum(bt, end - i * bt)), 0, 0)

    spec = pl.BlockSpec((pl.BoundedSlice(bt), H, V), token_map)

    def first_load(t: int) -> None:
        @pl.when(t < end)
        def _() -> None:
            c = pltpu.make_async_copy(
                st_hbm.at[pl.ds(idx[t], 1)], h_bufs.at[0, pl.ds(t, 1)], load_sems.at[0]
            )
            c.start()  # <- gdn first load

    for t in range(bt):
        first_load(t)

    def inner(v_ref: Any, o_ref: Any, hb: Any, ix: Any, ls: Any, ss: Any) -> None:
        b = pl.program_id(0)
        t0 = b * bt
        blen = jnp.minimum(bt, end - t0)
        buf, nbuf = b % 2, (b + 1) % 2
        nlen = jnp.maximum(jnp.minimum(bt, end - t0 - bt), 0)
        if fixed:
            plen1 = jnp.where(b >= 1, jnp.minimum(bt, end - jnp.maximum(t0 - bt, 0)), 0)

            @pl.when(plen1 > 0)
            def _() -> None:
                view = hb.at[nbuf, pl.ds(0, plen1)]
                pltpu.make_async_copy(view, view, ss.at[nbuf]).wait()

        def prefetch(t: int) -> None:
            @pl.when(t < nlen)
            def _() -> None:
                c = pltpu.make_async_copy(
                    st_hbm.at[pl.ds(ix[t0 + bt + t], 1)], hb.at[nbuf, pl.ds(t, 1)], ls.at[nbuf]
                )
                c.start()  # <- gdn prefetch

        def compute(t: int) -> None:
            @pl.when(t < blen)
            def _() -> None:
                o_ref[t] = v_ref[t] + hb[buf, t, 0, 0:1, :]  # <- gdn compute read
                hb[buf, t] = hb[buf, t] + 1.0

        def store(t: int) -> None:
            @pl.when(t < blen)
            def _() -> None:
                c = pltpu.make_async_copy(
                    hb.at[buf, pl.ds(t, 1)], st_hbm.at[pl.ds(ix[t0 + t], 1)], ss.at[buf]
                )
                c.start()  # <- gdn store

        for t in range(bt):
            prefetch(t)

        if seed != "no_load_wait":
            here = hb.at[buf, pl.ds(0, blen)]
            pltpu.make_async_copy(here, here, ls.at[buf]).wait()
        for t in range(bt):
            compute(t)

        if not fixed:
            plen2 = jnp.where(b >= 2, jnp.minimum(bt, end - jnp.maximum(t0 - 2 * bt, 0)), 0)

            @pl.when(plen2 > 0)
            def _() -> None:
                view = hb.at[buf, pl.ds(0, plen2)]
                pltpu.make_async_copy(view, view, ss.at[buf]).wait()

        for t in range(bt):
            store(t)

    pltpu.emit_pipeline(inner, grid=(nb,), in_specs=[spec], out_specs=spec)(
        v_hbm, o_hbm, scratches=[h_bufs, idx, load_sems, store_sems]
    )
    last = (nb - 1) % 2
    llen = jnp.minimum(bt, end - (nb - 1) * bt)
    if seed != "no_drain":
        view = h_bufs.at[last, pl.ds(0, llen)]
        pltpu.make_async_copy(view, view, store_sems.at[last]).wait()
    if not fixed:
        olen = jnp.where(nb >= 2, jnp.minimum(bt, end - (nb - 2) * bt), 0)

        @pl.when(olen > 0)
        def _() -> None:
            view = h_bufs.at[nb % 2, pl.ds(0, olen)]
            pltpu.make_async_copy(view, view, store_sems.at[nb % 2]).wait()


def _gdn(v: Any, idx: Any, dist: Any, st: Any, *, order: str, seed: str = "") -> Any:
    bt = 2
    return pl.pallas_call(
        functools.partial(_gdn_kernel, bt=bt, order=order, seed=seed),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[ANY, SMEM, SMEM, ANY],
            out_specs=[ANY, ANY],
            grid=(jnp.where(dist[0] > 0, 1, 0),),  # the author's grid: 0 or 1 step
            scratch_shapes=[
                pltpu.VMEM((2, bt, H, K, V), F32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        input_output_aliases={0: 0, 3: 1},
        out_shape=[_s(8, H, V), _s(10, H, K, V)],
    )(v, idx, dist, st)


def _verify_gdn(end: int, order: str, seed: str = "") -> Any:
    idx = jnp.arange(8, dtype=jnp.int32)[::-1] + 1  # every token its own state
    return verify(
        functools.partial(_gdn, order=order, seed=seed),
        _s(8, H, V),
        idx,
        jnp.array([end, end, end], jnp.int32),
        _s(10, H, K, V),
        mesh=abstract_mesh((), (), tpu="v5p"),  # emit_pipeline asks for the TPU
    )


@pytest.mark.parametrize("end", [0, 1, 3, 4, 5, 8])
def test_gdn_decode_with_the_stores_waited_before_the_prefetch_is_clean(end: int) -> None:
    assert (_verify_gdn(end, "fixed").dmas > 0) == (end > 0)  # no decode tokens: no step


@pytest.mark.parametrize("end", [1, 3, 4])
def test_gdn_decode_in_the_authors_order_is_clean_up_to_two_blocks(end: int) -> None:
    assert _verify_gdn(end, "author").dmas > 0


@pytest.mark.parametrize("end", [5, 8])
def test_gdn_decode_in_the_authors_order_races_from_three_blocks(end: int) -> None:
    """Block b's stores read buffer b % 2 until their wait at step b + 2; the prefetch
    of block b + 2 at step b + 1 writes that buffer (jax's interpreter agrees)."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_gdn(end, "author")
    text = str(err.value)
    assert "h_bufs[" in text, text
    assert _at("gdn prefetch") in text and _at("gdn store") in text, text
    assert "which no wait has guaranteed complete yet" in text, text


def test_gdn_decode_seeded_dropped_load_wait_names_the_read_and_the_load() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _verify_gdn(3, "fixed", "no_load_wait")
    text = str(err.value)
    assert f"reads it at {_at('gdn compute read')}" in text, text
    assert _at("gdn first load") in text, text


def test_gdn_decode_seeded_dropped_drain_is_a_leftover_naming_the_store() -> None:
    with pytest.raises(LeftoverSemaphoreError) as err:
        _verify_gdn(8, "fixed", "no_drain")
    text = str(err.value)
    assert "store_sems[1] holds 8192 bytes" in text, text
    # the last block's two stores, one line of words
    assert f"the 2 copies started at {_at('gdn store')}" in text, text
    assert "(4096 bytes each) were never waited" in text, text


# ------------------------------------------------------ indexer scores (DeepSeek v4)

PAGE, BKV_P, BQ, D = 8, 2, 8, 128
BKV = PAGE * BKV_P


def _scores_kernel(
    seq_lens: Any,
    pages: Any,
    cu_q: Any,
    se: Any,
    sem_ids: Any,
    bo_sz: Any,
    q_hbm: Any,
    kv_hbm: Any,
    s_in: Any,
    s_hbm: Any,
    bkv_x2: Any,
    bq_x2: Any,
    so_x2: Any,
    sems: Any,
    *,
    pages_per_seq: int,
    seed: str,
) -> None:
    del s_in
    start, end = se[0], se[1]
    seq = start + pl.program_id(0)

    def copy(src: Any, dst: Any, sem: Any, wait: bool) -> None:
        c = pltpu.make_async_copy(src, dst, sem)
        if wait:
            c.wait()
        else:
            c.start()  # <- scores copy

    def wait_send(bo: Any) -> None:
        old = bo_sz[bo]

        @pl.when(old >= 0)
        def _() -> None:
            d = so_x2.at[bo, pl.ds(0, old)]
            copy(d, d, sems.at[2, bo], True)

    def start_send(bo: Any, sz: Any, tok: Any, kv_block: Any) -> None:
        if seed != "stale_size":
            bo_sz[bo] = sz
        dst = s_hbm.at[pl.ds(tok, sz), pl.ds(kv_block, 1)]
        copy(so_x2.at[bo, pl.ds(0, sz)], dst, sems.at[2, bo], False)  # <- scores send

    def fetch_kv(s: Any, kv_block: Any, slot: Any, wait: bool = False) -> None:
        if not wait:
            for i in range(BKV_P):
                page = jnp.minimum(s * pages_per_seq + kv_block * BKV_P + i, pages.shape[0] - 1)
                dst = bkv_x2.at[slot, pl.ds(i * PAGE, PAGE)]
                copy(kv_hbm.at[pages[page]], dst, sems.at[0, slot], False)  # <- scores kv
        else:
            d = bkv_x2.at[slot, pl.ds(0, BKV)]
            copy(d, d, sems.at[0, slot], True)

    def fetch_q(s: Any, q_block: Any, slot: Any, wait: bool = False) -> None:
        q0 = cu_q[s] + q_block * BQ
        sz = jnp.maximum(0, jnp.minimum(BQ, cu_q[s + 1] - q0))
        if not wait:
            copy(q_hbm.at[pl.ds(q0, sz)], bq_x2.at[slot, pl.ds(0, sz)], sems.at[1, slot], False)
        else:
            d = bq_x2.at[slot, pl.ds(0, sz)]
            copy(d, d, sems.at[1, slot], True)

    num_kv = jnp.maximum(1, pl.cdiv(seq_lens[seq], BKV))
    num_q = jnp.maximum(1, pl.cdiv(cu_q[seq + 1] - cu_q[seq], BQ))

    def with_q(q_block: Any, carry: Any) -> Any:
        slot = sem_ids[0]
        last = q_block + 1 == num_q
        next_seq = lax.select(last, seq + 1, seq)
        next_slot = lax.select(slot == 0, 1, 0)

        @pl.when(next_seq < end)
        def _() -> None:
            sem_ids[0] = next_slot
            fetch_q(next_seq, lax.select(last, 0, q_block + 1), next_slot)

        fetch_q(seq, q_block, slot, wait=True)
        q = bq_x2[slot]
        tok = cu_q[seq] + q_block * BQ
        sz = jnp.maximum(0, jnp.minimum(BQ, cu_q[seq + 1] - tok))

        def with_kv(kv_block: Any, carry: Any) -> Any:
            kslot = sem_ids[1]
            last_kv = kv_block + 1 == num_kv
            nq = lax.select(last_kv, q_block + 1, q_block)
            ns = lax.select(nq == num_q, seq + 1, seq)
            next_kslot = lax.select(kslot == 0, 1, 0)

            @pl.when(ns < end)
            def _() -> None:
                sem_ids[1] = next_kslot
                fetch_kv(ns, lax.select(last_kv, 0, kv_block + 1), next_kslot)

            fetch_kv(seq, kv_block, next_kslot if seed == "wrong_kv_slot" else kslot, wait=True)
            kv = bkv_x2[kslot]  # <- scores kv read
            bo = sem_ids[2]
            if seed != "no_send_wait":
                wait_send(bo)
            row = jnp.sum(kv, axis=0)[None, None, :]
            so_x2[bo] = jnp.broadcast_to(q[:, None, :] + row, so_x2.shape[1:])  # <- scores store
            start_send(bo, sz, tok, kv_block)
            sem_ids[2] = lax.select(bo == 0, 1, 0)
            return carry

        return lax.fori_loop(0, num_kv, with_kv, carry)

    @pl.when(seq == start)
    def _() -> None:
        fetch_q(start, 0, 0)
        fetch_kv(start, 0, 0)

    lax.fori_loop(0, num_q, with_q, 0)

    @pl.when(jnp.logical_and(seq == end - 1, seed != "no_epilogue"))
    def _() -> None:
        for i in range(2):
            wait_send(i)


def _scores(*args: Any, num_seqs: int, seed: str) -> Any:
    sem_ids = jnp.zeros((3,), jnp.int32)
    bo_sz = jnp.full((2,), -1, jnp.int32)  # -1: no copy in flight from that buffer
    seq_lens, pages, cu_q, se, q, kv, s_init = args
    return pl.pallas_call(
        functools.partial(_scores_kernel, pages_per_seq=4, seed=seed),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(num_seqs,),
            in_specs=[ANY, ANY, ANY],
            out_specs=ANY,
            scratch_shapes=[
                pltpu.VMEM((2, BKV, D), F32),
                pltpu.VMEM((2, BQ, D), F32),
                pltpu.VMEM((2, BQ, 1, D), F32),
                pltpu.SemaphoreType.DMA((3, 2)),
            ],
        ),
        input_output_aliases={8: 0},
        out_shape=jax.ShapeDtypeStruct(s_init.shape, F32),
    )(seq_lens, pages, cu_q, se, sem_ids, bo_sz, q, kv, s_init)


SCORES_CASES = [
    ([5], [20]),
    ([8, 3], [16, 30]),
    ([12, 1, 9], [32, 8, 17]),
    ([1, 1, 1], [8, 24, 32]),
]


def _verify_scores(q_lens: list[int], kv_lens: list[int], seed: str = "") -> Any:
    n = len(q_lens)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    pages = np.random.RandomState(0).permutation(16)[: n * 4].astype(np.int32)
    kv_blocks = max(-(-k // BKV) for k in kv_lens)
    return verify(
        functools.partial(_scores, num_seqs=n, seed=seed),
        jnp.array(kv_lens, jnp.int32),
        jnp.array(pages),
        jnp.array(cu),
        jnp.array([0, n], jnp.int32),
        _s(int(cu[-1]), D),
        _s(16, PAGE, D),
        jnp.zeros((int(cu[-1]), kv_blocks, D), F32),
    )


@pytest.mark.parametrize(("q_lens", "kv_lens"), SCORES_CASES)
def test_indexer_scores_protocol_is_clean(q_lens: list[int], kv_lens: list[int]) -> None:
    assert _verify_scores(q_lens, kv_lens).dmas > 0


@pytest.mark.parametrize(
    ("seed", "error", "access", "copy"),
    [
        # the output buffer rewritten while its previous copy is in flight
        ("no_send_wait", RaceDetectedError, "writes it at {scores store}", "scores send"),
        ("stale_size", RaceDetectedError, "writes it at {scores store}", "scores send"),
        # the kv block waited on the other slot
        ("wrong_kv_slot", RaceDetectedError, "reads it at {scores kv read}", "scores kv"),
    ],
)
def test_indexer_scores_seeded_races_name_the_access_and_the_copy(
    seed: str, error: type[Exception], access: str, copy: str
) -> None:
    with pytest.raises(error) as err:
        _verify_scores([8, 3], [16, 30], seed)
    text = str(err.value)
    marker = access.split("{")[1].rstrip("}")
    assert access.split("{")[0] + _at(marker) in text, text
    # the copy is named at the helper's line and the user's call of the helper
    assert _at("scores copy") in text, text
    assert (
        f"test_state_caches_indexer_scores_and_push_gathers.py:{marker_line(__file__, f'# <- {copy}')} in "
        in text
    ), text


def test_indexer_scores_without_the_epilogue_leaves_both_output_copies() -> None:
    with pytest.raises(LeftoverSemaphoreError) as err:
        _verify_scores([1, 1, 1], [8, 24, 32], "no_epilogue")
    text = str(err.value)
    assert "sems[2, 0]" in text and "sems[2, 1]" in text, text
    assert (
        f"test_state_caches_indexer_scores_and_push_gathers.py:{marker_line(__file__, '# <- scores send')} in "
        in text
    ), text


# --------------------------------------------------- a chunked copy as a DMA future


def _start_kernel(
    n: Any, so: Any, do: Any, sz: Any, src: Any, dep: Any, dst: Any, *rest: Any
) -> None:
    sem = rest[-1]

    @pl.loop(0, n[0])
    def _(i: Any) -> None:
        c = pltpu.make_async_copy(src.at[pl.ds(so[i], sz[i])], dst.at[pl.ds(do[i], sz[i])], sem)
        c.start()  # <- chunk start


def _wait_kernel(
    n: Any,
    so: Any,
    do: Any,
    sz: Any,
    src: Any,
    dep: Any,
    dst: Any,
    sem: Any,
    out: Any,
    *,
    short: bool,
) -> None:
    @pl.loop(0, n[0] - 1 if short else n[0])
    def _(i: Any) -> None:
        pltpu.make_async_copy(src.at[pl.ds(so[i], sz[i])], dst.at[pl.ds(do[i], sz[i])], sem).wait()


def _chunked(n: Any, so: Any, do: Any, sz: Any, src: Any, dep: Any, dst: Any, *, seed: str) -> Any:
    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
    dst, sem = pl.pallas_call(
        _start_kernel,
        out_shape=(jax.ShapeDtypeStruct(dst.shape, F32), pltpu.SemaphoreType.DMA(())),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[HBM] * 3, out_specs=(HBM, sem_spec)
        ),
        input_output_aliases={6: 0},
        compiler_params=pltpu.CompilerParams(has_side_effects=True),
    )(n, so, do, sz, src, dep, dst)
    early = None
    if seed == "read_in_flight":
        early = dst[0:8] * 2.0  # <- chunk early read
    if seed == "read_untouched":
        early = dst[56:64] * 2.0  # rows no chunk writes
    if seed in ("dynamic_untouched", "dynamic_in_flight"):
        row = lax.axis_index("x") * 0 + (56 if seed == "dynamic_untouched" else 20)
        early = lax.dynamic_slice_in_dim(dst, row, 8) * 2.0  # <- chunk dynamic read
    out = pl.pallas_call(  # <- chunk wait call
        functools.partial(_wait_kernel, short=seed == "one_short"),
        out_shape=jax.ShapeDtypeStruct(dst.shape, F32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4, grid=(1,), in_specs=[HBM] * 3 + [sem_spec], out_specs=HBM
        ),
        input_output_aliases={6: 0},
        compiler_params=pltpu.CompilerParams(has_side_effects=True),
    )(n, so, do, sz, src, dep, dst, sem)
    if seed == "read_after_wait":
        early = out[0:8] * 2.0
    return out if early is None else (out, early)


def _verify_chunked(seed: str = "", devices: tuple[int, ...] = (2,), overlap: bool = False) -> Any:
    count = int(np.prod(devices))
    names = ("x", "y")[: len(devices)]
    dests = [16, 0, 8 if overlap else 40, 24]
    two = seed.startswith(("read_", "dynamic_"))
    return verify(
        functools.partial(_chunked, seed=seed),
        jnp.array([4], jnp.int32),
        jnp.array([0, 8, 24, 40], jnp.int32),
        jnp.array(dests, jnp.int32),
        jnp.array([8, 16, 8, 16], jnp.int32),
        _s(64 * count, 128),
        _s(8 * count, 128),
        _s(64 * count, 128),
        mesh=abstract_mesh(devices, names),
        in_specs=(P(),) * 4 + (P(names),) * 3,
        out_specs=(P(names), P(names)) if two else P(names),
    )


@pytest.mark.parametrize("devices", [(1,), (2,), (4,), (2, 2)])
def test_chunked_copy_future_is_clean(devices: tuple[int, ...]) -> None:
    assert _verify_chunked(devices=devices).dmas == 4 * int(np.prod(devices))


@pytest.mark.parametrize("seed", ["read_untouched", "read_after_wait", "dynamic_untouched"])
def test_reading_a_futures_array_where_no_copy_is_in_flight_is_clean(seed: str) -> None:
    assert _verify_chunked(seed).dmas == 8


def test_reading_a_futures_array_before_its_wait_is_a_race_at_the_users_line() -> None:
    """an XLA operation on the array the start call returned, between the two
    calls, reads rows a chunk is still writing; it was not checked at all."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("read_in_flight")
    text = str(err.value)
    assert f"slice at {_at('chunk early read')} (" in text, text
    assert "reads it outside any kernel while the copy" in text, text
    assert "read what the kernel that waits the copy returns" in text, text
    assert f"the copy started at {_at('chunk start')}" in text and "device 1 (x=1)" in text, text


def test_a_dynamic_slice_of_a_futures_array_reads_its_window() -> None:
    """Rows 20:28 (from a start computed per device) overlap the chunk into 16:24."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("dynamic_in_flight")
    text = str(err.value)
    assert "dst[20:28, 0:128]" in text, text
    assert f"dynamic_slice at {_at('chunk dynamic read')} (" in text, text


def test_a_chunk_left_unwaited_is_reported_at_the_wait_calls_return() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked("one_short")
    text = str(err.value)
    assert f"returns it at the end of kernel _wait_kernel ({_at('chunk wait call')}" in text, text
    assert _at("chunk start") in text and "released by whichever land first" in text, text


def test_overlapping_chunks_are_a_race_naming_the_start() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _verify_chunked(overlap=True)
    text = str(err.value)
    assert "dst[8:16, 0:128]" in text and _at("chunk start") in text, text


# ------------------------------------------------------------ dedup push all-gather

CHUNK, TILE = 8, 4


def _ag_kernel(
    cnt: Any,
    off: Any,
    gid: Any,
    rcv: Any,
    gidx: Any,
    gval: Any,
    gnum: Any,
    hid: Any,
    out: Any,
    cache: Any,
    gath: Any,
    gsem: Any,
    rsem: Any,
    ssem: Any,
    *,
    n: int,
    rounds: int,
    seed: str,
) -> None:
    me = lax.axis_index("x")
    per_round = "per_round_recv" in seed

    def recv_sem(slot: Any, r: Any) -> Any:
        return rsem.at[r] if per_round else rsem.at[slot]

    def push_to(c: int, r: Any, slot: Any) -> None:
        def row(i: Any, carry: Any) -> Any:
            o, g = off[0, c, r, i], gid[0, c, r, i]
            src, dst = hid.at[pl.ds(o, 1)], cache.at[pl.ds(g, 1)]

            @pl.when(me == c)
            def _() -> None:
                pltpu.make_async_copy(src, dst, recv_sem(slot, r)).start()

            @pl.when(me != c)
            def _() -> None:
                push_copy = pltpu.make_async_remote_copy(
                    src, dst, ssem.at[slot, c], recv_sem(slot, r), device_id={"x": c}
                )
                push_copy.start()  # <- ag push

            return carry

        lax.fori_loop(0, cnt[0, c, r], row, 0)

    def push(r: Any, slot: Any) -> None:
        for c in range(n):
            push_to(c, r, slot)

    def drain_send_to(c: int, slot: Any, r: Any) -> None:
        k = cnt[0, c, r]

        @pl.when(jnp.logical_and(me != c, k > 0))
        def _() -> None:
            view = cache.at[pl.ds(0, k)]
            pltpu.make_async_copy(view, view, ssem.at[slot, c]).wait()

    def drain_send(slot: Any, r: Any) -> None:
        for c in range(n):
            drain_send_to(c, slot, r)

    def drain_recv(slot: Any, r: Any) -> None:
        k = rcv[0, r]

        @pl.when(k > 0)
        def _() -> None:
            view = cache.at[pl.ds(0, k)]
            pltpu.make_async_copy(view, view, recv_sem(slot, r)).wait()  # <- ag drain

    def gather_start(slot: Any, r: Any) -> None:
        for i in range(TILE):
            v = gval[0, r, i]
            c = pltpu.make_async_copy(
                cache.at[pl.ds(gidx[0, r, i], v)], gath.at[slot, pl.ds(i, v)], gsem.at[slot]
            )
            c.start()  # <- ag gather

    push(0, 0)
    drain_recv(0, 0)
    gather_start(0, 0)

    def step(r: Any, carry: Any) -> Any:
        slot, nslot = r % 2, 1 - r % 2

        @pl.when(r + 1 < rounds)
        def _() -> None:
            @pl.when(r + 1 >= 2)
            def _() -> None:
                drain_send(nslot, r - 1)

            push(r + 1, nslot)
            if "no_recv_drain" not in seed:
                drain_recv(nslot, r + 1)
            gather_start(slot if "gather_same_slot" in seed else nslot, r + 1)

        k = gnum[0, r]
        here = gath.at[slot, pl.ds(0, k)]
        pltpu.make_async_copy(here, here, gsem.at[slot]).wait()
        # the author's grouped matmul, reduced to a product with the identity: rows
        # of a tile no token fills are garbage the consumer ignores (a vector move
        # would be R6 where the output leaves: docs/verify-model.md, rule 12)
        eye = jnp.eye(D, dtype=F32)
        out[pl.ds(r * TILE, TILE)] = jnp.dot(gath[slot], eye)  # <- ag compute read
        return carry

    lax.fori_loop(0, rounds, step, 0)
    if "no_epilogue" not in seed:
        for r in range(max(rounds - 2, 0), rounds):
            drain_send(r % 2, r)


def _ag(*tables: Any, n: int, rounds: int, seed: str) -> Any:
    recv = rounds if "per_round_recv" in seed else 2
    out, _cache = pl.pallas_call(
        functools.partial(_ag_kernel, n=n, rounds=rounds, seed=seed),
        out_shape=(_s(rounds * TILE, D), _s(n * CHUNK, D)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=7,
            in_specs=[ANY],
            out_specs=(VMEM, ANY),
            scratch_shapes=[
                pltpu.VMEM((2, TILE, D), F32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((recv,)),
                pltpu.SemaphoreType.DMA((2, n)),
            ],
        ),
    )(*tables)
    return out  # the cache is the kernel's HBM scratch, dropped


def _ag_tables(n: int, rounds: int, seed: int) -> list[jax.Array]:
    """Each device gathers up to TILE random tokens per round; a token's owner pushes
    it in the first round its receiver asks for it (dedup: never twice)."""
    rng = np.random.RandomState(seed)
    cnt = np.zeros((n, n, rounds), np.int32)
    off = np.zeros((n, n, rounds, TILE), np.int32)
    gid = np.zeros((n, n, rounds, TILE), np.int32)
    rcv = np.zeros((n, rounds), np.int32)
    gidx = np.zeros((n, rounds, TILE), np.int32)
    gval = np.zeros((n, rounds, TILE), np.int32)
    gnum = np.zeros((n, rounds), np.int32)
    for d in range(n):
        have: set[int] = set()
        for r in range(rounds):
            tokens = sorted(rng.choice(n * CHUNK, size=rng.randint(0, TILE + 1), replace=False))
            gnum[d, r] = len(tokens)
            for i, g in enumerate(tokens):
                gidx[d, r, i], gval[d, r, i] = g, 1
                if g in have:
                    continue
                have.add(g)
                owner, k = g // CHUNK, cnt[g // CHUNK, d, r]
                off[owner, d, r, k], gid[owner, d, r, k] = g % CHUNK, g
                cnt[owner, d, r] += 1
                rcv[d, r] += 1
    return [jnp.array(a) for a in (cnt, off, gid, rcv, gidx, gval, gnum)]


def _verify_ag(
    n: int, rounds: int, table_seed: int, seed: str = "", groups: int = 1, invocations: int = 1
) -> Any:
    """``groups`` > 1: a 2-D mesh (groups, n), each group gathering along ``x``."""
    per = [_ag_tables(n, rounds, table_seed + g) for g in range(groups)]
    tables = [jnp.concatenate(parts) for parts in zip(*per)]
    mesh = abstract_mesh((groups, n), ("y", "x")) if groups > 1 else abstract_mesh((n,), ("x",))
    axes = ("y", "x") if groups > 1 else "x"
    return verify(
        functools.partial(_ag, n=n, rounds=rounds, seed=seed),
        *tables,
        _s(groups * n * CHUNK, D),
        mesh=mesh,
        in_specs=P(axes),
        out_specs=P(axes),
        invocations=invocations,
    )


@pytest.mark.parametrize(
    ("n", "rounds", "groups", "invocations"),
    [(1, 3, 1, 1), (2, 1, 1, 1), (2, 3, 1, 1), (4, 3, 1, 1), (4, 3, 1, 2), (2, 3, 2, 1)],
)
@pytest.mark.parametrize("table_seed", [0, 1])
def test_push_all_gather_with_a_receive_semaphore_per_round_is_clean(
    n: int, rounds: int, groups: int, invocations: int, table_seed: int
) -> None:
    report = _verify_ag(n, rounds, table_seed, "per_round_recv", groups, invocations)
    assert report.devices == n * groups and report.dmas > 0


@pytest.mark.parametrize(("n", "table_seed"), [(2, 0), (4, 0), (4, 1)])
def test_push_all_gather_with_two_receive_slots_lets_round_r_plus_2_release_round_r(
    n: int, table_seed: int
) -> None:
    """The author's two receive slots: a peer that receives nothing from this device in
    the rounds between is not held back, and its round r + 2 rows may release this
    device's drain of round r before round r's rows landed."""
    with pytest.raises(RaceDetectedError) as err:
        _verify_ag(n, 3, table_seed)
    text = str(err.value)
    assert f"reads it at {_at('ag gather')}" in text, text
    assert f"the wait at {_at('ag drain')}" in text, text
    assert "released by whichever land first" in text, text


@pytest.mark.parametrize("n", [1, 2])
def test_push_all_gather_with_two_receive_slots_is_clean_where_no_peer_runs_ahead(n: int) -> None:
    assert _verify_ag(n, 3, 1).dmas > 0


@pytest.mark.parametrize(
    ("seed", "n", "error", "text"),
    [
        ("no_recv_drain", 1, RaceDetectedError, "reads it at {ag gather}"),
        ("gather_same_slot", 2, RaceDetectedError, "writes it at {ag gather}"),
        (
            "no_epilogue",
            4,
            LeftoverSemaphoreError,
            "started at {ag push}",
        ),
    ],
)
def test_push_all_gather_seeded_mistakes_are_caught(
    seed: str, n: int, error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as err:
        _verify_ag(n, 3, 0, "per_round_recv+" + seed)
    message = str(err.value)
    marker = text.split("{")[1].rstrip("}")
    assert text.split("{")[0] + _at(marker) in message, message
    assert "device " in message, message


def test_a_remote_copy_landing_after_its_target_left_names_the_receive_wait() -> None:
    """R8 for a remote copy said "drop the signal"; its fix is the target's
    receive wait."""
    with pytest.raises(SignalAfterExitError) as err:
        _verify_ag(2, 3, 0, "per_round_recv+no_recv_drain")
    text = str(err.value)
    assert f"a remote copy into cache from device 0 (x=0) at {_at('ag push')}" in text, text
    assert "after it left the kernel (R8)" in text, text
    assert "wait its receive side (wait_recv, or a wait by size" in text, text
    assert "drop the signal" not in text, text


def _unwaited_then_used(x: Any) -> Any:
    """A kernel that leaves its copy in flight on a scratch semaphore, then an XLA
    operation on its output: the leftover is the mistake to report, not the read."""

    def kernel(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        c.start()  # <- unwaited start

    out = pl.pallas_call(
        kernel,
        out_shape=_s(8, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return out * 2.0


def test_an_output_read_after_its_kernel_left_a_copy_in_flight_reports_the_leftover() -> None:
    with pytest.raises(LeftoverSemaphoreError) as err:
        verify(_unwaited_then_used, _s(8, 128))
    text = str(err.value)
    assert f"the copy started at {_at('unwaited start')} (" in text, text
    assert "(4096 bytes) was never waited" in text and "outside any kernel" not in text, text
