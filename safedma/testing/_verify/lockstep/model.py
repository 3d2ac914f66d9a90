"""The protocol model of verify's lockstep path: every device's state as numpy arrays.

Why: the per-device model (``model/semantics.py``) handles one event of one device per
Python call, about 130 us per DMA whatever the mesh; a 256-device ring makes 65536
DMAs. In lockstep every device runs the same event at once, so one numpy operation
over the devices replaces 256 Python calls.

This model proves a protocol sound and nothing else: whenever the per-device rules
could say something other than "clean" (a wait that does not guarantee every
contribution pending at it, a contribution that could count at an earlier wait,
an access not ordered with a copy, data nothing wrote, a count left at exit, an
address off the mesh or outside a buffer), it raises :class:`Bail` and verify walks
the program per device, which finds and words the problem. The rules are those of
docs/verify-model.md, restricted so that no judgement needs more than one schedule:

- a lockstep run is one legal schedule of the per-device walk (all devices finish
  event k before any starts event k + 1, and a wait only consumes contributions of
  earlier events);
- every wait guarantees every contribution pending at it (rule 4 with no choice),
  and every contribution is ordered after the last wait of its semaphore (rule 6:
  it cannot count at an earlier wait), so every schedule's waits see exactly these
  candidates and learn exactly these clocks;
- with every clock the same as the per-device model's, the race, R6, R10 and exit
  checks below are the per-device checks, done as array comparisons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from safedma.testing._verify.lockstep.clocks import Clocks, Snapshot
from safedma.testing._verify.lockstep.records import Records

__all__ = ["Bail", "DataBuf", "Model", "SemBuf"]

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Clock = npt.NDArray[np.int32]

_READ_SLOTS = 4  # unordered reads kept per cell before the lockstep path gives up
_UNWRITTEN = -2  # a cell's last write when nothing has written it
Ids = npt.NDArray[np.int32]  # record ids per cell (-1, _UNWRITTEN: none)


class Bail(Exception):
    """The lockstep path cannot prove the protocol the way the per-device model would."""


@dataclass
class DataBuf:
    """One data operand or scratch buffer of the kernel, on every device.

    Regions are cells of a grid that is refined as accesses arrive (a cell is the
    largest size dividing every window start and size seen along a dimension), so
    a buffer of any byte size costs what its distinct windows need. Per cell: the
    record of its last write (``_UNWRITTEN``: nothing wrote it, -1: written before
    the kernel) and up to ``_READ_SLOTS`` records of reads since, slot-major and filled
    in order (slot 0 empty: no read kept), as int32: a ring touches one cell per device
    at each step, scattered over the buffer, so each access costs a cache miss per
    device and array; one array for both "written" and the last write, and one slot
    read in the common case, keep those few.
    """

    name: str
    shape: tuple[int, ...]
    itemsize: int
    space: str
    written_at_entry: bool
    devices: int
    cell: list[int] = field(default_factory=lambda: list[int]())
    last_write: Ids = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    reads: Ids = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    slots_used: int = 0  # read slots any cell has used (the rest are empty everywhere)

    def __post_init__(self) -> None:
        dims = self.shape or (1,)
        self.cell = list(dims)
        grid = (self.devices,) + (1,) * len(dims)
        self.last_write = np.full(grid, -1 if self.written_at_entry else _UNWRITTEN, np.int32)
        self.reads = np.full((_READ_SLOTS,) + grid, -1, dtype=np.int32)

    @property
    def written(self) -> Bools:
        """Per device and cell: has anything written it? (Computed, so read-only: use
        :meth:`mark_unwritten` to forget the writes.)"""
        got: Bools = self.last_write != _UNWRITTEN
        got.flags.writeable = False
        return got

    def mark_unwritten(self) -> None:
        """Nothing has written any cell (a pipeline's output block after its copy-out:
        what a step wrote does not count for the next block). Reads since are kept, so a
        later write is still ordered after them."""
        self.last_write[...] = _UNWRITTEN

    def refine(self, starts: list[Ints], sizes: list[int]) -> None:
        for d, (start, size) in enumerate(zip(starts, sizes)):
            cell = self.cell[d]
            if cell == 1 or (size % cell == 0 and not (start % cell).any()):
                continue  # the window is whole cells already (almost every access)
            values: Ints = np.concatenate([start, np.asarray([cell, size], dtype=np.int64)])
            g = math.gcd(*(int(v) for v in np.unique(values)))
            if g == self.cell[d]:
                continue
            factor = self.cell[d] // g
            self.cell[d] = g
            self.last_write = np.repeat(self.last_write, factor, axis=d + 1)
            self.reads = np.repeat(self.reads, factor, axis=d + 2)

    def cells(self, starts: list[Ints], sizes: list[int]) -> tuple[Ints, int]:
        """(the flat index of every cell of each device's window, device-major; cells per
        device) into the raveled grid (``_flat(buf.last_write)``, a row of the reads)."""
        grid = self.last_write.shape
        n = len(sizes)
        flat: Ints = np.arange(self.devices, dtype=np.int64).reshape((-1,) + (1,) * n)
        per = 1
        for d, (start, size) in enumerate(zip(starts, sizes)):
            k = size // self.cell[d]
            per *= k
            first = (start // self.cell[d]).reshape((-1,) + (1,) * n)
            if k > 1:
                shape = [1] * (n + 1)
                shape[d + 1] = k
                first = first + np.arange(k).reshape(shape)
            flat = flat * grid[d + 1] + first
        return flat.reshape(-1), per


@dataclass
class _Contribution:
    """What a pending contribution carries besides its amounts (``SemBuf.amounts``)."""

    # the issuer's clock for target t is clock[rows_of[t]] (a release's snapshot of every
    # device's clock, shared by the contributions of one event, read lazily); None once
    # every target knows all of it (learning it changes nothing then; dropping it keeps
    # a never-guaranteed signal of a credit ring from holding a devices^2 snapshot each)
    clock: Snapshot | None
    rows_of: Ints
    records: list[tuple[int, Ints]]  # (record id, owner per target) it settles when guaranteed
    shift: int | None  # k when rows_of[t] == (t + k) % n for every t (``Clocks.shift_of``)

    def of(self, targets: Ints) -> Clock:
        """The clock each of ``targets`` would learn (the clock must not be dropped)."""
        assert self.clock is not None
        return self.clock.rows(self.rows_of[targets])


@dataclass
class SemBuf:
    """A semaphore (array) of the kernel, on every device."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "DMA" counts bytes; "REGULAR"/"BARRIER" count signals
    barrier: bool
    devices: int
    credit: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_wait: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # the pending contributions, oldest first: row i of amounts/slots/issuers is
    # pending[i]'s amount, semaphore index and issuer per target device (0: consumed there)
    pending: list[_Contribution] = field(default_factory=lambda: list[_Contribution]())
    peak: int = 0

    def __post_init__(self) -> None:
        self.count = math.prod(self.shape)
        # each device's first entry in the raveled per-device arrays
        self._rows: Ints = np.arange(self.devices, dtype=np.int64) * self.count
        self._rows.flags.writeable = False
        self.touched = False
        self.credit = np.zeros((self.devices, self.count), dtype=np.int64)
        # the sum of the pending contributions, per device and index
        self.in_flight = np.zeros((self.devices, self.count), dtype=np.int64)
        self.last_wait = np.zeros((self.devices, self.count), dtype=np.int64)
        self.amounts = np.zeros((0, self.devices), dtype=np.int64)
        self.slots = np.zeros((0, self.devices), dtype=np.int64)
        self.issuers = np.zeros((0, self.devices), dtype=np.int64)

    def index(self, slot: Ints) -> Ints:
        """Each device's ``slot`` as an index into the raveled per-device arrays
        (``credit``, ``in_flight``, ``last_wait``), or Bail when one is outside."""
        if self.count == 1:
            if slot.any():
                raise Bail(f"a semaphore index outside {self.name}")
            return self._rows
        if np.min(slot) < 0 or np.max(slot) >= self.count:
            raise Bail(f"a semaphore index outside {self.name}")
        at: Ints = self._rows + slot
        return at


class Model:
    """Clocks, semaphores and region histories of every device, as arrays."""

    def __init__(self, devices: int, symmetric: bool = True) -> None:
        self.n = devices
        self.devs: Ints = np.arange(devices, dtype=np.int64)
        self.clocks = Clocks(devices, symmetric)
        self.entry: Ints = np.zeros(devices, dtype=np.int64)
        self.table = Records(devices)  # who orders each access record, per device
        self.dmas = 0
        self.remote_dmas = 0
        self.waits = 0
        self.signals = 0

    # ------------------------------------------------------------------ clocks

    def own(self) -> Ints:
        return self.clocks.own()

    def release(self) -> Snapshot:
        """Every device hands on a copy of its clock and starts a new epoch."""
        return self.clocks.release()

    def barrier(self) -> None:
        self.clocks.barrier()

    def enter(self, device_barrier: bool) -> None:
        self.entry = self.own()
        if device_barrier and self.n > 1:
            self.barrier()

    def _ordered(self, accessor: Ints, ids: Ids, owner: Ints) -> Bools:
        """Per element (1-D): is record ``ids`` (on ``owner``'s buffer) ordered before
        ``accessor``?"""
        return self.table.ordered(self.clocks.at, accessor, ids, owner)

    def _all_ordered(self, accessor: Ints, ids: Ids, owner: Ints) -> bool:
        return self.table.all_ordered(self.clocks.at, accessor, ids, owner)

    # ------------------------------------------------------------------ records

    def new_record(self, accessor: Ints | None) -> int:
        """A record of an access on every device: a plain access by ``accessor`` now,
        or (None) a copy's pending access, settled later by the wait that guarantees it."""
        if accessor is None:
            return self.table.new(None, None)
        return self.table.new(accessor, self.own()[accessor])

    def settle(self, record: int, owner: Ints, waiter: Ints) -> None:
        """A wait by ``waiter`` guarantees a copy's access on ``owner``'s buffer (the first
        settler orders it; a second, e.g. the receiver for a source read, is kept as an
        alternative; later ones are dropped, which can only make the path give up)."""
        self.table.settle(record, owner, waiter, self.own()[waiter])

    def access(
        self,
        buf: DataBuf,
        starts: list[Ints],
        sizes: list[int],
        accessor: Ints,
        write: bool,
        record: int,
        needs_written: bool,
    ) -> None:
        """Check an access to every device's window of ``buf`` against its history, then
        record it (``starts[d][o]``: device ``o``'s window start along dimension d)."""
        if any(s == 0 for s in sizes):
            return
        for start, size, dim in zip(starts, sizes, buf.shape or (1,)):
            if np.min(start) < 0 or np.max(start) + size > dim:
                raise Bail(f"a window outside {buf.name}")
        buf.refine(starts, sizes)
        cells, per = buf.cells(starts, sizes)
        owner = self.devs if per == 1 else np.repeat(self.devs, per)
        who = accessor if per == 1 else np.repeat(accessor, per)
        last_write = _flat(buf.last_write)
        slots = _flat(buf.reads).reshape(_READ_SLOTS, -1)
        last = last_write[cells]
        if needs_written and (last == _UNWRITTEN).any():
            raise Bail(f"a read of {buf.name} where nothing may have written")
        if not self._all_ordered(who, last, owner):
            raise Bail(f"an access to {buf.name} not ordered after its last write")
        used = buf.slots_used
        if write:
            if used and (slots[0, cells] >= 0).any():
                reads = slots[:used, cells].reshape(-1)
                if not self._all_ordered(np.tile(who, used), reads, np.tile(owner, used)):
                    raise Bail(f"a write to {buf.name} not ordered after its reads")
                slots[:used, cells] = -1
            last_write[cells] = record
            return
        if not used or (slots[0, cells] < 0).all():
            slots[0, cells] = record  # the common case: no read of these cells kept
            buf.slots_used = max(used, 1)
            return
        reads = slots[:, cells]
        free = self._ordered(
            np.tile(who, _READ_SLOTS), reads.reshape(-1), np.tile(owner, _READ_SLOTS)
        ).reshape(reads.shape)
        if not free.any(axis=0).all():
            raise Bail(f"more than {_READ_SLOTS} unordered reads of one part of {buf.name}")
        slot = free.argmax(axis=0)
        slots[slot, cells] = record
        buf.slots_used = max(used, int(np.max(slot)) + 1)

    def settled_for_owner(self, buf: DataBuf) -> None:
        """Exit: everything recorded on each device's ``buf`` is ordered before that device."""
        owner = np.repeat(self.devs, buf.last_write.size // self.n)
        if not self._all_ordered(owner, _flat(buf.last_write), owner):
            raise Bail(f"{buf.name} may still be written when a device leaves the kernel")
        used = buf.slots_used
        reads = _flat(buf.reads)[: used * owner.size]
        if not self._all_ordered(np.tile(owner, used), reads, np.tile(owner, used)):
            raise Bail(f"{buf.name} may still be read when a device leaves the kernel")

    # ------------------------------------------------------------------ semaphores

    def contribute(
        self,
        sem: SemBuf,
        slot: Ints,
        amount: Ints,
        clock: Snapshot,
        records: list[tuple[int, Ints]],
        issuer: Ints,
        rows_of: Ints | None = None,
    ) -> None:
        """A contribution to ``sem[slot[t]]`` on every target t, issued by ``issuer[t]``,
        carrying ``clock[rows_of[t]]`` (``rows_of`` None: ``clock[t]``)."""
        if np.min(amount) <= 0:
            raise Bail(f"an empty contribution to {sem.name}")
        at = sem.index(slot)
        last = sem.last_wait.reshape(-1)[at]
        rows = self.devs if rows_of is None else rows_of
        if (clock.at(rows, self.devs) < last).any():
            raise Bail(f"a contribution to {sem.name} that could count at an earlier wait")
        shift = self.clocks.shift_of(rows) if self.clocks.symmetric else None
        sem.pending.append(_Contribution(clock, rows, records, shift))
        sem.amounts = np.concatenate((sem.amounts, amount[None]))
        sem.slots = np.concatenate((sem.slots, slot[None]))
        sem.issuers = np.concatenate((sem.issuers, issuer[None]))
        sem.touched = True
        in_flight = sem.in_flight.reshape(-1)
        in_flight[at] += amount
        sem.peak = max(sem.peak, int(np.max(sem.credit.reshape(-1)[at] + in_flight[at])))

    def wait(self, sem: SemBuf, slot: Ints, amount: Ints) -> None:
        """Rule 4 on every device at once: a contribution is guaranteed iff the wait
        cannot do without it; the waiter learns what every subset of the candidates
        that could have released it has in common (``model/clocks.learned``)."""
        at = sem.index(slot)
        credits, in_flight = sem.credit.reshape(-1), sem.in_flight.reshape(-1)
        credit = credits[at]
        total = credit + in_flight[at]
        if (total < amount).any():
            raise Bail(f"a wait on {sem.name} that lockstep cannot satisfy")
        self.waits += self.n
        cands = sem.pending
        if cands:
            hits = sem.amounts > 0
            if sem.count > 1:
                hits &= sem.slots == slot
            amounts = np.where(hits, sem.amounts, 0)
            guaranteed = hits & (total - amounts < amount)
            need = amount - credit
            learn = (need > 0) & hits.any(axis=0)
            if learn.any():
                self._learn(sem, hits, amounts, need, learn, guaranteed)
            for i in np.flatnonzero(guaranteed.any(axis=1)):
                records = cands[i].records
                if records:
                    if guaranteed[i].all():
                        for record, owner in records:
                            self.settle(record, owner, self.devs)
                        continue
                    who = self.devs[guaranteed[i]]
                    for record, owner in records:
                        self.settle(record, owner[who], who)
            landed = (amounts * guaranteed).sum(axis=0)
            credit = credit + landed
            in_flight[at] -= landed
            sem.amounts = np.where(guaranteed, 0, sem.amounts)
            kept = np.flatnonzero(sem.amounts.any(axis=1))
            if len(kept) < len(cands):
                sem.pending = [cands[int(i)] for i in kept]
                sem.amounts, sem.slots = sem.amounts[kept], sem.slots[kept]
                sem.issuers = sem.issuers[kept]
            # the oldest clock still kept: the likeliest to be known by now (one check
            # per wait keeps pace with the contributions a credit ring leaves pending)
            for c in sem.pending if len(sem.pending) > 1 else ():
                if c.clock is not None:
                    if self.clocks.knows_all(c.clock, c.rows_of, c.shift):
                        c.clock = None
                    break
            _merge_known(sem)
        credits[at] = credit - amount
        sem.last_wait.reshape(-1)[at] = self.own()

    def _acquire(self, waiters: Ints, c: _Contribution, issuers: Ints) -> None:
        """``waiters`` learn the clock ``c`` carries to them (nothing when each is its issuer:
        its own past clock, which its row already holds; the per-device model skips it too)."""
        assert c.clock is not None
        if (issuers == waiters).all():
            return
        if len(waiters) == self.n:  # every device (the waiters are ``devs`` in order)
            self.clocks.acquire_all(c.clock, c.rows_of, c.shift)
            return
        self.clocks.acquire(waiters, c.of(waiters))

    def _acquire_some(self, who: Ints, which: Bools, c: _Contribution, issuers: Ints) -> None:
        """The waiters ``who[which]`` learn the clock ``c`` carries to them (``issuers``:
        ``c``'s issuer per device)."""
        if which.all():
            self._acquire(who, c, issuers[who])
        elif which.any():
            w = who[which]
            self._acquire(w, c, issuers[w])

    def _learn(
        self,
        sem: SemBuf,
        hits: Bools,
        amounts: Ints,
        need: Ints,
        learn: Bools,
        guaranteed: Bools,
    ) -> None:
        cands = sem.pending
        every = bool(learn.all())  # the usual case: no column to pick
        who = self.devs if every else self.devs[learn]
        h = hits if every else hits[:, learn]
        if ((guaranteed if every else guaranteed[:, learn]) | ~h).all():
            # every candidate is needed: the waiter learns each in full
            for i in np.flatnonzero(h.any(axis=1)):
                if cands[i].clock is not None:
                    self._acquire_some(who, h[i], cands[i], sem.issuers[i])
            return
        a = amounts if every else amounts[:, learn]
        issuers = sem.issuers if every else sem.issuers[:, learn]
        first_issuer = np.take_along_axis(issuers, h.argmax(axis=0)[None], axis=0)
        if ((issuers == first_issuer) | ~h).all():
            # one issuer per waiter: its contributions' clocks grow in the order they
            # were issued (the pending order), so per participant the least clock at
            # which the candidates reach the need is that of the first prefix (in
            # issue order) that reaches it; one row per waiter.
            reach = np.argmax(np.cumsum(a, axis=0) >= (need if every else need[learn]), axis=0)
            chosen = range(len(cands)) if len(cands) <= 8 else np.unique(reach)
            for j in chosen:
                c = cands[int(j)]
                if c.clock is not None:
                    self._acquire_some(who, reach == j, c, sem.issuers[int(j)])
            return
        # (candidate, waiter, participant); a dropped clock, which the waiter already knows,
        # counts as the waiter's own row: the learned clock, once joined with the
        # waiter's row, is the same (raising a candidate to at most that row moves the
        # least sufficient value only up to that row)
        stack = np.stack(
            [c.of(who) if c.clock is not None else self.clocks.rows(who) for c in cands]
        )
        keyed = np.where(h[..., None], stack, np.iinfo(stack.dtype).max)
        order = np.argsort(keyed, axis=0, kind="stable")
        values = np.take_along_axis(keyed, order, axis=0)
        sizes = np.take_along_axis(np.broadcast_to(a[..., None], keyed.shape), order, axis=0)
        sums = np.cumsum(sizes, axis=0)
        first = np.argmax(sums >= need[learn][None, :, None], axis=0)
        got = np.take_along_axis(values, first[None], axis=0)[0]
        self.clocks.acquire(who, got)

    def check_entered(self, issuer: Ints, target: Ints, what: str) -> None:
        """R10: a remote signal or copy needs its target known to be inside the call."""
        if (self.clocks.at(issuer, target) < self.entry[target]).any():
            raise Bail(f"{what} to a device not known to have entered the kernel")

    def empty_at_exit(self, sem: SemBuf) -> None:
        if (sem.credit + sem.in_flight).any():
            raise Bail(f"{sem.name} not back to zero at exit")


_A = TypeVar("_A", bound=np.generic)


def _flat(a: npt.NDArray[_A]) -> npt.NDArray[_A]:
    """A 1-D view of the C-ordered array ``a`` (writes through it land in ``a``)."""
    assert a.flags.c_contiguous
    return a.reshape(-1)


def _merge_known(sem: SemBuf) -> None:
    """Fold the oldest pending contributions that every target already knows and that
    settle no access into one (same index and issuer on every device, amounts summed).

    Why: a credit ring's capacity signals are never guaranteed one by one (any of the
    pending signals could serve each wait), so they stay pending, and each wait would
    cost pending x devices: devices^3 over a ring. Folding them keeps every total and
    the prefix sums the waits compare with; it can only land more at once (the folded
    contribution is guaranteed when the pair is), which lowers what later waits learn,
    never raises it: the path then gives up where it would not have, and proves nothing
    it would not have proved.
    """
    run = 0
    for c in sem.pending:
        if c.clock is not None or c.records:
            break
        run += 1
    if run < 2:
        return
    same = [
        i
        for i in range(1, run)
        if np.array_equal(sem.slots[i], sem.slots[0])
        and np.array_equal(sem.issuers[i], sem.issuers[0])
    ]
    if not same or same != list(range(1, len(same) + 1)):
        return  # only a contiguous run from the oldest: the issue order is kept
    last = len(same) + 1
    sem.amounts[0] = sem.amounts[:last].sum(axis=0)
    sem.pending = sem.pending[:1] + sem.pending[last:]
    sem.amounts = np.delete(sem.amounts, np.s_[1:last], axis=0)
    sem.slots = np.delete(sem.slots, np.s_[1:last], axis=0)
    sem.issuers = np.delete(sem.issuers, np.s_[1:last], axis=0)
