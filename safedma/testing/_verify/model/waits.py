"""What a semaphore wait guarantees, made schedule-independent by replaying with hints.

A semaphore is (credit K, contributions P not yet guaranteed). A wait of N
guarantees contribution d iff K + sum(P) - size(d) < N (docs/verify-model.md, rule 4):
on a TPU a wait is released by whichever contributions land first. verify
walks one schedule, so when a wait runs, P holds only the contributions this
schedule issued before it; a contribution issued later but *not ordered after
the wait* (its issuer had not observed the waiter's clock after the wait)
could have landed first on a TPU. Such an early contribution is found when it
arrives: if counting it at the wait changes the wait's outcome (the set it
guarantees, or the clock the waiter learns), it becomes a *hint* for that wait
and the whole program is walked again with the hint counted from the start.

The schedule never depends on clocks or on which contributions a wait
guarantees (only on counts), so the replay reaches the same waits and
contributions in the same order and hints are keyed by sequence numbers.
Whatever the program did with the stronger guarantee is then judged by the
ordinary rules: a read of a copy no longer guaranteed is a race, a remote copy
to a device no longer known to have entered the call is R10. Hints only weaken
outcomes, so replays converge; a hint's clock is the contribution's clock in
the walk that found it, checked again when it arrives in the replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from safedma.testing._verify.model.clocks import Clock
from safedma.testing._verify.model.clocks import learned as clocks_learned

__all__ = ["Counted", "Early", "Hints", "Outcome", "WaitRecord", "learned_clock", "outcome"]


class Counted(Protocol):
    """A contribution as a wait counts it."""

    @property
    def amount(self) -> int: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def seq(self) -> int: ...


class Early:
    """A contribution counted at a wait it was not ordered after (kept across replays)."""

    __slots__ = ("seq", "amount", "clock", "issuer", "where", "what")

    def __init__(self, seq: int, amount: int, clock: Clock, issuer: int, where: str, what: str):
        self.seq, self.amount, self.clock = seq, amount, clock
        self.issuer, self.where, self.what = issuer, where, what


Outcome = tuple[frozenset[int], "Clock | None"]


def outcome(credit: int, amount: int, cands: Sequence[Counted]) -> Outcome:
    """(sequence numbers guaranteed, clock learned) of a wait of ``amount`` over ``cands``."""
    total = credit + sum(c.amount for c in cands)
    guaranteed = frozenset(c.seq for c in cands if total - c.amount < amount)
    need = amount - credit
    learned = learned_clock(cands, need) if need > 0 and cands else None
    return guaranteed, learned


def same(a: Outcome, b: Outcome) -> bool:
    if a[0] != b[0]:
        return False
    la, lb = a[1], b[1]
    if la is None or lb is None:
        return la is lb
    return bool(np.array_equal(la, lb))


def learned_clock(cands: Sequence[Counted], need: int) -> Clock:
    """What a wait that needs ``need`` more of ``cands`` is sure has happened.

    The waiter knows some subset of ``cands`` summing to at least ``need``
    arrived, not which. Per participant q, the least it can be sure of is the
    smallest clock value t such that the contributions with clock[q] <= t
    already sum to ``need`` (an adversary delivers the ones that know least of
    q first). Contributions every such subset contains (the guaranteed ones)
    are therefore learned in full.
    """
    return clocks_learned([c.clock for c in cands], [c.amount for c in cands], need)


class WaitRecord:
    """One completed wait: what it counted, what it used, what arrived early since."""

    __slots__ = (
        "seq",
        "waiter",
        "at",
        "where",
        "credit",
        "amount",
        "present",
        "early",
        "used",
        "now",
    )

    def __init__(
        self,
        seq: int,
        waiter: int,
        at: int,
        where: str,
        credit: int,
        amount: int,
        present: Sequence[Counted],
        early: list[Early],
        used: Outcome,
    ) -> None:
        self.seq, self.waiter, self.at, self.where = seq, waiter, at, where
        self.credit, self.amount = credit, amount
        self.present = present  # pending when the wait ran
        self.early = early  # counted by hint, or found early since
        self.used = used  # the outcome the walk applied
        self.now = used  # the outcome with every candidate known so far

    def irrelevant(self, clock: Clock) -> bool:
        """True if no contribution with ``clock`` can change this wait's outcome any more:
        it guarantees nothing, and the contribution knows at least what the waiter learned
        (it never counts among the ones that know least)."""
        guaranteed, learned = self.now
        if guaranteed:
            return False
        return learned is None or bool(np.all(clock >= learned))

    def add_early(self, e: Early) -> bool:
        """Count ``e`` (or replace the estimate of it); True if the outcome now differs
        from the one the walk applied."""
        for i, x in enumerate(self.early):
            if x.seq == e.seq:
                self.early[i] = e
                self.now = outcome(self.credit, self.amount, [*self.present, *self.early])
                return not self._equivalent()
        self.early.append(e)
        cands = [*self.present, *self.early]
        learned = self.now[1]
        if learned is not None and bool(np.all(e.clock >= learned)):
            # A candidate that knows at least what the waiter learned never counts among
            # the ones that know least: the learned clock stays; only the guarantees move.
            total = self.credit + sum(c.amount for c in cands)
            kept = frozenset(c.seq for c in cands if total - c.amount < self.amount)
            self.now = (kept, learned)
        else:
            self.now = outcome(self.credit, self.amount, cands)
        return not self._equivalent()

    def _equivalent(self) -> bool:
        """True if the outcome with the early contributions differs from the applied one at
        most in signals it no longer guarantees while the clock learned is the same.

        Such a signal stays pending for the next waits instead of moving into the credit;
        their total, hence what they guarantee, is unchanged, and what they learn too: a
        contribution this wait guaranteed is already known to the waiter, so counting it
        again among a later wait's candidates cannot lower what that wait learns below
        what the waiter knows. Only a copy's guarantee settles buffer accesses, so only a
        copy's loss needs a new walk.
        """
        (used_g, used_l), (now_g, now_l) = self.used, self.now
        if not same((frozenset(), used_l), (frozenset(), now_l)):
            return False
        lost = used_g - now_g
        return not any(c.seq in lost and getattr(c, "dma", None) is not None for c in self.present)


class Hints:
    """Early contributions per wait (by sequence number), carried from one walk to the next."""

    def __init__(self) -> None:
        self.by_wait: dict[int, dict[int, Early]] = {}
        self.changed = False
        self.walks = 0

    def at(self, wait: int) -> list[Early]:
        found = self.by_wait.get(wait)
        return list(found.values()) if found else []

    def add(self, wait: int, early: Sequence[Early]) -> None:
        known = self.by_wait.setdefault(wait, {})
        for e in early:
            old = known.get(e.seq)
            if old is None or not np.array_equal(old.clock, e.clock):
                known[e.seq] = e
                self.changed = True

    def start_walk(self) -> None:
        self.changed = False
        self.walks += 1
