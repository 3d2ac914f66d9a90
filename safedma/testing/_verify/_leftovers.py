"""What a count left in a semaphore is made of, as the leftover messages name it.

A wait moves every contribution it counts into the semaphore's credit, so a wait that
takes less than the copy or signal it counted (a wait of half a copy's bytes, a signal
of 2 waited by 1) leaves a count no pending contribution explains: it is named here by
that wait and what it counted, so the message points at the user's lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from safedma.testing._verify._semantics import Contribution, SemState

__all__ = ["origin", "partial_wait"]


def origin(labels: Sequence[str], s: SemState, c: Contribution, unit: str) -> str:
    """A contribution to ``s``: what it is, from which device, at which line."""
    if c.dma is not None:
        d = c.dma
        side = "send side of the copy" if c.side == "read" else "copy"
        frm = "" if d.issuer == s.buffer.owner else f" from {labels[d.issuer]}"
        return f"the {side}{frm} started at {d.where} ({c.amount}{unit})"
    frm = "" if c.issuer == s.buffer.owner else f" from {labels[c.issuer]}"
    return f"a signal{frm} at {c.where}"


def partial_wait(labels: Sequence[str], s: SemState, unit: str) -> str:
    """``": the wait at L took N of the M brought by ..."`` for the latest wait on ``s``
    that took less than what it counted; ``""`` when there is none on record."""
    for rec in reversed(s.waits):
        counted = [c for c in rec.present if c.seq in rec.used[0]]
        brought = sum(c.amount for c in counted)
        if brought > rec.amount:
            whose = [origin(labels, s, c, unit) for c in counted if isinstance(c, Contribution)]
            return (
                f": the wait at {rec.where} took {rec.amount}{unit} of the {brought}{unit} "
                f"brought by {'; '.join(whose[:3])}"
            )
    return ""
