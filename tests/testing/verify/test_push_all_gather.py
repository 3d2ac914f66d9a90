"""The dedup push all-gather of tpu-inference's fused MoE
(``experimental/fused_moe/gmm_fused/gmm_v2_ag_rs.py``) under verify.

Rows pushed per round to every device's cache, receive semaphores of two slots drained by
the round's total, send semaphores drained two rounds later. With two receive slots a
fast peer's round r + 2 rows can release this device's drain of round r: verify reports it
where a routing leaves the peer free; one receive semaphore per round is clean. A remote
copy landing after its target left names the receive wait.

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
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


def _at(marker: str) -> str:
    """``path:line`` of the line carrying ``# <- marker`` in this file (as messages print it)."""
    return f"{__file__}:{marker_line(__file__, f'# <- {marker}')}"


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------------ indexer scores (DeepSeek v4)

PAGE, BKV_P, BQ, D = 8, 2, 8, 128


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
