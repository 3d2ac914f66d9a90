"""The DeepSeek-v4 indexer's scores kernel (``deepseek_v4/indexer/streamindex_topk.py``)
under verify.

Scalar-prefetch refs the kernel writes carry state across grid steps, q and kv blocks are
prefetched across sequences in nested ``fori_loop``s whose trip counts are read from SMEM,
waits on self-copies, outputs double-buffered and waited by their stored size.

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

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, verify
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _at(marker: str) -> str:
    """``path:line`` of the line carrying ``# <- marker`` in this file (as messages print it)."""
    return f"{__file__}:{marker_line(__file__, f'# <- {marker}')}"


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


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
    assert f"test_indexer_scores.py:{marker_line(__file__, f'# <- {copy}')} in " in text, text


def test_indexer_scores_without_the_epilogue_leaves_both_output_copies() -> None:
    with pytest.raises(LeftoverSemaphoreError) as err:
        _verify_scores([1, 1, 1], [8, 24, 32], "no_epilogue")
    text = str(err.value)
    assert "sems[2, 0]" in text and "sems[2, 1]" in text, text
    assert f"test_indexer_scores.py:{marker_line(__file__, '# <- scores send')} in " in text, text
