"""The bytes a kernel body adds to each semaphore, less those it takes, over every path.

Why: a copy's semaphore must be back at zero when the kernel ends, so over the whole
kernel (every grid step, every device) the bytes copies add and the bytes waits take
are equal. The body's paths differ (a ``pl.when`` prologue starts one more copy, the
last step waits one more), so no single path has to balance; but when *every* path
through the body adds more than it takes (or takes more than it adds), the sum over
every step and device cannot be zero either, whatever the inputs: a copy is never
waited, or a wait never completes. ``_raw_pairing`` reports those.

A block's balance is a range ``(low, high)`` over its paths: a sequence adds ranges,
a ``cond`` spans its branches, a loop of a known trip count multiplies its body's
range, and a loop of an unknown count (zero included) stretches it without bound in
the direction its body can go. Ranges over-approximate the paths, so a range that
excludes zero is a fact about every path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeAlias

__all__ = ["Net", "add_to", "added", "of_equation"]

Net: TypeAlias = "tuple[float, float]"
"""The lowest and highest net bytes (added less taken) over a block's paths."""

_ONCE = ("jit", "pjit", "closed_call", "core_call", "run_scoped", "remat", "remat2", "checkpoint")


def added(a: Mapping[int, Net], b: Mapping[int, Net]) -> dict[int, Net]:
    """Two blocks one after the other."""
    out = dict(a)
    for root, (low, high) in b.items():
        was = out.get(root, (0.0, 0.0))
        out[root] = (was[0] + low, was[1] + high)
    return out


def add_to(net: dict[int, Net], root: int, step: float) -> None:
    """One copy (``step`` > 0) or wait (< 0) on ``root``, in place: on every path."""
    low, high = net.get(root, (0.0, 0.0))
    net[root] = (low + step, high + step)


def of_equation(
    name: str, params: Mapping[str, Any], blocks: list[dict[int, Net]]
) -> dict[int, Net]:
    """The range of an equation holding ``blocks`` (its branches, its loop body...)."""
    if name == "cond":
        return _spanned(blocks)
    if name == "scan" and isinstance(params.get("length"), int):
        times = int(params["length"])
        return {root: (low * times, high * times) for root, (low, high) in _one(blocks).items()}
    if name in _ONCE or name.endswith("_call"):
        return _one(blocks)
    # a while loop, emit_pipeline, anything else: its blocks run any number of times
    return {root: _repeated(span) for root, span in _one(blocks).items()}


def _spanned(blocks: list[dict[int, Net]]) -> dict[int, Net]:
    """One of ``blocks`` runs: the range spans them (a root a block never names: 0)."""
    roots = {root for block in blocks for root in block}
    out: dict[int, Net] = {}
    for root in roots:
        spans = [block.get(root, (0.0, 0.0)) for block in blocks]
        out[root] = (min(s[0] for s in spans), max(s[1] for s in spans))
    return out


def _one(blocks: list[dict[int, Net]]) -> dict[int, Net]:
    """Every block once, one after another (a call's body; a while loop's condition and body)."""
    out: dict[int, Net] = {}
    for block in blocks:
        out = added(out, block)
    return out


def _repeated(span: Net) -> Net:
    """A block run any number of times, none included."""
    low, high = span
    return (0.0 if low >= 0 else -math.inf, 0.0 if high <= 0 else math.inf)
