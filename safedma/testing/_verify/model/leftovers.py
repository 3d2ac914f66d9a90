"""What a count left in a semaphore is made of, as the leftover messages name it.

A wait moves every contribution it counts into the semaphore's credit, so a wait that
takes less than the copy or signal it counted (a wait of half a copy's bytes, a signal
of 2 waited by 1) leaves a count no pending contribution explains: it is named here by
that wait and what it counted, so the message points at the user's lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from safedma.testing._verify.model.semantics import Contribution, SemState

__all__ = ["Kind", "kind_of", "origin", "partial_wait", "phrase"]

# What a contribution is, as a leftover message groups them: (a copy?, "send side" or
# "", " from <device>" or "", its line, its amount).
Kind = tuple[bool, str, str, str, int]


def kind_of(labels: Sequence[str], s: SemState, c: Contribution) -> Kind:
    """A contribution to ``s``, as the leftover messages group them."""
    if c.dma is not None:
        d = c.dma
        frm = "" if d.issuer == s.buffer.owner else f" from {labels[d.issuer]}"
        return (True, "send side" if c.side == "read" else "", frm, d.where, c.amount)
    frm = "" if c.issuer == s.buffer.owner else f" from {labels[c.issuer]}"
    return (False, "", frm, c.where, c.amount)


def phrase(kind: Kind, n: int, unit: str) -> str:
    """``n`` contributions of one kind: "the copy started at L (4096 bytes)", "the 2
    copies started at L (4096 bytes each)", "a signal from device 1 at L"."""
    is_copy, side, frm, where, amount = kind
    if not is_copy:
        return f"{f'{n} signals' if n > 1 else 'a signal'}{frm} at {where}"
    what = f"{n} copies" if n > 1 else "copy"
    if side:
        what = f"{side}{'s' if n > 1 else ''} of the {what}"
    each = " each" if n > 1 else ""
    return f"the {what}{frm} started at {where} ({amount}{unit}{each})"


def origin(labels: Sequence[str], s: SemState, c: Contribution, unit: str) -> str:
    """A contribution to ``s``: what it is, from which device, at which line."""
    return phrase(kind_of(labels, s, c), 1, unit)


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
