"""The access records of verify's lockstep path: who orders each access, per device.

Why: a record is made at every access of every device (a ring of 1024 devices makes
thousands, each a row over the devices), and every later access to the same cells
looks its records up to ask "is it ordered before me?". Each (record, owner) entry
keeps up to two settlers (the device whose clock orders the access, and the epoch of
that clock), each packed into one int64 (``(device + 1) << 32 | epoch``, 0: none), so
a lookup is one gather per settler, and the table grows from zeroed pages without
filling them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["Records"]

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Clock = npt.NDArray[np.int32]
Ids = npt.NDArray[np.int32] | npt.NDArray[np.int64]  # record ids (negative: none)

_EPOCH = (1 << 32) - 1
# ``knows(accessor, device)``: elementwise, the epoch of ``device`` that ``accessor`` knows
Knows = Callable[[Ints, Ints], Clock]


def _pack(settler: Ints, epoch: Ints) -> Ints:
    packed: Ints = ((settler + 1) << 32) | epoch
    return packed


class Records:
    """Row ``r`` holds, per owner device, who settled record ``r`` and at what epoch
    (0: a copy no wait has guaranteed yet), and an optional second settler."""

    def __init__(self, devices: int) -> None:
        self.n = devices
        self._n = np.int64(devices)  # an int32 id times this is an int64
        self.count = 0
        self._first: Ints = np.zeros((64, devices), dtype=np.int64)
        self._second: Ints = np.zeros((64, devices), dtype=np.int64)

    def new(self, accessor: Ints | None, epoch: Ints | None) -> int:
        """A fresh record: settled by ``accessor`` at ``epoch`` now, or (None) later."""
        r = self.count
        if r == self._first.shape[0]:
            for name in ("_first", "_second"):
                old: Ints = getattr(self, name)
                grown: Ints = np.zeros((8 * r, self.n), dtype=np.int64)
                grown[:r] = old
                setattr(self, name, grown)
        self.count += 1
        if accessor is not None:
            assert epoch is not None
            self._first[r] = _pack(accessor, epoch)
        return r

    def settle(self, record: int, owner: Ints, waiter: Ints, epoch: Ints) -> None:
        """``waiter`` (at ``epoch``) guarantees ``record`` on ``owner``'s buffer: the first
        settler orders it, a second different one is kept as an alternative, later ones
        are dropped (which can only make the path give up)."""
        packed = _pack(waiter, epoch)
        first, second = self._first[record], self._second[record]
        cur = first[owner]
        fresh = cur == 0
        if fresh.all():  # the first wait to guarantee it everywhere
            first[owner] = packed
            return
        first[owner] = np.where(fresh, packed, cur)
        other = ~fresh & ((cur >> 32) != waiter + 1) & (second[owner] == 0)
        if other.any():
            second[owner[other]] = packed[other]

    def ordered(self, knows: Knows, accessor: Ints, ids: Ids, owner: Ints) -> Bools:
        """Per element (1-D arrays): is record ``ids`` (negative: none) on ``owner``'s
        buffer ordered before ``accessor``?"""
        live = ids >= 0
        if not live.any():
            return ~live
        if live.all():
            return self._seen(knows, accessor, owner + ids * self._n)
        out = ~live
        out[live] = self._seen(knows, accessor[live], owner[live] + ids[live] * self._n)
        return out

    def all_ordered(self, knows: Knows, accessor: Ints, ids: Ids, owner: Ints) -> bool:
        """Is every record ``ids`` ordered before its ``accessor`` (see :meth:`ordered`)?"""
        live = ids >= 0
        if live.all():
            return bool(self._seen(knows, accessor, owner + ids * self._n).all())
        if not live.any():
            return True
        return bool(self._seen(knows, accessor[live], owner[live] + ids[live] * self._n).all())

    def _seen(self, knows: Knows, accessor: Ints, flat: Ints) -> Bools:
        seen = self._by(self._first, knows, accessor, flat)
        if seen.all():
            return seen
        rest = ~seen
        seen[rest] = self._by(self._second, knows, accessor[rest], flat[rest])
        return seen

    @staticmethod
    def _by(table: Ints, knows: Knows, accessor: Ints, flat: Ints) -> Bools:
        packed = table.reshape(-1)[flat]
        # an empty entry reads as device -1, which ``knows`` wraps; ``packed > 0`` drops it
        known = knows(accessor, (packed >> 32) - 1) >= (packed & _EPOCH)
        seen: Bools = (packed > 0) & known
        return seen
