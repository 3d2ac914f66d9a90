"""Vector clocks for happens-before, one component per participant (numpy rows).

Release operations (a DMA start, a signal, a barrier) hand on a copy of the
issuer's row and then tick its own component, so an access stamped with
``(participant, clock)`` is ordered before an observer iff
``observer_row[participant] >= clock``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Clock = npt.NDArray[np.int32]
# int32, not int64: an epoch counts one participant's releases (far below 2**31), and a
# run keeps one clock per started copy and per signal until the end (a wait record holds
# them for rule 6), so at 256 devices and more the clocks are most of verify's memory.
CLOCK_DTYPE = np.int32

__all__ = ["CLOCK_DTYPE", "Clock", "Clocks"]


class Clocks:
    """The clocks of all participants: row ``p`` is what participant ``p`` has observed."""

    def __init__(self, participants: int) -> None:
        self.rows: Clock = np.zeros((participants, participants), dtype=CLOCK_DTYPE)
        self.rows[np.arange(participants), np.arange(participants)] = 1
        # rows[p, p] as Python ints: read at every access and wait, far cheaper than
        # a numpy element. Only release and barrier move a participant's own epoch
        # (an acquire never raises it: no one can have seen a later epoch of p).
        self.own: list[int] = [1] * participants

    def now(self, p: int) -> int:
        return self.own[p]

    def release(self, p: int) -> Clock:
        """A copy of ``p``'s clock for a message; ``p`` moves on to a new epoch."""
        row = self.rows[p]
        sent: Clock = row.copy()
        self.own[p] += 1
        row[p] = self.own[p]
        return sent

    def acquire(self, p: int, seen: Clock) -> None:
        row = self.rows[p]
        np.maximum(row, seen, out=row)

    def knows(self, p: int, q: int, clock: int) -> bool:
        """True if ``q``'s event at ``clock`` happens before ``p``'s current point."""
        return bool(self.rows[p, q] >= clock)

    def barrier(self, members: list[int]) -> None:
        """Everyone in ``members`` observes everyone, then starts a new epoch."""
        idx = np.asarray(members)
        joined = self.rows[idx].max(axis=0)
        self.rows[idx] = joined
        self.rows[idx, idx] += 1
        for q in members:
            self.own[q] = int(self.rows[q, q])


def learned(clocks: list[Clock], amounts: list[int], need: int) -> Clock:
    """Per participant q, the least clock[q] that contributions summing to ``need`` reach.

    Sort the contributions by their clock[q]; the answer is the clock[q] of the first
    one at which the running sum of amounts reaches ``need``. Two cases cover almost
    every wait and need no sort: when any single contribution suffices (every amount
    is at least ``need``) the answer is the elementwise minimum; when every prefix
    that leaves one out falls short (``total - min(amounts) < need``) it is the
    elementwise maximum. Otherwise the general sort runs.
    """
    n = len(clocks)
    if n == 1:
        return clocks[0]
    smallest = min(amounts)
    if smallest >= need:
        out: Clock = clocks[0].copy()
        for c in clocks[1:]:
            np.minimum(out, c, out=out)
        return out
    if sum(amounts) - smallest < need:
        out = clocks[0].copy()
        for c in clocks[1:]:
            np.maximum(out, c, out=out)
        return out
    m = np.stack(clocks)
    sizes = np.asarray(amounts, dtype=np.int64)
    order = np.argsort(m, axis=0, kind="stable")
    values = np.take_along_axis(m, order, axis=0)
    reached = np.cumsum(sizes[order], axis=0) >= need
    first = np.argmax(reached, axis=0)
    general: Clock = values[first, np.arange(m.shape[1])]
    return general
