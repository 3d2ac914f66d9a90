"""Bring a DMA semaphore's leftover count back to zero at exit, with DMA waits.

A DMA semaphore left non-zero when a Mosaic kernel exits halts the TPU core
("Semaphore ... has a nonzero value upon exit"), so the sanitizer's report would
never be read. A DMA semaphore takes only DMA waits (``pl.semaphore_wait``
refuses it), and a DMA wait takes from the count what its window amounts to
(:func:`._units.amount`). The drain therefore waits on windows of a small SMEM
buffer of its own, from the largest window to the smallest, never for more
than the count holds (a wait for more would block). On the chip a copy may
still be landing at exit: the count is read once it has stopped changing for
:data:`STABLE_POLLS` polls, drained, and read again until it stays at zero
(at most :data:`ROUNDS` times).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._sanitize import _jax
from safedma._sanitize._units import Backend, amount

__all__ = ["BUFFER", "ROUNDS", "STABLE_POLLS", "drain_dma", "pieces", "settle"]

# pltpu.make_async_copy's parameters are unannotated in jax: typed once here.
_make_async_copy = cast("Callable[..., Any]", getattr(pltpu, "make_async_copy"))

#: The drain's own buffer: its windows are the DMA waits' descriptors (nothing is copied).
BUFFER = (8, 128)
_ITEMSIZE = 4  # int32 words, SMEM's own
#: Polls a count must stay unchanged before the chip's drain trusts it (about 12 us).
STABLE_POLLS = 1000
#: Drain rounds (read, drain) before the drain gives up on a count that keeps changing.
ROUNDS = 64


def pieces(backend: Backend) -> list[tuple[tuple[int, ...], int]]:
    """The drain's windows as ``(shape, amount)``, largest amount first, each amount
    smaller than the one before: rows ``(r, 128)`` of the buffer, then parts ``(n,)``
    of its first row (on the chip those count as a whole row and are left out)."""
    rows, lanes = BUFFER
    shapes: list[tuple[int, ...]] = []
    r = rows
    while r >= 1:
        shapes.append((r, lanes))
        r //= 2
    n = lanes // 2
    while n >= 1:
        shapes.append((n,))
        n //= 2
    kept: list[tuple[tuple[int, ...], int]] = []
    for shape in shapes:
        units = amount(shape, _ITEMSIZE, backend, remote=False)
        if units > 0 and (not kept or units < kept[-1][1]):
            kept.append((shape, units))
    return kept


def _window(buffer: Any, shape: tuple[int, ...]) -> Any:
    if len(shape) == 2:
        return buffer.at[pl.ds(0, shape[0])]
    return buffer.at[0, pl.ds(0, shape[0])]


def settle(
    root: Any, transforms: Sequence[Any], count: jax.Array, backend: Backend, limit: int
) -> jax.Array:
    """The count once it has stopped changing: on the chip, polled until it reads the
    same :data:`STABLE_POLLS` times running (at most ``limit`` polls); in interpret
    mode, read once (a read there runs the copies pending on the semaphore)."""
    if backend is not Backend.CHIP:
        return _jax.read_semaphore(root, transforms, backend)

    def more(carry: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        polls, same, _ = carry
        return jnp.logical_and(same < STABLE_POLLS, polls < limit)

    def poll(
        carry: tuple[jax.Array, jax.Array, jax.Array],
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        polls, same, last = carry
        now = _jax.read_semaphore(root, transforms, backend)
        return polls + 1, jnp.where(now == last, same + 1, jnp.int32(0)), now

    _, _, settled = lax.while_loop(more, poll, (jnp.int32(0), jnp.int32(0), count))
    return settled


def drain_dma(view: Any, count: jax.Array, buffer: Any, backend: Backend, limit: int) -> None:
    """Wait ``view`` (one DMA semaphore slot) down from ``count`` (already settled) to
    zero on windows of ``buffer`` (SMEM int32 :data:`BUFFER`), re-reading it after each
    round in case more landed."""
    root, transforms = _split(view)
    windows = pieces(backend)

    def once(held: jax.Array) -> None:
        for shape, units in windows:
            window = _window(buffer, shape)

            def take(left: jax.Array, window: Any = window, units: int = units) -> jax.Array:
                _make_async_copy(window, window, view).wait()
                return left - units

            def enough(left: jax.Array, units: int = units) -> jax.Array:
                return left >= units

            held = lax.while_loop(enough, take, held)

    def round_(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        rounds, held = carry
        once(held)
        now = _jax.read_semaphore(root, transforms, backend)
        return rounds + 1, settle(root, transforms, now, backend, limit)

    def more(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        rounds, held = carry
        return jnp.logical_and(held > 0, rounds < ROUNDS)

    lax.while_loop(more, round_, (jnp.int32(0), _jax.asarray(count, jnp.int32)))


def _split(ref: Any) -> tuple[Any, tuple[Any, ...]]:
    transforms: list[Any] = []
    while hasattr(ref, "transforms") and hasattr(ref, "ref"):
        transforms[:0] = list(ref.transforms)
        ref = ref.ref
    return ref, tuple(transforms)
