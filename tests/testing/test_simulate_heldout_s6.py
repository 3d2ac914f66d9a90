"""DMA patterns of kernels from other authors (session 6) under strict simulation.

Every kernel here is written for safedma's tests; each reproduces a construct
met in Pallas TPU kernels written outside jax and this project (pytorch/xla's
paged attention, docs/simulate-jax-tests.md "Kernels from other authors
(session 6)") that strict simulation once mishandled, or that it must keep
handling.  The correct kernel must run clean with the reference's output; its
broken twins must be caught, naming the kernel's own line.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import KernelFailedError, RaceDetectedError, simulate
from tests.support.simulation import F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

I32 = jnp.int32
ROWS = 8  # rows of one page
PAGES = 6  # pages of the cache
STEPS = 4  # grid steps: one page of K and one of V each
TABLE = (4, 1, 5, 2)  # page of each step


# --------------------- K and V pages on ONE DMA semaphore, next step's pages prefetched

Variant = Literal["correct", "v-wait-dropped", "waits-swapped-read-between", "waits-swapped"]


def _paged_kv(
    table: Any,
    k_hbm: Any,
    v_hbm: Any,
    o_ref: Any,
    k_buf: Any,
    v_buf: Any,
    sem: Any,
    *,
    variant: Variant,
) -> None:
    # pytorch/xla's multi-query paged attention: the K copy and the V copy of a
    # step share one DMA semaphore, and the next step's pages are started before
    # this step's are waited. A wait releases when ITS byte count has landed on
    # the semaphore, whichever copy brought them: after the K wait only the
    # copies issued first are certain. Before: jax's interpreter ordered a wait
    # after every signal so far, so a V page read after the K wait alone ran clean.
    i = pl.program_id(0)
    slot = i % 2

    def copies(step: Any, at: Any) -> tuple[Any, Any]:
        k = pltpu.make_async_copy(k_hbm.at[table[step]], k_buf.at[at], sem)
        v = pltpu.make_async_copy(v_hbm.at[table[step]], v_buf.at[at], sem)
        return k, v

    @pl.when(i == 0)
    def _() -> None:
        k0, v0 = copies(0, 0)
        k0.start()
        v0.start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        k1, v1 = copies(i + 1, 1 - slot)
        k1.start()
        v1.start()

    k, v = copies(i, slot)
    if variant == "correct":
        k.wait()
        v.wait()
        o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]
    elif variant == "v-wait-dropped":
        k.wait()
        o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]  # V page still in flight
    elif variant == "waits-swapped-read-between":
        v.wait()  # releases on the K page's bytes: K landed first
        v_part = 2.0 * v_buf[slot]  # V page still in flight
        k.wait()
        o_ref[...] = k_buf[slot] + v_part
    else:  # waits-swapped: both waited before any read, clean
        v.wait()
        k.wait()
        o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]


def _paged_kv_call(variant: Variant) -> Any:
    def kernel(*refs: Any) -> None:
        _paged_kv(*refs, variant=variant)

    def call(table: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((STEPS * ROWS, 128), F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(STEPS,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
                out_specs=pl.BlockSpec((ROWS, 128), lambda i, table: (i, 0)),
                scratch_shapes=[
                    pltpu.VMEM((2, ROWS, 128), F32),
                    pltpu.VMEM((2, ROWS, 128), F32),
                    pltpu.SemaphoreType.DMA,
                ],
            ),
        )(table, k, v)
        return out

    return call


def _kv_inputs() -> tuple[jax.Array, jax.Array, jax.Array]:
    k = example((PAGES, ROWS, 128))
    return jnp.asarray(TABLE, I32), k, 1000.0 + k


@pytest.mark.parametrize("variant", ["correct", "waits-swapped"])
def test_kv_pages_on_one_semaphore_waited_before_their_reads_run_clean(variant: Variant) -> None:
    table, k, v = _kv_inputs()
    out = simulate(_paged_kv_call(variant), table, k, v)
    pages = np.asarray(TABLE)
    expected = (np.asarray(k)[pages] + 2.0 * np.asarray(v)[pages]).reshape(STEPS * ROWS, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize(
    ("variant", "read"),
    [
        ("v-wait-dropped", "o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]  # V page"),
        ("waits-swapped-read-between", "v_part = 2.0 * v_buf[slot]"),
    ],
    ids=["v-wait-dropped", "waits-swapped-read-between"],
)
def test_a_v_page_read_before_a_wait_that_covers_it_is_a_race(variant: Variant, read: str) -> None:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_paged_kv_call(variant), *_kv_inputs())
    message = str(caught.value)
    assert f"at {line_of(_paged_kv, read)} " in message, message
    assert line_of(_paged_kv, "v0.start()") in message, message  # the copy's start
    assert_clean_afterwards()


# --------------------- a table entry read one past its end by a non-short-circuit "and"


def _next_nonempty(
    lengths: Any, x_ref: Any, o_ref: Any, buf: Any, sem: Any, *, clamp: bool
) -> None:
    # The same kernel's look-ahead: `jnp.logical_and(nxt < n, lengths[nxt] == 0)`
    # evaluates both sides, so the last step reads lengths[n]: an SMEM read past
    # the table (on a TPU it reads whatever follows it). The clamped twin is clean.
    i = pl.program_id(0)
    n = lengths.shape[0]
    nxt = i + 1
    index = jnp.minimum(nxt, n - 1) if clamp else nxt
    skip = jnp.logical_and(nxt < n, lengths[index] == 0)
    copy = pltpu.make_async_copy(x_ref.at[pl.ds(i * ROWS, ROWS)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] + jnp.where(skip, 1.0, 0.0)


def _next_nonempty_call(clamp: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _next_nonempty(*refs, clamp=clamp)

    def call(lengths: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(lengths.shape[0],),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((ROWS, 128), lambda i, lengths: (i, 0)),
                scratch_shapes=[pltpu.VMEM((ROWS, 128), F32), pltpu.SemaphoreType.DMA],
            ),
        )(lengths, x)
        return out

    return call


def test_a_clamped_look_ahead_runs_clean() -> None:
    lengths = jnp.asarray([3, 0, 5], I32)
    x = example((3 * ROWS, 128))
    out = np.asarray(simulate(_next_nonempty_call(True), lengths, x))
    expected = np.asarray(x).copy()
    expected[:ROWS] += 1.0  # step 0: the next entry (1) is empty
    np.testing.assert_array_equal(out, expected)


def test_a_look_ahead_past_the_table_fails_at_its_line() -> None:
    with pytest.raises(KernelFailedError) as caught:
        simulate(_next_nonempty_call(False), jnp.asarray([3, 0, 5], I32), example((3 * ROWS, 128)))
    message = str(caught.value)
    assert line_of(_next_nonempty, "skip = jnp.logical_and") in message, message
    assert "Out-of-bounds read" in message, message


# --------------------- copies started by a helper of the kernel: which call


def _start_page(src: Any, dst: Any, sem: Any) -> Any:
    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()  # the same line for every page: the caller's tells them apart
    return copy


def _two_pages(x_ref: Any, o_ref: Any, buf: Any, sems: Any, *, wait_first: bool) -> None:
    # The paged-attention descriptors start every copy from one method; the
    # twin reuses the buffer for the second page while the first is in flight.
    first = _start_page(x_ref.at[pl.ds(0, ROWS)], buf, sems.at[0])
    if wait_first:
        first.wait()
        o_ref[pl.ds(0, ROWS), :] = buf[...]
    second = _start_page(x_ref.at[pl.ds(ROWS, ROWS)], buf, sems.at[1])  # second page
    second.wait()
    o_ref[pl.ds(ROWS, ROWS), :] = buf[...]
    if not wait_first:
        first.wait()
        o_ref[pl.ds(0, ROWS), :] = x_ref[pl.ds(0, ROWS), :]


def _two_pages_call(wait_first: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _two_pages(*refs, wait_first=wait_first)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((2 * ROWS, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), F32), pltpu.SemaphoreType.DMA((2,))],
    )


def test_pages_started_by_one_helper_and_waited_run_clean() -> None:
    x = example((2 * ROWS, 128))
    np.testing.assert_array_equal(np.asarray(simulate(_two_pages_call(True), x)), np.asarray(x))


def test_a_race_between_copies_of_one_helper_names_the_callers_line() -> None:
    with pytest.raises(RaceDetectedError) as caught:
        simulate(_two_pages_call(False), example((2 * ROWS, 128)))
    message = str(caught.value)
    helper = line_of(_start_page, "copy.start()")
    caller = line_of(_two_pages, "# second page").rsplit(":", 1)[1]
    # verify's rule: the kernel lines that called the helper, innermost first
    assert f"{helper} (_start_page, called at line {caller} in _two_pages, line " in message, (
        message
    )
