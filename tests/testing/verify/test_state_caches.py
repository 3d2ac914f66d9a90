"""tpu-inference's GDN decode (``kernels/gdn/v2/gdn_decode_kernel.py``) under verify: a
state cache double-buffered across pipeline steps.

Per-token state loads double-buffered across the steps of an ``emit_pipeline`` over a
traced block count and waited by the block's length, stores waited two blocks later. The
author's order races from three blocks on: the prefetch of block b + 2 lands in the
buffer the stores of block b still read; waiting the stores of block b - 1 before the
prefetch is clean.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, abstract_mesh, verify
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


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
