"""A per-token state cache double-buffered across the steps of an ``emit_pipeline``
(vLLM tpu-inference's ``gdn/v2/gdn_decode_kernel.py``).

The first block's rows are started before the pipeline, the next block's prefetched under
one ``pl.when`` per token, the current block waited by size, rows stored back per token and
drained by size two steps later and after the pipeline. Trace time leaves the store drain
to verify, which finds the prefetch that overwrites a buffer a store still reads.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import (
    RaceDetectedError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_text,
    verify,
)
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- a state cache double-buffered across pipeline steps --------------------------------

T, H, D, STATES, BT = 32, 2, 128, 16, 4


def _state_cache(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def start(src: Any, dst: Any, sem: Any) -> None:
        if safe:
            sd.LocalCopy(src, dst, sem).start()  # STARTED
        else:
            pltpu.make_async_copy(src, dst, sem).start()

    def drain(sem: Any, rows: Any) -> None:
        if safe:
            sd.wait_bytes(sem, rows)
        else:
            pltpu.make_async_copy(rows, rows, sem).wait()

    def kernel(
        v_hbm: Any,
        idx_ref: Any,
        dist_ref: Any,
        state_init: Any,
        o_hbm: Any,
        state_hbm: Any,
        h_bufs: Any,
        load_sems: Any,
        store_sems: Any,
    ) -> None:
        del state_init  # aliased to state_hbm
        end = dist_ref[0]
        nb = pl.cdiv(end, BT)

        def token_map(i: Any) -> tuple[Any, int, int]:
            return (pl.ds(i * BT, jnp.minimum(BT, end - i * BT)), 0, 0)

        spec = pl.BlockSpec((pl.BoundedSlice(BT), H, D), token_map)
        for t in range(BT):

            @pl.when(t < end)
            def _(t: int = t) -> None:
                start(
                    state_hbm.at[pl.ds(idx_ref[t], 1)], h_bufs.at[0, pl.ds(t, 1)], load_sems.at[0]
                )

        def body(v_ref: Any, o_ref: Any, bufs: Any, idx: Any, lsems: Any, ssems: Any) -> None:
            b = pl.program_id(0)
            t0 = b * BT
            n = jnp.minimum(BT, end - t0)
            cur, nxt = b % 2, (b + 1) % 2
            n_next = jnp.maximum(jnp.minimum(BT, end - t0 - BT), 0)
            reuse_first = seed == "stores_drained_before_reuse"
            if reuse_first:
                # The previous block's stores read the buffer the prefetch is about to fill.
                last_len = jnp.where(b >= 1, jnp.minimum(BT, end - jnp.maximum(t0 - BT, 0)), 0)

                @pl.when(last_len > 0)
                def _() -> None:
                    drain(ssems.at[nxt], bufs.at[nxt, pl.ds(0, last_len)])

            for t in range(BT):

                @pl.when(t < n_next)
                def _(t: int = t) -> None:
                    row = state_hbm.at[pl.ds(idx[t0 + BT + t], 1)]
                    start(row, bufs.at[nxt, pl.ds(t, 1)], lsems.at[nxt])  # PREFETCH

            if seed == "current_block_waited_on_the_store_semaphores":
                drain(ssems.at[cur], bufs.at[cur, pl.ds(0, n)])
            elif seed != "current_block_wait_dropped":
                drain(lsems.at[cur], bufs.at[cur, pl.ds(0, n)])
            prev = jnp.where(b >= 2, jnp.minimum(BT, end - jnp.maximum((b - 2) * BT, 0)), 0)

            if seed != "store_drain_dropped" and not reuse_first:

                @pl.when(prev > 0)
                def _() -> None:
                    drain(ssems.at[cur], bufs.at[cur, pl.ds(0, prev)])

            o_ref[...] = v_ref[...]
            for t in range(BT):

                @pl.when(t < n)
                def _(t: int = t) -> None:
                    row = state_hbm.at[pl.ds(idx[t0 + t], 1)]
                    start(bufs.at[cur, pl.ds(t, 1)], row, ssems.at[cur])  # STORE

        emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline
        emit(body, grid=(nb,), in_specs=[spec], out_specs=spec)(
            v_hbm, o_hbm, scratches=[h_bufs, idx_ref, load_sems, store_sems]
        )
        last, other = (nb - 1) % 2, nb % 2
        drain(store_sems.at[last], h_bufs.at[last, pl.ds(0, jnp.minimum(BT, end - (nb - 1) * BT))])
        on_other = jnp.where(nb >= 2, jnp.minimum(BT, end - (nb - 2) * BT), 0)
        if seed == "stores_drained_before_reuse":
            on_other = jnp.int32(0)  # drained in the pipeline's last step

        @pl.when(on_other > 0)
        def _() -> None:
            drain(store_sems.at[other], h_bufs.at[other, pl.ds(0, on_other)])

    return kernel


def _decode(safe: bool, seed: str | None = None) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call

    def run(v: jax.Array, idx: jax.Array, dist: jax.Array, state: jax.Array) -> Any:
        return entry(
            _state_cache(safe, seed),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY, SMEM, SMEM, ANY],
                out_specs=[ANY, ANY],
                grid=(1,),
                scratch_shapes=[
                    pltpu.VMEM((2, BT, H, D, D), jnp.float32),
                    pltpu.SemaphoreType.DMA((2,)),
                    pltpu.SemaphoreType.DMA((2,)),
                ],
            ),
            input_output_aliases={0: 0, 3: 1},
            out_shape=[
                jax.ShapeDtypeStruct((T, H, D), jnp.float32),
                jax.ShapeDtypeStruct((STATES, H, D, D), jnp.float32),
            ],
            compiler_params=pltpu.CompilerParams(disable_bounds_checks=True),
            name="decoding_gdn",
        )(v, idx, dist, state)

    return jax.jit(run)


def _decode_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((T, H, D), jnp.float32),
        jax.ShapeDtypeStruct((T,), jnp.int32),
        jax.ShapeDtypeStruct((3,), jnp.int32),
        jax.ShapeDtypeStruct((STATES, H, D, D), jnp.float32),
    )


def test_state_cache_across_pipeline_steps_matches_raw() -> None:
    # Before the fix: T7 for the rows started before the pipeline, which its body waits.
    assert_same_mosaic(_decode(SAFE), _decode(RAW), *_decode_args(), mesh=_v5p())


@pytest.mark.parametrize(
    ("seed", "kernel", "called_from"),
    [
        # The pipeline body is checked as a kernel of its own, first: its prefetches and
        # stores are waited in its later steps (any slot of the same array counts). A copy
        # it leaves in flight on a kernel's semaphore is then the kernel's to wait after the
        # pipeline; the kernel waits no load semaphore there, and says so.
        ("current_block_wait_dropped", "kernel", "# PREFETCH"),
        ("current_block_waited_on_the_store_semaphores", "kernel", "# PREFETCH"),
    ],
)
def test_state_cache_rows_never_waited_are_t7_at_the_start_line(
    seed: str, kernel: str, called_from: str
) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_decode(SAFE, seed), *_decode_args(), mesh=_v5p())
    text = str(err.value)
    assert text.startswith(f"kernel {kernel!r}"), text
    started = f"{__file__}:{line_in(_state_cache, '# STARTED')}"
    assert f"{started} (called from {__file__}:{line_in(_state_cache, called_from)}" in text, text
    assert "started_elsewhere().wait() in a later loop iteration or grid step" in text
    assert "in the body 'body', started at" in text, text


def test_state_cache_store_drain_dropped_in_the_body_is_left_to_verify() -> None:
    # This was once rejected at trace time in the body. The kernel drains both store
    # slots after the pipeline (by size, a traced slot), so with at most two blocks every
    # store is waited: the program is correct on some paths, and trace time rejects only
    # what is wrong on every path. Wrong with more blocks: verify's.
    assert "tpu.wait_dma" in mosaic_text(
        _decode(SAFE, "store_drain_dropped"), *_decode_args(), mesh=_v5p()
    )


# --- verify on the state cache: the prefetch overwrites a buffer a store still reads ------


def _decode_values(end: int) -> tuple[jax.Array, ...]:
    return (
        jnp.zeros((T, H, D), jnp.float32),
        jnp.arange(T, dtype=jnp.int32) % STATES,  # distinct rows for the first STATES tokens
        jnp.array([end, 0, 0], jnp.int32),
        jnp.zeros((STATES, H, D, D), jnp.float32),
    )


@pytest.mark.parametrize("safe", [SAFE, RAW], ids=["safedma", "raw"])
def test_state_cache_prefetch_races_with_the_previous_blocks_store(safe: bool) -> None:
    # The author's order: at step b the next block is prefetched into buffer (b+1) % 2 while
    # block b-1's stores, started from that buffer, are waited only at step b+1.
    with pytest.raises(RaceDetectedError) as err:
        verify(_decode(safe), *_decode_values(10), mesh=_v5p())
    text = str(err.value)
    assert f"called at test_state_caches.py:{line_in(_state_cache, '# PREFETCH')}" in text, text
    assert f"called at test_state_caches.py:{line_in(_state_cache, '# STORE')}" in text, text


@pytest.mark.parametrize("safe", [SAFE, RAW], ids=["safedma", "raw"])
@pytest.mark.parametrize("end", [3, 10, 16])
def test_state_cache_stores_drained_before_reuse_verify(safe: bool, end: int) -> None:
    verify(_decode(safe, "stores_drained_before_reuse"), *_decode_values(end), mesh=_v5p())
