"""A page group: a helper class holding the page copies of one block (paged attention).

Optional scale copies on the same semaphore, ``None`` operands and ``None`` scratch when
unquantized; started in ``pl.when`` prefetch branches and waited in the main body on
rebuilt copies (``started_elsewhere()``), the buffer slot kept in a scalar-prefetch ref.
A dropped wait names the helper and each of its callers.

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
from safedma.testing import assert_same_mosaic
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False
PAGES, PAGE, D, BLOCK_PAGES = 8, 8, 128, 2


# --- a page group prefetched in one grid step and waited in the next ---------------------


class _PageGroup:
    """The copies of one block's pages (and their scales), all on one semaphore."""

    def __init__(
        self,
        safe: bool,
        pages: Any,
        scales: Any,
        buf: Any,
        scale_buf: Any,
        sem: Any,
        table: Any,
        first: Any,
    ) -> None:
        make = sd.LocalCopy if safe else pltpu.make_async_copy
        self.safe = safe
        self.copies = [make(pages.at[table[first + i]], buf.at[i], sem) for i in range(BLOCK_PAGES)]
        if scales is not None and scale_buf is not None:
            self.copies += [
                make(scales.at[table[first + i]], scale_buf.at[i], sem) for i in range(BLOCK_PAGES)
            ]

    def start(self) -> None:
        for copy in self.copies:
            copy.start()

    def wait(self, *, drop: bool = False) -> None:
        if drop:
            return
        for copy in self.copies:
            (copy.started_elsewhere() if self.safe else copy).wait()


def _paged(safe: bool, *, drop_waits: bool = False) -> Callable[..., None]:
    def kernel(
        table: Any,
        slot_ref: Any,
        q_ref: Any,
        pages: Any,
        scales: Any,
        o_ref: Any,
        buf: Any,
        scale_buf: Any,
        sems: Any,
    ) -> None:
        i, n = pl.program_id(0), pl.num_programs(0)
        slot = slot_ref[0]

        def group(block: Any, at: Any) -> _PageGroup:
            return _PageGroup(
                safe,
                pages,
                scales,
                buf.at[at],
                scale_buf.at[at] if scale_buf is not None else None,
                sems.at[at],
                table,
                block * BLOCK_PAGES,
            )

        @pl.when(i == 0)
        def _first() -> None:
            group(i, slot).start()  # first prefetch

        @pl.when(i + 1 < n)
        def _next() -> None:
            following = jnp.where(slot == 0, 1, 0)
            group(i + 1, following).start()
            slot_ref[0] = following

        group(i, slot).wait(drop=drop_waits)
        loaded = buf.at[slot][...].reshape(-1, D)
        if scale_buf is not None:
            loaded = loaded * scale_buf.at[slot][...].reshape(-1, D)
        o_ref[...] = q_ref[...] + loaded[: q_ref.shape[0]]

    return kernel


def _paged_call(kernel: Callable[..., None], entry: Any, *, quantized: bool) -> Any:
    blocks = PAGES // BLOCK_PAGES
    spec = pl.BlockSpec((PAGE, D), lambda i, *_: (i, 0))

    def run(table: jax.Array, q: jax.Array, pages: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            in_specs=[spec, ANY, ANY if quantized else None],
            out_specs=spec,
            grid=(blocks,),
            scratch_shapes=[
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32),
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32) if quantized else None,
                sd.dma_semaphores(2),
            ],
        )
        slot = jnp.zeros((1,), jnp.int32)
        call = entry(kernel, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid_spec=grid_spec)
        return call(table, slot, q, pages, pages if quantized else None)

    return jax.jit(run)


def _paged_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    blocks = PAGES // BLOCK_PAGES
    return (
        jax.ShapeDtypeStruct((PAGES,), jnp.int32),
        jax.ShapeDtypeStruct((blocks * PAGE, D), jnp.float32),
        jax.ShapeDtypeStruct((PAGES, PAGE, D), jnp.float32),
    )


@pytest.mark.parametrize("quantized", [False, True])
def test_page_group_prefetched_in_a_branch_waited_next_step_matches_raw(quantized: bool) -> None:
    assert_same_mosaic(
        _paged_call(_paged(SAFE), sd.pallas_call, quantized=quantized),
        _paged_call(_paged(RAW), pl.pallas_call, quantized=quantized),
        *_paged_args(),
    )


def test_page_group_waits_dropped_names_the_helper_and_each_caller() -> None:
    broken = _paged_call(_paged(SAFE, drop_waits=True), sd.pallas_call, quantized=True)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        jax.eval_shape(broken, *_paged_args())
    message = str(err.value)
    start = line_in(_PageGroup.start, "copy.start()")
    first = line_in(_paged, "# first prefetch")
    assert f"{__file__}:{start} (called from {__file__}:{first}" in message, message
    # Both prefetches (page and scale copies of each) are listed, none waited: one line
    # per start site and buffers, with the count of the page loop's copies.
    assert message.count("wait() never called") == 2 * 2, message
    assert message.count(f"  - {BLOCK_PAGES} copies of LocalCopy pages.at[...]") == 2, message
    assert message.count(f"  - {BLOCK_PAGES} copies of LocalCopy scales.at[...]") == 2, message
    assert f"{2 * 2 * BLOCK_PAGES} copies were started" in message, message
