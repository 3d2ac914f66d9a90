"""The census kernels (tests/support/census_kernels.py) under verify.

They use what jax's interpreter cannot run (ref views, DMA futures), so verify
is the only CPU check of their protocol.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import safedma as sd
from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SignalAfterExitError,
    UnwrittenReadError,
    abstract_mesh,
    verify,
)
from tests.support import census_kernels as ck

X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def test_rpa_prefetch_with_2d_semaphores_and_views_is_clean() -> None:
    steps, num_pages = 3, 16
    call = ck.rpa_call(ck.rpa_prefetch, steps, num_pages, sd.pallas_call, ck.rpa_scratch())
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.integers(0, num_pages, steps * ck.PAGES), jnp.int32)
    pages = jax.ShapeDtypeStruct((num_pages, ck.PAGE_ROWS, ck.LANES), jnp.float32)
    report = verify(call, table, pages)
    assert report.dmas == 15 and report.waits == 15


def test_future_pair_is_clean() -> None:
    assert verify(ck.copy_through_future, X).dmas == 1


def test_chained_futures_are_clean() -> None:
    assert verify(ck.staggered_futures, X).dmas == 4


MOE_MESH = abstract_mesh((4,), (ck.AXIS,))
MOE_X = jax.ShapeDtypeStruct((4 * 4 * 8, 128), jnp.float32)  # 8 rows per block


def _moe(kernel: Callable[..., None], scratch: list[Any] | None = None) -> sd.testing.VerifyReport:
    return verify(ck.moe_call(kernel, MOE_MESH, sd.pallas_call, scratch), MOE_X)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_moe_all_to_all_waited_by_size_is_clean(devices: int) -> None:
    """One DMA semaphore counts the local block, the n - 1 sent and the n - 1 received
    blocks; two waits by size (n blocks, then n - 1) cover all 2n - 1. The first wait
    guarantees no block in particular (any n of them may release it); the second
    guarantees them all, and nothing reads a block in between."""
    mesh = abstract_mesh((devices,), (ck.AXIS,))
    x = jax.ShapeDtypeStruct((devices * devices * 8, 128), jnp.float32)
    report = verify(ck.moe_call(ck.moe_all_to_all, mesh, sd.pallas_call), x)
    assert report.dmas == devices * devices and report.waits == 2 * devices


def _own(me: jax.Array, n: int) -> jax.Array:
    return me


def _received(me: jax.Array, n: int) -> jax.Array:
    return (me + 1) % n


@pytest.mark.parametrize("block", [_own, _received])
def test_moe_block_read_after_the_total_wait_is_clean(block: Callable[..., jax.Array]) -> None:
    assert _moe(ck.moe_then_read(block, early=False), ck.moe_read_scratch(8)).dmas == 20


def test_moe_own_block_read_between_the_waits_is_caught() -> None:
    """Seeded bug: the first wait (4 blocks of the 7 the semaphore counts) may be released
    by the 3 sent blocks and a received one, so the local block is not guaranteed there.
    The schedule verify walks first runs the wait before any receive arrives; the replay
    that counts the early receives at the wait catches it."""
    with pytest.raises(RaceDetectedError) as caught:
        _moe(ck.moe_then_read(_own, early=True), ck.moe_read_scratch(8))
    text = str(caught.value)
    assert "o_ref" in text and "census_kernels.py" in text, text
    assert "whichever land first" in text, text


def test_moe_received_block_read_between_the_waits_is_caught() -> None:
    """Seeded bug: the block from the left neighbour read between the waits. In the walked
    order that device has not even started its copy (R6); in others it is in flight (R1)."""
    with pytest.raises((RaceDetectedError, UnwrittenReadError)) as caught:
        _moe(ck.moe_then_read(_received, early=True), ck.moe_read_scratch(8))
    text = str(caught.value)
    assert "o_ref" in text and "census_kernels.py" in text, text


def test_moe_second_wait_one_block_short_is_caught() -> None:
    """Seeded bug: 2n - 2 blocks waited of the 2n - 1 counted. A device may then return
    its output before the last receive landed (verify reports the copy that lands
    after its target returned, R8, or the output read at the return) or leave a block
    on the semaphore."""
    with pytest.raises(
        (LeftoverSemaphoreError, UnwrittenReadError, RaceDetectedError, SignalAfterExitError)
    ) as caught:
        _moe(ck.moe_one_block_short)
    assert re.search(r"\b(o_ref|sem)\b", str(caught.value)), caught.value
