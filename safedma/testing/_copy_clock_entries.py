"""Which vector-clock entry each copy counts its events on: its own while it may matter.

jax's race detector gives every copy ("DMA") one entry of a fixed-size vector
clock, beyond one entry per core, and counts the copy's reads, writes and
signals there.  Two copies on one entry are one virtual thread to it: a core
that waited the later copy counts as ordered after the earlier one too, so a
read of the earlier copy's destination before its own wait is a race missed
(a read after waiting 50 of 100 copies in flight, of a row whose copy shared
an entry with a waited one, ran clean).  jax draws entries at random;
simulate used to hand them out in turn, which shares one once more copies are
started than there are entries.

:class:`CopyEntries` hands a new copy an entry whose last copy is *known to its
issuing core* to have completed: the core's clock has reached that copy's
final count there (it waited the copy, or learned of it through a wait on a
signal sent after it).  Then everything ordered after the new copy is truly
ordered after the old one, so sharing the entry orders nothing that was not
ordered: the verdict is the one of a clock with one entry per copy.  Only when
no entry is free (more copies in flight at once than entries) does a copy
share one; :attr:`CopyEntries.shortages` counts those, and ``simulate`` runs
again with more entries (``_runner``), up to a bound on memory.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["ATTRIBUTE", "CopyEntries", "entries_of"]


@dataclasses.dataclass(frozen=True)
class _Holder:
    """The copy that counts on an entry last: its clock, and the copy itself, weakly
    (it holds its data; a copy gone is a copy completed).  No clock: still being built."""

    clock: Any
    copy: Callable[[], object]


_BUILDING = _Holder(None, lambda: None)


def _count(clock: Any, position: int) -> int:
    """Entry ``position`` of a jax vector clock (jax 0.12: a VectorClock, 0.10: an array)."""
    return int(getattr(clock, "clock", clock)[position])


class CopyEntries:
    """The copy entries ``first .. first + size - 1`` of one simulated TPU's vector clocks."""

    def __init__(self, first: int, size: int) -> None:
        self._first = first
        self._size = size
        self._lock = threading.Lock()
        self._next = 0
        self._holders: list[_Holder | None] = [None] * size
        self.shortages = 0

    def _free(self, index: int, base: Any) -> bool:
        holder = self._holders[index]
        if holder is None:
            return True
        if holder.clock is None:  # being built
            return False
        live = holder.copy()
        if live is not None and getattr(getattr(live, "state", None), "name", "") != "COMPLETED":
            return False
        position = self._first + index
        return _count(holder.clock, position) <= _count(base, position)

    def assign(self, base: Any) -> int:
        """The entry for a copy whose clock starts as ``base`` (its issuing core's clock)."""
        with self._lock:
            chosen = None
            if base is not None:
                for k in range(self._size):
                    index = (self._next + k) % self._size
                    if self._free(index, base):
                        chosen = index
                        break
            if chosen is None:  # every entry in use: share one, in turn
                self.shortages += 1
                chosen = self._next
            self._next = (chosen + 1) % self._size
            self._holders[chosen] = _BUILDING
            return self._first + chosen

    def hold(self, position: int, clock: Any, copy: Any) -> None:
        """``copy`` (a jax DMA, built) counts on entry ``position`` with ``clock``."""
        index = position - self._first
        if clock is None or not 0 <= index < self._size:
            return
        with self._lock:
            self._holders[index] = _Holder(clock, weakref.ref(copy))


ATTRIBUTE = "_safedma_copy_entries"


def entries_of(memory: Any, first: int, size: int) -> CopyEntries:
    """The :class:`CopyEntries` of a simulated TPU (jax's ``SharedMemory``), made on first use.

    Kept on the object itself, so it goes with it; jax makes one per kernel run.
    """
    entries: object = getattr(memory, ATTRIBUTE, None)
    if isinstance(entries, CopyEntries):
        return entries
    with _make_lock:
        entries = getattr(memory, ATTRIBUTE, None)
        if not isinstance(entries, CopyEntries):
            entries = CopyEntries(first, size)
            setattr(memory, ATTRIBUTE, entries)
        return entries


_make_lock = threading.Lock()
