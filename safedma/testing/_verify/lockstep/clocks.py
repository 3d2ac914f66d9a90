"""Every device's vector clock for the lockstep path, stored as one row while it can be.

Why: a dense devices x devices matrix costs devices^2 per release and acquire, so a
ring collective (devices - 1 steps of a few events each) costs devices^3: about 30 s
of CPU at 1024 devices. In a ring every device does the same thing with its
neighbour's offset, so the matrix stays circulant: ``rows[d, q] == f[(q - d) % n]``
for one vector ``f``. Releases (each device ticks its own component), barriers
(everyone joins everyone) and acquires where every device learns the clock its
``k``-th predecessor sent keep that form, and cost O(devices). Anything else (a
subset of the devices acquiring, issuers that are not one shift of the devices)
turns the clocks dense, once, and they stay dense: the two forms hold the same
numbers, so the checks built on them are the same.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Clock", "Clocks", "Snapshot"]

Ints = npt.NDArray[np.int64]
Clock = npt.NDArray[np.int32]


def _circulant(f: Clock) -> Clock:
    """The dense matrix ``m[d, q] = f[(q - d) % n]``."""
    n = int(f.shape[0])
    idx: Ints = (np.arange(n)[None, :] - np.arange(n)[:, None]) % n
    dense: Clock = f[idx]
    return dense


class Snapshot:
    """The clocks every device handed on at one release: circulant (``row``) or dense."""

    def __init__(self, row: Clock | None, dense: Clock | None) -> None:
        self.row, self.dense = row, dense

    def matrix(self) -> Clock:
        if self.dense is None:
            assert self.row is not None
            self.dense = _circulant(self.row)
        return self.dense

    def at(self, device: Ints, q: Ints) -> Clock:
        """Elementwise ``snapshot[device, q]``."""
        if self.row is not None:
            got: Clock = np.take(self.row, q - device, mode="wrap")
            return got
        assert self.dense is not None
        vals: Clock = self.dense[device, q]
        return vals

    def rows(self, devices: Ints) -> Clock:
        """The full clock rows of ``devices`` (len(devices) x n)."""
        if self.row is not None:
            n = self.row.shape[0]
            got: Clock = self.row[(np.arange(n)[None, :] - devices[:, None]) % n]
            return got
        assert self.dense is not None
        rows: Clock = self.dense[devices]
        return rows


class Clocks:
    """Row ``d`` is what device ``d`` has observed; circulant until an event breaks it."""

    def __init__(self, devices: int, symmetric: bool = True) -> None:
        self.n = devices
        self.devs: Ints = np.arange(devices, dtype=np.int64)
        self.row: Clock | None = np.zeros(devices, dtype=np.int32)
        self.row[0] = 1
        self.dense: Clock | None = None
        self._shifts: dict[int, Ints] = {}  # (devs + k) % n per shift k seen
        self._own: Ints | None = None  # own() while circulant, kept until the epoch moves
        self.densified = 0  # how often an event turned the clocks dense (0 or 1)
        self.entries_touched = 0  # clock entries read or written: the cost proxy
        if not symmetric:
            self._densify()

    @property
    def symmetric(self) -> bool:
        return self.row is not None

    def _densify(self) -> Clock:
        if self.dense is None:
            assert self.row is not None
            self.dense = _circulant(self.row)
            self.row = None
            self.densified += 1
        return self.dense

    def matrix(self) -> Clock:
        """The dense clocks (a copy when circulant)."""
        if self.row is not None:
            return _circulant(self.row)
        assert self.dense is not None
        return self.dense

    def own(self) -> Ints:
        """Every device's own epoch (read-only: shared until the epoch moves)."""
        if self.row is not None:
            epoch = int(self.row[0])
            if self._own is None or int(self._own[0]) != epoch:
                self._own = np.full(self.n, epoch, dtype=np.int64)
                self._own.flags.writeable = False
            return self._own
        assert self.dense is not None
        return self.dense[self.devs, self.devs].astype(np.int64)

    def at(self, device: Ints, q: Ints) -> Clock:
        """Elementwise ``rows[device, q]``."""
        if self.row is not None:
            got: Clock = np.take(self.row, q - device, mode="wrap")
            return got
        assert self.dense is not None
        vals: Clock = self.dense[device, q]
        return vals

    def release(self) -> Snapshot:
        """Every device hands on a copy of its clock and starts a new epoch."""
        if self.row is not None:
            self.entries_touched += self.n
            sent = Snapshot(self.row.copy(), None)
            self.row[0] += 1
            return sent
        assert self.dense is not None
        self.entries_touched += self.n * self.n
        snap = Snapshot(None, self.dense.copy())
        self.dense[self.devs, self.devs] += 1
        return snap

    def barrier(self) -> None:
        if self.row is not None:
            self.entries_touched += self.n
            self.row[:] = int(np.max(self.row))
            self.row[0] += 1
            return
        assert self.dense is not None
        self.entries_touched += self.n * self.n
        self.dense[:] = self.dense.max(axis=0)
        self.dense[self.devs, self.devs] += 1

    def shift_of(self, rows_of: Ints) -> int | None:
        """``k`` when ``rows_of[t] == (t + k) % n`` for every t (a ring's neighbour), else
        None. The index arrays of each shift seen are kept: a ring uses one or two."""
        k = int(rows_of[0]) % self.n
        if not (self._shifted(k) == rows_of).all():
            return None
        return k

    def _shifted(self, k: int) -> Ints:
        """``(devs + k) % n``, made once per shift."""
        got = self._shifts.get(k)
        if got is None:
            got = self._shifts[k] = (self.devs + k) % self.n
        return got

    def acquire_all(self, snap: Snapshot, rows_of: Ints, shift: int | None = None) -> None:
        """Every device t learns ``snap[rows_of[t]]`` (``shift``: ``shift_of(rows_of)``,
        when the caller knows it)."""
        if self.row is not None and snap.row is not None:
            k = self.shift_of(rows_of) if shift is None else shift
            if k is not None:
                self.entries_touched += self.n
                # np.roll(row, k)[t] == row[(t - k) % n]
                np.maximum(self.row, snap.row[self._shifted(-k % self.n)], out=self.row)
                return
        dense = self._densify()
        self.entries_touched += self.n * self.n
        np.maximum(dense, snap.matrix()[rows_of], out=dense)

    def acquire(self, waiters: Ints, learned: Clock) -> None:
        """``waiters`` learn the rows ``learned`` (one per waiter)."""
        dense = self._densify()
        self.entries_touched += learned.size
        dense[waiters] = np.maximum(dense[waiters], learned)

    def rows(self, devices: Ints) -> Clock:
        if self.row is not None:
            got: Clock = self.row[(self.devs[None, :] - devices[:, None]) % self.n]
            return got
        assert self.dense is not None
        rows: Clock = self.dense[devices]
        return rows

    def knows_all(self, snap: Snapshot, rows_of: Ints, shift: int | None = None) -> bool:
        """Does every device t know all of ``snap[rows_of[t]]``?"""
        if self.row is not None and snap.row is not None:
            k = self.shift_of(rows_of) if shift is None else shift
            if k is not None:
                self.entries_touched += self.n
                return bool((self.row >= snap.row[self._shifted(-k % self.n)]).all())
        self.entries_touched += self.n * self.n
        return bool((self.matrix() >= snap.matrix()[rows_of]).all())
