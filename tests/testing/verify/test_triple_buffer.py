"""A manual triple buffer with in-place writeback under verify (tpu-inference's
long-context RPA pipeline, ``batched_rpa_long_ctx/pipeline.py``).

Fetches two steps ahead, an in-place kv writeback waited in the step, outputs waited two
steps behind; its slot of step - 2 is ``lax.rem(step - 2, 3)``, negative at steps 0 and 1
(an out-of-range semaphore index, R5, under 0-byte waits).

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, SemaphoreIndexError, verify

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


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
    assert text in message and "test_triple_buffer.py:" in message, message
