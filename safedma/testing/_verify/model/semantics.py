"""The TPU DMA/semaphore model: semaphores, copies in flight, accesses, happens-before.

Rules (docs/verify-model.md gives the sources):

* A DMA semaphore counts bytes, a REGULAR or BARRIER semaphore counts signals
  (a DMA signalling a REGULAR semaphore counts 1 on completion, a zero-length one 0).
* A started copy adds its size to its semaphore(s) at some moment before the
  wait that observes it: a local copy to its semaphore, a remote copy to the
  sender's send semaphore (source read) and the receiver's receive
  semaphore (bytes landed). A semaphore is (credit K, pending contributions P).
* A wait of N is possible iff K + sum(P) >= N. Contribution d is guaranteed by
  it iff K + sum(P) - size(d) < N: only those happen before the waiter; the
  rest stay pending (R7/R9). If the wait still needs pending ones, the waiter
  learns what all of them have in common (the meet of their clocks). P counts
  every contribution not ordered after the wait, including ones this schedule
  issues later (found when they arrive, then replayed: see waits.py).
* A copy's source read and destination write are pending from its start until
  a wait guarantees them; any conflicting access meanwhile is a race.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable

import numpy as np

from safedma.testing._verify.errors import (
    DeadlockError,
    MissingBarrierError,
    SignalAfterExitError,
    UnwrittenReadError,
    VerifiedLeftoverError,
    VerifiedRaceError,
    VerifyKernelError,
)
from safedma.testing._missing_waits import waitless_wait_note, where_the_wait_belongs
from safedma.testing._verify.model.addressing import Addressing
from safedma.testing._verify.model.clocks import Clock, Clocks
from safedma.testing._verify.model.regions import (
    Box,
    Buffer,
    Coverage,
    View,
    carried,
    contains,
    overlaps,
)
from safedma.testing._verify.model.waits import Early, Hints, Outcome, WaitRecord, outcome

__all__ = ["Machine", "Dma", "SemState", "Blocked", "LooseMiss", "PruneMiss"]

# A semaphore's completed waits are pruned (see Machine._prune_waits) once it holds this
# many, and again whenever their number doubles: amortised O(1) work per wait.
_PRUNE_FROM = 16


# Lines of copies whose sizes a semaphore keeps for messages (SemState.sizes).
_SIZES_KEPT = 4


# The waits kept for explain() (messages only): the newest this many. A message whose
# explanation may lie in an older one makes the walk run again keeping all (LooseMiss).
_LOOSE_KEPT = 2048


class LooseMiss(Exception):
    """explain() found nothing among the waits it kept, and older ones were dropped."""


class PruneMiss(Exception):
    """A contributor new to a semaphore may count at a wait already pruned from it.

    Pruning assumed the semaphore's contributors so far are all it will have; the
    walk is repeated with pruning off (Machine.prune = False), which is always exact.
    """


class Dma:
    """One started copy."""

    __slots__ = (
        "issuer",
        "target",
        "src",
        "dst",
        "nbytes",
        "where",
        "clock",
        "src_rec",
        "dst_rec",
        "kernel",
        "number",
        "withheld",
        "sems",
    )

    def __init__(
        self,
        issuer: int,
        target: int,
        src: View,
        dst: View,
        where: str,
        clock: Clock,
        kernel: str,
        number: int,
    ) -> None:
        self.issuer, self.target, self.src, self.dst = issuer, target, src, dst
        self.nbytes = src.nbytes
        self.where, self.clock, self.kernel, self.number = where, clock, kernel, number
        self.src_rec: Record | None = None
        self.dst_rec: Record | None = None
        # the last wait that counted this copy without guaranteeing it, and why
        self.withheld: str | None = None
        # the semaphores its completion counts on (receive side first)
        self.sems: tuple[SemState, ...] = ()


class Record:
    """One access to a buffer region: settled at (part, clock), or pending with a copy."""

    __slots__ = ("box", "write", "part", "clock", "dma", "what", "where", "alt", "origin")

    def __init__(
        self, box: Box, write: bool, part: int, clock: int, dma: Dma | None, what: str, where: str
    ) -> None:
        self.box, self.write, self.part, self.clock = box, write, part, clock
        self.dma, self.what, self.where = dma, what, where
        # other epochs that also follow this access (a copy's read is known complete
        # to its sender after wait_send and to its receiver after wait_recv)
        self.alt: list[tuple[int, int]] | None = None
        self.origin = dma.issuer if dma is not None else part


class Contribution:
    """One addition to a semaphore: a copy's completion (one side of it) or a signal.

    A slotted class, not a dataclass: one is built per copy side and per signal.
    ``seq`` is its position among all contributions of the walk (stable across
    replays), set when it is counted.
    """

    __slots__ = ("amount", "clock", "dma", "side", "issuer", "where", "seq")

    def __init__(
        self,
        amount: int,
        clock: Clock,
        dma: Dma | None,
        side: str,  # "read", "write", "both" or "signal"
        issuer: int,
        where: str,
        seq: int = -1,
    ) -> None:
        self.amount, self.clock, self.dma, self.side = amount, clock, dma, side
        self.issuer, self.where, self.seq = issuer, where, seq

    def what(self) -> str:
        return "copy" if self.dma is not None else "signal"

    def __repr__(self) -> str:
        return f"Contribution({self.what()} of {self.amount} from {self.issuer}, seq {self.seq})"


class SemState:
    """One semaphore on one participant."""

    __slots__ = (
        "buffer",
        "index",
        "kind",
        "credit",
        "pending",
        "waiters",
        "label",
        "contributors",
        "peak",
        "waits",
        "waiter",
        "horizon",
        "next_prune",
        "last_wait",
        "sizes",
    )

    def __init__(self, buffer: Buffer, index: int, label: str) -> None:
        self.buffer, self.index, self.label = buffer, index, label
        self.kind = buffer.sem_kind or "REGULAR"
        self.credit = 0
        self.pending: list[Contribution] = []
        self.waiters: list[int] = []
        self.contributors: set[int] = set()
        self.peak = 0
        # every completed wait, oldest first (early contributions are checked against them)
        self.waits: list[WaitRecord] = []
        # the one participant that waits here (-2: several; they are scanned without a stop)
        self.waiter = -1
        # waits dropped from ``waits`` because every contributor is ordered after them:
        # per waiter, the latest such wait's epoch (a new contributor is checked against it)
        self.horizon: dict[int, int] = {}
        self.next_prune = _PRUNE_FROM
        # per waiter, where its latest completed wait here is (kept when ``waits`` is
        # pruned): where a missing receive wait belongs, for messages
        self.last_wait: dict[int, str] = {}
        # the size of the copies counted here, by the line that started them (the first
        # few lines): a message names copies of different sizes sharing the semaphore
        self.sizes: dict[str, int] = {}

    def total(self) -> int:
        if not self.pending:
            return self.credit
        return self.credit + sum([c.amount for c in self.pending])


class Blocked:
    """What a participant's program yields when it cannot go on (slotted: one per block)."""

    __slots__ = ("participant", "sem", "amount", "where", "what")

    def __init__(
        self, participant: int, sem: SemState | None, amount: int, where: str, what: str
    ) -> None:
        self.participant, self.sem, self.amount = participant, sem, amount
        self.where, self.what = where, what


class _History:
    """Access records of one buffer, bucketed along its longest dimension."""

    __slots__ = ("dim", "scale", "buckets", "coverage")

    def __init__(self, buf: Buffer) -> None:
        shape = buf.shape or (1,)
        # Copies slice leading dimensions far more often than lanes: bucket along
        # the first dimension with more than one element.
        self.dim = next((d for d, n in enumerate(shape) if n > 1), 0) if buf.shape else -1
        extent = shape[self.dim] if self.dim >= 0 else 1
        n = max(1, min(extent, 64))
        self.scale = (extent + n - 1) // n
        self.buckets: list[list[Record]] = [[] for _ in range(n)]
        self.coverage = Coverage()

    def span(self, box: Box) -> range:
        if self.dim < 0:
            return range(1)
        lo, hi = box[self.dim]
        if hi <= lo:
            return range(0)
        return range(lo // self.scale, min((hi - 1) // self.scale + 1, len(self.buckets)))


class Machine:
    """Global state of one verification run: every participant's semaphores, buffers, clocks."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.clocks = Clocks(len(labels))
        self.sems: dict[tuple[int, int], SemState] = {}
        self.histories: dict[int, _History] = {}
        # buffer ident -> how a partly written copy source reached it (R6 messages)
        self.partly_from: dict[int, str] = {}
        # the buffer nothing wrote that garbage in a buffer came from (by copies/stores)
        self.garbage_root: dict[int, str] = {}
        # buffer ident -> the kernel call that returned it (garbage outside the kernels)
        self.made_by: dict[int, str] = {}
        # clock at each kernel call's entry and exit, by call number
        self.entry: list[dict[int, int]] = [{} for _ in labels]
        self.cores = 1  # participants per device (pl.kernel over a TensorCoreMesh)
        self.exits: list[dict[int, int]] = [{} for _ in labels]
        self.calls: list[int] = [0] * len(labels)
        self.inside: list[bool] = [False] * len(labels)
        self.wake: Callable[[int], None] = lambda p: None
        self.dmas = self.remote_dmas = self.waits = self.signals = 0
        self.peaks: dict[str, int] = {}
        self.sem_names: Callable[[SemState], str] = lambda s: s.label
        self.leftovers: list[tuple[int, str, str]] = []
        # early contributions counted at waits, from earlier walks of this program
        self.hints = Hints()
        self.contributions = 0  # sequence numbers of contributions
        self.wait_seq = 0  # sequence numbers of completed waits
        # waits that did not guarantee all they counted: (waiter, its clock after the
        # wait, where, semaphore, the contributions counted, the clock learned)
        self.loose: deque[tuple[int, int, str, SemState, list[Contribution | Early], Clock]]
        self.keep_loose(_LOOSE_KEPT)
        # drop completed waits no later contribution can count at (memory: without it a
        # ring keeps devices^2 wait records, each holding clocks of devices entries)
        self.prune = True
        # copies addressed by device id, for the messages (where their ids came from)
        self.addressing = Addressing()
        # per (waiting participant, buffer ident): its latest waits whose descriptor
        # names that buffer, as (copies started before it, semaphore, where, box);
        # a race message names one that waited another semaphore than the copy's
        self.buffer_waits: dict[tuple[int, int], deque[tuple[int, SemState, str, Box]]] = {}
        # id of a semaphore -> an earlier wait on it smaller than the copy it named
        self.short_waits: dict[int, tuple[str, int, int, str]] = {}

    def keep_loose(self, newest: int | None) -> None:
        """Keep the ``newest`` waits for explain() (None: all of them).

        Each holds the clocks of what it counted, so keeping all of them costs memory
        growing as devices^3 on a ring at scale; messages rarely need an old one.
        """
        self.loose = deque(maxlen=newest)

    # ---------------------------------------------------------------- accesses

    def _history(self, buf: Buffer) -> _History:
        h = self.histories.get(buf.ident)
        if h is None:
            h = self.histories[buf.ident] = _History(buf)
        return h

    def mark_written(self, buf: Buffer, box: Box | None = None) -> None:
        self._history(buf).coverage.add(box if box is not None else buf.full_box())

    def unwritten(self, view: View) -> bool:
        """Nothing wrote any part of ``view`` (a partly written one may hold padding that
        the kernel masks: not garbage for this purpose)."""
        if view.empty or view.buffer.space == "SEMAPHORE":
            return False
        h = self.histories.get(view.buffer.ident)
        return h is None or h.coverage.parts(view.box) == []

    def root_of(self, buf: Buffer) -> str:
        """The buffer nothing wrote that ``buf``'s garbage came from (itself if none)."""
        return self.garbage_root.get(buf.ident, buf.name)

    def store_garbage(self, view: View, note: str, root: str) -> None:
        """A vector store put garbage (``Garbage``) into ``view``: it no longer holds
        written data, and R6 where it is read next names ``note`` and ``root``."""
        if view.empty:
            return
        self._history(view.buffer).coverage.remove(view.box)
        self.partly_from[view.buffer.ident] = note
        self.garbage_root[view.buffer.ident] = root

    def check_written(self, p: int, view: View, what: str, where: str, fix: str) -> None:
        if view.empty or view.buffer.space == "SEMAPHORE":
            return
        coverage = self._history(view.buffer).coverage
        if not coverage.covers(view.box):
            gap = coverage.gap(view.box)
            part = (
                f"{view.buffer.name}{_fmt_box(gap)}"
                if gap is not None and gap != view.box
                else f"that part of {view.buffer.name}"
            )
            note = self.partly_from.get(view.buffer.ident, "")
            root = self.garbage_root.get(view.buffer.ident)
            if root is not None and root != view.buffer.name:
                # garbage that came from elsewhere: the buffer to write is where it began
                fix = (
                    f"Fix: write {root} before it is copied or loaded (or initialise "
                    f"it, e.g. under pl.when at the first step). {fix}"
                )
            raise UnwrittenReadError(
                f"read of unwritten data (R6) on {self.labels[p]}: {what} {view.buffer.name}"
                f"{_fmt_box(view.box)} at {where}, but nothing wrote "
                f"{part} before{note} (its contents are garbage). {fix}"
            )

    def access(
        self,
        p: int,
        view: View,
        write: bool,
        what: str,
        where: str,
        dma: Dma | None = None,
        cover: bool = True,
    ) -> Record | None:
        """Check an access against the history of its buffer, then record it.

        One pass per bucket checks each overlapping record for a race and decides
        whether the new record makes it redundant (the two rules below); a record
        spanning several buckets is checked once (``seen``).
        """
        if view.empty:
            return None
        buf = view.buffer
        h = self.histories.get(buf.ident)
        if h is None:
            h = self.histories[buf.ident] = _History(buf)
        box = view.box
        row = self.clocks.rows[p]
        span = h.span(box)
        single = len(span) == 1
        seen: set[int] = set()
        if dma is not None:
            rec = Record(box, write, -1, 0, dma, what, where)
        else:
            rec = Record(box, write, p, self.clocks.own[p], None, what, where)
        buckets = h.buckets
        for b in span:
            keep: list[Record] = []
            for r in buckets[b]:
                rw = r.write
                if (write or rw) and (single or id(r) not in seen):
                    if not single:
                        seen.add(id(r))
                    if overlaps(r.box, box) and (
                        r.part < 0
                        or (
                            r.clock > row[r.part]
                            and not (r.alt and any(c <= row[q] for q, c in r.alt))
                        )
                    ):
                        self._race(p, view, write, what, where, r, dma)
                if dma is None:
                    # A settled access ordered before this one, inside its box, of a
                    # kind this one subsumes (a write subsumes both): redundant.
                    if (
                        r.part >= 0
                        and (write or not rw)
                        and contains(box, r.box)
                        and r.clock <= row[r.part]
                    ):
                        continue
                elif write and contains(box, r.box):
                    # A copy's write passed the check above only if every record it
                    # overlaps happened before the copy started. A later access
                    # unordered with such a record is then unordered with this write
                    # too, and conflicts with it (a write covering the record's box):
                    # the record adds nothing to detect. Dropping it keeps a slot
                    # rewritten every step from growing its history.
                    continue
                keep.append(r)
            keep.append(rec)
            buckets[b] = keep
        if write and cover:
            h.coverage.add(box)
        return rec

    def settle(self, rec: Record | None, p: int) -> None:
        """A pending copy access is guaranteed: it happened before ``p``'s current point."""
        if rec is None:
            return
        if rec.part < 0:
            rec.part, rec.clock, rec.dma = p, self.clocks.now(p), None
        elif rec.part != p:
            if rec.alt is None:
                rec.alt = []
            rec.alt.append((p, self.clocks.now(p)))

    def _race(
        self, p: int, view: View, write: bool, what: str, where: str, other: Record, dma: Dma | None
    ) -> None:
        who = (
            f"the copy started on {self.labels[dma.issuer]} at {dma.where}" + self._addressed(dma)
            if dma
            else (f"{self.labels[p]}")
        )
        if other.dma is not None:
            od = other.dma
            them = (
                f"{'writes' if other.write else 'reads'} it in the copy started on "
                f"{self.labels[od.issuer]} at {od.where}{self._addressed(od)}, which no "
                "wait has guaranteed complete yet"
            )
            if od.withheld is not None:
                # a wait on the copy's semaphore that covers other copies; the source
                # may still show where this copy's own wait belongs
                them += f" ({od.withheld}: it does not guarantee this copy)"
                them += self._short_wait(od) or where_the_wait_belongs(od.where)
            else:
                # a wait aimed at another slot, or else where the source says the
                # missing wait goes (a deleted wait leaves nothing in the program), or a
                # function named for waiting that waits nothing
                them += (
                    self._misaimed_wait(p, od, other)
                    or where_the_wait_belongs(od.where)
                    or waitless_wait_note(where)
                )
            fix = (
                "Wait for that copy (its handle's wait, or wait_recv/wait_send for the "
                "side that touches this buffer) before this access; on a semaphore "
                "shared by several copies, a wait guarantees only the copies whose bytes "
                "it cannot do without (R7/R9): wait for all of them, or use one "
                "semaphore per copy."
            )
        else:
            if other.origin != other.part:
                by = f"the copy started on {self.labels[other.origin]}"
            else:
                by = self.labels[other.part]
            them = f"{by} {other.what} it at {other.where}, and nothing orders the two"
            them += self.explain(p, other.part, other.clock)[0].rstrip(".")
            fix = (
                "Order them: wait for the copy before touching its buffers, and have the "
                "device that owns the memory signal (e.g. a barrier or a REGULAR "
                "semaphore) before others write into it."
            )
        raise VerifiedRaceError(
            f"data race on {self.labels[view.buffer.owner]}'s buffer {view.buffer.name}"
            f"{_fmt_box(view.box)}: {who} {what} it at {where}; {them}. {fix}"
        )

    def note_wait(self, p: int, view: View, sem: SemState, where: str, amount: int) -> None:
        """``p`` waits ``sem`` for ``amount`` with a descriptor naming ``view`` (kept for
        messages). A wait smaller than every copy from or into that buffer counted on
        ``sem`` is kept too: it leaves bytes behind that release a later wait early."""
        key = (p, view.buffer.ident)
        kept = self.buffer_waits.get(key)
        if kept is None:
            kept = self.buffer_waits[key] = deque(maxlen=4)
        kept.append((self.dmas, sem, where, view.box))
        named = view.buffer.ident
        into = [
            c.amount
            for c in sem.pending
            if c.dma is not None
            and c.side != "read"
            and named in (c.dma.dst.buffer.ident, c.dma.src.buffer.ident)
        ]
        if sem.kind == "DMA" and into and amount < min(into):
            self.short_waits[id(sem)] = (where, amount, min(into), view.buffer.name)

    def _short_wait(self, dma: Dma) -> str:
        """:meth:`short_wait_note` for the first of ``dma``'s semaphores that has one."""
        for sem in dma.sems:
            note = self.short_wait_note(sem)
            if note:
                return note
        return ""

    def short_wait_note(self, sem: SemState, said: str = "") -> str:
        """A note on an earlier wait on ``sem`` that took less than the copy it named
        (:meth:`note_wait`), or ``""`` (also when ``said`` already names that wait)."""
        kept = self.short_waits.get(id(sem))
        if kept is None or f"the wait at {kept[0]}" in said:
            return ""
        where, amount, copy, buffer = kept
        return (
            f"; the wait at {where} on {self.sem_names(sem)} took {amount} bytes, less than "
            f"the {copy}-byte copy of {buffer} it names: the rest of that copy's bytes stay "
            "on the semaphore, where they release a later wait early or are left at exit. "
            "Give that wait its copy's own descriptor"
        )

    def _misaimed_wait(self, p: int, d: Dma, side: Record) -> str:
        """A wait ``p`` made after ``d`` started, on the buffer side ``side`` of ``d``
        touches, on a semaphore ``d`` does not count on: most likely the wait meant
        for ``d``, pointed at the wrong semaphore or slot."""
        view = d.dst if side is d.dst_rec else d.src
        for started, sem, where, box in reversed(self.buffer_waits.get((p, view.buffer.ident), ())):
            if started < d.number or any(sem is own for own in d.sems):
                continue
            if not overlaps(box, view.box):
                continue
            own = " and ".join(self.sem_names(s) for s in d.sems)
            return (
                f" (the wait at {where} names this buffer but waits on {self.sem_names(sem)}, "
                f"not on {own}, which this copy counts on: fix that wait's semaphore or slot)"
            )
        return ""

    def _addressed(self, d: Dma) -> str:
        """Where a copy sent by device id went and where that id was computed (a copy to
        the wrong peer is found where its bytes land), or ``""``."""
        return self.addressing.note_for(self.labels, d.where, d.issuer, d.target)

    # ---------------------------------------------------------------- semaphores

    def sem(self, buf: Buffer, index: int) -> SemState:
        key = (buf.ident, index)
        s = self.sems.get(key)
        if s is None:
            name = buf.name if len(buf.shape) == 0 else f"{buf.name}[{index}]"
            s = self.sems[key] = SemState(buf, index, name)
        return s

    def _contribute(self, sem: SemState, c: Contribution) -> None:
        c.seq = self.contributions
        self.contributions += 1
        if sem.horizon and c.issuer not in sem.contributors:
            clock = c.clock
            if any(clock[w] < at for w, at in sem.horizon.items()):
                raise PruneMiss
        waits = sem.waits
        if waits:
            # _early's first test, inline: one waiter, and ``c`` ordered after its last
            # wait (hence after all of them) is the common case and counts nowhere.
            last = waits[-1]
            if sem.waiter < 0 or c.clock[last.waiter] < last.at:
                self._early(sem, c)
        sem.pending.append(c)
        sem.contributors.add(c.issuer)
        if c.dma is not None:
            sizes = sem.sizes
            if len(sizes) < _SIZES_KEPT and c.where not in sizes:
                sizes[c.where] = c.amount
        total = sem.total()
        if total > sem.peak:
            sem.peak = total
        if sem.waiters:
            for w in sem.waiters:
                self.wake(w)
            sem.waiters = []

    def _last_wait(self, target: int, receive: Callable[[], SemState] | None) -> str:
        """Where ``target`` last waited on the semaphore a late copy lands on: the wait
        that falls short, or the point after which the missing one belongs."""
        if receive is None:
            return ""
        try:
            sem = receive()
        except Exception:  # noqa: BLE001 - only a hint: the semaphore's own error comes later
            return ""
        where = sem.last_wait.get(target)
        if where is None:
            return f" ({self.labels[target]} never waits on {sem.label})"
        return (
            f" (its last wait on {sem.label}, at {where}, does not wait for this copy: "
            "it waits too little, or another wait belongs after it)"
        )

    def _early(self, sem: SemState, c: Contribution) -> None:
        """Rule 6 (docs/verify-model.md): ``c`` counts at every past wait it is not ordered after.

        A wait whose outcome that changes becomes a hint for the next walk (waits.py).
        Newest first: ``c`` ordered after a wait is ordered after the earlier waits of
        the same waiter too.
        """
        clock = c.clock
        for w in reversed(sem.waits):
            if clock[w.waiter] >= w.at:
                if sem.waiter >= 0:
                    break
                continue
            hinted = any(x.seq == c.seq for x in w.early)
            if not hinted and w.irrelevant(clock):
                continue
            e = Early(c.seq, c.amount, clock, c.issuer, c.where, c.what())
            if w.add_early(e):
                self.hints.add(w.seq, w.early)

    def check_reach(
        self,
        p: int,
        target: int,
        kernel: int,
        what: str,
        where: str,
        barrier: bool,
        outlives: bool = False,
        copy: bool = False,
        receive: Callable[[], SemState] | None = None,
    ) -> None:
        """R8/R10: a remote signal or copy must reach ``target`` inside the right kernel call
        (``outlives``: it signals a semaphore the call returns, a DMA future, which the
        target waits in a later call; only its entry matters; ``copy``: a remote copy,
        whose fix is the target's receive wait, not dropping a signal; ``receive``: the
        target's semaphore it lands on, looked up only to say where the target's last
        wait on it is)."""
        if target == p:
            return
        rows = self.clocks.rows
        exits, entries = self.exits[target], self.entry[target]
        if kernel in exits and not outlives:
            fix = (
                "Have the target wait its receive side (wait_recv, or a wait by size on "
                "its receive semaphore) before it leaves the kernel"
                if copy
                else "Have the target wait for it, or drop the signal"
            ) + self._last_wait(target, receive)
            raise SignalAfterExitError(
                f"{what} from {self.labels[p]} at {where} reaches {self.labels[target]} "
                f"after it left the kernel (R8): nothing it waits for orders its exit "
                f"after this {'copy lands' if copy else 'signal'}, so on a TPU the "
                f"{'bytes land' if copy else 'count lands'} in a semaphore no one "
                f"waits (a crash or corruption of the next kernel). {fix}."
                f"{self._leftover_hint()}"
            )
        if barrier:
            # The barrier semaphore outlives the call: an early signal from a peer's
            # next call is counted there; what it may wrongly release is checked
            # when it arrives (see _contribute).
            return
        entered = entries.get(kernel)
        if entered is None or rows[p, target] < entered:
            why, relied = self.explain(p, target, entered) if entered is not None else ("", None)
            fix = (
                f"a barrier belongs before this access, at {where} (the first one on "
                f"{self.labels[p]} that needs it): signal the barrier semaphore of every "
                "device this kernel writes to or signals and wait for their signals "
                "(b = pltpu.get_barrier_semaphore(), pltpu.semaphore_signal(b, 1, "
                "device_id=peer) per peer, then pltpu.semaphore_wait(b, peers), with a "
                "collective_id in the compiler params; in safedma sd.signal and sd.wait on "
                "sd.barrier_semaphore(), or safedma.kernels.reduce_scatter."
                "neighbour_barrier(axis) for both ring neighbours), or leave "
                "collective_id unset for Mosaic's default device barrier."
            )
            sibling = self.cores > 1 and p // self.cores == target // self.cores
            if sibling:
                fix = (
                    "synchronise the cores first: signal the barrier semaphore of the "
                    "core you write to (device_id={'core': j}) and wait for its signal "
                    "(pass a collective_id to pl.kernel); Mosaic's device barrier does "
                    "not order the cores of one device. Each core allocates its own "
                    "scratch and run_scoped buffers and semaphores, so a signal or copy "
                    "into another core's is safe only once that core is known to have "
                    "allocated them: jax's core_map guide asks for this barrier before "
                    'cores communicate, "to ensure resources have been allocated"; a '
                    "semaphore of the core's own scratch cannot serve as that barrier."
                )
            if relied is not None and relied.kind == "BARRIER":
                fix = (
                    "make the barrier round impossible to release by a neighbour's next "
                    "call: follow it with a second round on a REGULAR semaphore (jax PR "
                    "#27963), or give each call its own collective_id."
                )
            elif relied is not None:
                fix = (
                    "have that wait count only contributions of this round: one semaphore "
                    "per round (or slot), or make the signaller wait for a signal sent "
                    "after the wait."
                )
            else:
                known = [
                    self.labels[q]
                    for q, calls in enumerate(self.entry)
                    if q not in (p, target)
                    and calls.get(kernel) is not None
                    and rows[p, q] >= calls[kernel]
                ]
                if known:
                    who = ", ".join(known[:3]) + (
                        f" and {len(known) - 3} other devices" if len(known) > 3 else ""
                    )
                    fix = (
                        f"{self.labels[p]} knows only that {who} entered this "
                        f"call (from what its waits received), not {self.labels[target]}: a "
                        "barrier wait tells a device only that the devices that signalled it "
                        "entered. Have every device you write to or signal signal you, and "
                        f"wait for those signals before this access, at {where} (e.g. "
                        "signal both neighbours and wait for 2)."
                    )
            raise MissingBarrierError(
                f"missing barrier before a remote {'write' if copy else 'signal'} (R10): "
                f"{what} from {self.labels[p]} at {where} may reach {self.labels[target]} "
                "before it has entered this kernel call (nothing orders its entry before "
                f"this access).{why} Fix: {fix}"
            )

    def dma_start(
        self,
        p: int,
        target: int,
        src: View,
        dst: View,
        dst_sem: SemState,
        src_sem: SemState | None,
        where: str,
        kernel: str,
    ) -> None:
        if src.nbytes != dst.nbytes or src.shape != dst.shape and src.itemsize == dst.itemsize:
            raise VerifyKernelError(
                f"copy at {where} on {self.labels[p]}: source {src.buffer.name} "
                f"{src.shape} ({src.nbytes} bytes) and destination {dst.buffer.name} "
                f"{dst.shape} ({dst.nbytes} bytes) differ; give both the same shape and dtype."
            )
        self.dmas += 1
        if target != p:
            self.remote_dmas += 1
        # A copy moves what its source holds: the written parts of a partly written
        # source (a fixed-size block whose tail is padding, which the receiver masks),
        # and garbage from a source nothing wrote (emit_pipeline copies in an output
        # block the body overwrites unread). Garbage is R6 where it is read, naming
        # this copy, not when it is copied.
        written = None if src.empty else self._history(src.buffer).coverage.parts(src.box)
        clock = self.clocks.release(p)
        d = Dma(p, target, src, dst, where, clock, kernel, self.dmas)
        d.sems = (dst_sem,) if src_sem is None else (dst_sem, src_sem)
        # The copy's accesses may happen any time after the start: check them with
        # the issuer's clock at the start, then keep them pending until guaranteed.
        d.src_rec = self.access(p, src, False, "reads", where, dma=d)
        # A copy of a region onto itself (emit_pipeline with no_pipelining uses a
        # VMEM operand as its own window) leaves the bytes as they were: only its read
        # can conflict with anyone, and it does not race with itself.
        identity = (
            target == p
            and src.buffer is dst.buffer
            and src.box == dst.box
            and src.itemsize == dst.itemsize
        )
        if not identity:
            d.dst_rec = self.access(p, dst, True, "writes", where, dma=d, cover=written is None)
        if written is not None:
            h = self._history(dst.buffer)
            if not written:
                h.coverage.remove(dst.box)
            for box in carried(written, src.box, dst.box):
                h.coverage.add(box)
            # the source's own note, one hop back only (a ring forwarding padding every
            # step would otherwise grow the text with every hop)
            self.garbage_root[dst.buffer.ident] = self.root_of(src.buffer)
            prior = self.partly_from.get(src.buffer.ident, "")
            self.partly_from[dst.buffer.ident] = (
                f" (the copy at {where} filled it from {src.buffer.name}{_fmt_box(src.box)}, "
                f"{'part of ' if written else ''}which nothing wrote"
                f"{prior if prior.count('(the copy at') == 1 else ''})"
            )
        # A copy on a REGULAR semaphore counts 1 when it completes; a zero-length copy
        # moves nothing and counts nothing, as on a DMA semaphore (production kernels
        # start size-0 copies for padding entries and wait only the real ones)
        recv_amount = d.nbytes if dst_sem.kind == "DMA" else int(d.nbytes > 0)
        if src_sem is None:
            self._contribute(dst_sem, Contribution(recv_amount, clock, d, "both", p, where))
        else:
            amount = d.nbytes if src_sem.kind == "DMA" else int(d.nbytes > 0)
            self._contribute(src_sem, Contribution(amount, clock, d, "read", p, where))
            self._contribute(dst_sem, Contribution(recv_amount, clock, d, "write", p, where))

    def signal(self, p: int, sem: SemState, amount: int, where: str) -> None:
        self.signals += 1
        clock = self.clocks.release(p)
        self._contribute(sem, Contribution(amount, clock, None, "signal", p, where))

    def try_wait(
        self, p: int, sem: SemState, amount: int, decrement: bool = True, where: str = ""
    ) -> bool:
        total = sem.total()
        if total < amount:
            return False
        self.waits += 1
        seq = self.wait_seq
        self.wait_seq += 1
        pending = sem.pending
        credit = sem.credit
        if len(pending) <= 1 and credit < amount and seq not in self.hints.by_wait:
            # The common wait: one contribution, which it needs (total >= amount >
            # credit), and no hint. outcome() would give ({c.seq}, c.clock): computed
            # directly. ``pending`` becomes the record's own list (sem.pending is replaced).
            c = pending[0]
            if c.issuer != p:
                # (p's own contribution carries a copy of p's row then, and rows only
                # grow: acquiring it changes nothing)
                self.clocks.acquire(p, c.clock)
            sem.credit = credit + c.amount
            sem.pending = []
            d = c.dma
            if d is not None:
                if c.side != "read":
                    self.settle(d.dst_rec, p)
                self.settle(d.src_rec, p)
            used: Outcome = (frozenset((c.seq,)), c.clock)
            self._record_wait(sem, seq, p, where, credit, amount, pending, [], used)
            if decrement:
                sem.credit -= amount
            return True
        early = self.hints.at(seq)
        present = list(pending)
        used = outcome(credit, amount, [*present, *early])
        guaranteed_seqs, learned = used
        if learned is not None:
            self.clocks.acquire(p, learned)
        cands = len(present) + len(early)
        if len(guaranteed_seqs) < cands:
            self._note_unguaranteed(p, sem, credit, amount, present, early, guaranteed_seqs, where)
        if learned is not None and len(guaranteed_seqs) < cands:
            # knowledge lost to "whichever lands first": kept for explain()
            self.loose.append((p, self.clocks.now(p), where, sem, [*present, *early], learned))
        if guaranteed_seqs:
            keep: list[Contribution] = []
            for c in sem.pending:
                if c.seq not in guaranteed_seqs:
                    keep.append(c)
                    continue
                sem.credit += c.amount
                d = c.dma
                if d is not None:
                    if c.side in ("write", "both"):
                        self.settle(d.dst_rec, p)
                    self.settle(d.src_rec, p)
            sem.pending = keep
        self._record_wait(sem, seq, p, where, credit, amount, present, early, used)
        if decrement:
            sem.credit -= amount
        return True

    def _record_wait(
        self,
        sem: SemState,
        seq: int,
        p: int,
        where: str,
        credit: int,
        amount: int,
        present: list[Contribution],
        early: list[Early],
        used: Outcome,
    ) -> None:
        """Keep a completed wait for rule 6 (early contributions are checked against it)."""
        sem.waits.append(
            WaitRecord(seq, p, self.clocks.own[p], where, credit, amount, present, early, used)
        )
        sem.last_wait[p] = where
        if sem.waiter == -1:
            sem.waiter = p
        elif sem.waiter != p:
            sem.waiter = -2
        if self.prune and len(sem.waits) >= sem.next_prune:
            self._prune_waits(sem)

    def _prune_waits(self, sem: SemState) -> None:
        """Drop the completed waits every contributor so far is ordered after.

        Rule 6 checks a new contribution only against waits it is not ordered after; a
        contributor's later contributions carry clocks at least its current row, so once
        every contributor's row covers a wait's epoch, nothing they issue can count there.
        A contributor not seen yet could: its first contribution is checked against the
        latest pruned epoch per waiter (``horizon``) and, if unordered, the walk is
        repeated without pruning (PruneMiss).
        """
        waits = sem.waits
        who = np.fromiter(sem.contributors, dtype=np.intp)
        waiters = np.fromiter((w.waiter for w in waits), dtype=np.intp, count=len(waits))
        ats = np.fromiter((w.at for w in waits), dtype=np.int64, count=len(waits))
        if len(who):
            known = self.clocks.rows[np.ix_(who, waiters)].min(axis=0) >= ats
        else:
            known = np.ones(len(waits), dtype=bool)
        if known.any():
            horizon = sem.horizon
            kept: list[WaitRecord] = []
            for w, gone in zip(waits, known.tolist()):
                if gone:
                    if horizon.get(w.waiter, -1) < w.at:
                        horizon[w.waiter] = w.at
                else:
                    kept.append(w)
            sem.waits = kept
        sem.next_prune = max(_PRUNE_FROM, 2 * len(sem.waits))

    def _note_unguaranteed(
        self,
        p: int,
        sem: SemState,
        credit: int,
        amount: int,
        present: list[Contribution],
        early: list[Early],
        guaranteed: frozenset[int],
        where: str,
    ) -> None:
        """Messages: a copy a wait counted but does not guarantee says which wait and why."""
        unit = " bytes" if sem.kind == "DMA" else " signals"
        have = credit + sum(c.amount for c in present) + sum(e.amount for e in early)
        because = (
            f"the wait at {where} on {self.sem_names(sem)} of {self.labels[p]} needs "
            f"{amount}{unit} of the {have} that may have landed by then and is released by "
            "whichever land first"
        )
        if early:
            e = early[0]
            because += (
                f", including the {e.what} from {self.labels[e.issuer]} at {e.where}, "
                "which is not ordered after that wait"
            )
        sizes = {c.where: c.amount for c in present if c.dma is not None}
        if sem.kind == "DMA" and len(set(sizes.values())) > 1:
            because += _sizes_note(sizes, self.sem_names(sem))
        else:
            # the contributions it may have counted, by line: one of them is usually
            # on this semaphore by mistake (a copy given another copy's semaphore)
            lines = list(dict.fromkeys(c.where for c in present))
            if len(lines) > 1:
                because += f" (it may count those started at {' and at '.join(lines[:3])})"
        for c in present:
            if c.dma is not None and c.seq not in guaranteed:
                c.dma.withheld = because

    def explain(self, p: int, q: int, t: int) -> tuple[str, SemState | None]:
        """Why ``p`` does not know ``q``'s event at ``t`` when a wait it relies on could
        have told it (the wait counts whichever contributions land first: R7/R9/R10),
        and that wait's semaphore; ``("", None)`` when no wait explains it."""
        rows = self.clocks.rows
        for waiter, at, where, sem, cands, learned in reversed(self.loose):
            if learned[q] >= t or not (waiter == p or rows[p, waiter] >= at):
                continue
            carry = [c for c in cands if c.clock[q] >= t]
            if not carry:
                continue
            name = self.sem_names(sem)
            if not name.startswith("the "):
                name = f"{sem.kind} semaphore {name}"
            return (
                f" {self.labels[waiter]}'s wait at {where} on {name} would order them, but "
                "it is released by whichever contributions land first among "
                f"{_describe(self.labels, cands)}, and those need not include "
                f"{_describe(self.labels, carry)}, which carry this order (R7/R9/R10).",
                sem,
            )
        if self.loose.maxlen is not None and len(self.loose) == self.loose.maxlen:
            raise LooseMiss  # the explaining wait may be one of those dropped
        return "", None

    # ---------------------------------------------------------------- kernels

    def enter(self, p: int, call: int | None = None) -> int:
        """``p`` enters kernel call number ``call`` (its next one by default)."""
        if call is None:
            call = self.calls[p]
            self.calls[p] += 1
        self.inside[p] = True
        self.entry[p][call] = self.clocks.now(p)
        return call

    def leave(
        self, p: int, sems: list[Buffer], describe: Callable[[SemState], str], call: int
    ) -> None:
        """Exit checks: every semaphore of this call back to zero, on this device."""
        self.leave_scope(p, sems, describe, "leaves the kernel")
        self.inside[p] = False
        self.exits[p][call] = self.clocks.now(p)
        self.clocks.release(p)

    def leave_scope(
        self,
        p: int,
        sems: list[Buffer],
        describe: Callable[[SemState], str],
        when: str = "leaves a run_scoped region",
    ) -> None:
        leftovers: list[str] = []
        for buf in sems:
            count = 1
            for n in buf.shape:
                count *= n
            for i in range(count):
                s = self.sems.get((buf.ident, i))
                if s is None:
                    continue
                total = s.total()
                if total != 0:
                    text, more = describe(s), self._left_by(s)
                    if more and not text.rstrip().endswith("."):
                        text += "."
                    leftovers.append(text + more)
        for text in leftovers:
            self.leftovers.append((p, when, text))

    def _left_by(self, s: SemState) -> str:
        """What a leftover message adds about what is counted on ``s``: copies and
        signals addressed by device id (and where the ids were computed), and copies of
        different sizes sharing it."""
        notes: list[str] = []
        seen: set[str] = set()
        for c in s.pending:
            if c.where in seen:
                continue
            seen.add(c.where)
            target = c.dma.target if c.dma is not None else s.buffer.owner
            note = self.addressing.note_for(self.labels, c.where, c.issuer, target)
            if note:
                notes.append(f" [the {c.what()} from {self.labels[c.issuer]} at {c.where}{note}]")
        if s.kind == "DMA":
            notes.append(_sizes_note(s.sizes, self.sem_names(s), sentence=True))
        return "".join(notes[:3])

    def leftover_error(self) -> VerifiedLeftoverError | None:
        """Every semaphore left non-zero, on every device, in device order."""
        if not self.leftovers:
            return None
        items = sorted(self.leftovers, key=lambda x: x[0])
        n = len(items)
        return VerifiedLeftoverError(
            f"{n} semaphore count{'s' if n != 1 else ''} not back to zero at kernel exit "
            "(R2/R4; on a TPU this crashes the program):\n"
            + "\n".join(_leftover_lines(self.labels, items))
        )

    def _leftover_hint(self) -> str:
        """An earlier kernel left a count on a semaphore of its own (a start kernel
        whose done kernel rebuilds the descriptor on its own scratch semaphore): a
        later kernel cannot wait for it on another one. Empty when none was left."""
        if not self.leftovers:
            return ""
        _, when, text = self.leftovers[0]
        return (
            f" Earlier, a semaphore was left non-zero when it {when}: {text}. A wait in a "
            "later kernel cannot take that count from another semaphore (scratch "
            "semaphores do not outlive their call): return the semaphore from the kernel "
            "that starts the copy (a DMA future) and pass it to the one that waits."
        )

    def deadlock(self, blocked: list[Blocked], done: list[int]) -> DeadlockError:
        # per blocked device: who, what it waits for (``_HOLDS`` where the line says
        # what the semaphore holds), and who fed that semaphore ("": nobody; None: no
        # semaphore), in device order
        waits: list[tuple[str, str, str | None]] = []
        for b in sorted(blocked, key=lambda b: b.participant):
            if b.sem is None:
                waits.append((self.labels[b.participant], f"at {b.where} for {b.what}", None))
                continue
            s = b.sem
            unit = " bytes" if s.kind == "DMA" else ""
            who = sorted(s.contributors)
            fed = ", ".join(self.labels[w] for w in who[:4]) + (" ..." if len(who) > 4 else "")
            waits.append(
                (
                    self.labels[b.participant],
                    f"at {b.where} on {s.kind} semaphore {self.sem_names(s)} for "
                    f"{b.amount}{unit}; {_HOLDS} {s.total()}{unit}",
                    fed,
                )
            )
        lines = _blocked_lines(waits)
        # the line to fix behind a wait nothing releases: copies aimed elsewhere, or
        # copies of different sizes on one semaphore (once per semaphore)
        causes: dict[str, None] = {}
        for b in sorted(blocked, key=lambda b: b.participant):
            if b.sem is None:
                continue
            s = b.sem
            causes[self.addressing.missing(self.labels, s.label, b.participant)] = None
            if s.kind == "DMA":
                causes[_sizes_note(s.sizes, self.sem_names(s), sentence=True)] = None
            causes[self._taken_before(b)] = None
            causes[self._counted_next_door(s)] = None
        lines += [f" {c.strip()}" for c in causes if c]
        hint = (
            "No device can move: each wait above needs a start or signal that no "
            "running device will issue (a copy or signal skipped by a condition, aimed "
            "at another device, waited twice, or a wait-for cycle between devices)."
        )
        if done:
            hint += (
                f" {len(done)} device(s) already left the kernel, e.g. "
                f"{self.labels[done[0]]}: a signal they should have sent never came."
            )
        hint += self._leftover_hint()
        return DeadlockError(
            "deadlock (R3): every device is blocked or finished and nothing in flight can "
            "release these waits (on a TPU the kernel hangs):\n" + "\n".join(lines) + "\n" + hint
        )

    def _taken_before(self, b: Blocked) -> str:
        """Where the blocked participant last waited this semaphore, when that is
        another line: a wait that took the count this one needed (a copy waited twice,
        a wait on the wrong slot) is fixed there."""
        sem = b.sem
        last = sem.last_wait.get(b.participant) if sem is not None else None
        if sem is None or last is None or last == b.where:
            return ""
        return (
            f"{self.labels[b.participant]} last waited {self.sem_names(sem)} at {last}: "
            "if that wait took the count meant for the blocked one, fix that wait."
        )

    def _counted_next_door(self, sem: SemState) -> str:
        """Counts left on other semaphores of the same array on the same participant:
        a copy or signal aimed at the wrong slot is fixed where it was issued."""
        if sem.buffer.shape == ():
            return ""
        notes: list[str] = []
        for other in self.sems.values():
            if other.buffer is not sem.buffer or other is sem or other.total() <= 0:
                continue
            lines = list(dict.fromkeys(c.where for c in other.pending)) or list(other.sizes)
            unit = " bytes" if other.kind == "DMA" else ""
            by = f" from {' and '.join(lines[:2])}" if lines else ""
            notes.append(f"{self.sem_names(other)} holds {other.total()}{unit}{by}")
            if len(notes) == 2:
                break
        if not notes:
            return ""
        return (
            f"Meanwhile {'; '.join(notes)}, next to {self.sem_names(sem)}: a copy or signal "
            "meant for the blocked semaphore may be aimed at the wrong slot there."
        )


# Identical blocked waits on this many devices or more are one line (a ring of 256
# devices all waiting at one line would otherwise print 256 lines).
_GROUP_FROM = 3
_HOLDS = "\x00holds\x00"  # "it holds" on a device's own line, "each holds" on a group's


def _sizes_note(sizes: dict[str, int], name: str, sentence: bool = False) -> str:
    """Copies of different sizes counted on one DMA semaphore, by line and size: a wait
    sized for one is released by another's bytes, and waits sized per copy add up only
    if each waits its own (``""`` when the sizes agree)."""
    # A zero-length copy counts nothing: it is no second size.
    sizes = {w: n for w, n in sizes.items() if n}
    if len(set(sizes.values())) < 2:
        return ""
    copies = " and ".join(f"the copy started at {w} ({n} bytes)" for w, n in sizes.items())
    if not sentence:
        return f"; {name} counts copies of different sizes: {copies}"
    return (
        f" DMA semaphore {name} is shared by copies of different sizes: {copies}; a wait "
        "sized for one of them is released by the bytes of another, and the waits on it "
        "must add up to the copies' total. Give each copy its own semaphore, or wait for "
        "all of them at once by their total."
    )


def _fed(fed: str | None) -> str:
    if fed is None:
        return ""
    return f", fed so far by {fed}" if fed else ", which nothing signalled"


def _group(labels: list[str]) -> str:
    """'16 devices (device 0 (x=0), device 1 (x=1), ..., device 15 (x=15))'."""
    named = (
        ", ".join(labels) if len(labels) <= 4 else f"{labels[0]}, {labels[1]}, ..., {labels[-1]}"
    )
    noun = "cores" if all(" core " in label for label in labels) else "devices"
    return f"{len(labels)} {noun} ({named})"


def _blocked_lines(waits: list[tuple[str, str, str | None]]) -> list[str]:
    """One line per blocked wait, in device order; the same wait (line, semaphore,
    amount, count held) on several devices is one line naming them, and their
    feeders, when they differ, by one example."""
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for label, what, fed in waits:
        groups.setdefault(what, []).append((label, fed))
    lines: list[str] = []
    for label, what, fed in waits:
        members = groups[what]
        if len(members) < _GROUP_FROM:
            lines.append(f"  {label} waits {what.replace(_HOLDS, 'it holds')}{_fed(fed)}")
            continue
        if members[0][0] != label:
            continue  # the group's line stands where its first device's would
        labels = [x for x, _ in members]
        first = members[0][1]
        if len({f for _, f in members}) == 1:
            feeders = _fed(first)
        else:
            feeders = f", each fed so far by other devices (e.g. {labels[0]} by {first or 'none'})"
        lines.append(f"  {_group(labels)} each wait {what.replace(_HOLDS, 'each holds')}{feeders}")
    return lines


def _leftover_lines(labels: list[str], items: list[tuple[int, str, str]]) -> list[str]:
    """One line per semaphore left non-zero, in device order; the same leftover on
    three or more devices (the same text once each device's own label, and the peers
    it names, are set aside) is one line naming the devices, with the first device's
    text as the example."""
    others = re.compile("|".join(re.escape(x) for x in sorted(set(labels), key=len, reverse=True)))
    # per item: its text without the device's own "label: " prefix, and its group key
    rows: list[tuple[int, str, str, str, tuple[str, str]]] = []
    groups: dict[tuple[str, str], list[int]] = {}
    for p, when, text in items:
        own = f"{labels[p]}: "
        body = text[len(own) :] if text.startswith(own) else text
        key = (when, others.sub("<device>", body))
        groups.setdefault(key, []).append(len(rows))
        rows.append((p, when, text, body, key))
    lines: list[str] = []
    for i, (p, when, text, body, key) in enumerate(rows):
        members = groups[key]
        if len(members) < _GROUP_FROM:
            lines.append(f"  {text} (when it {when})")
            continue
        if members[0] != i:
            continue  # the group's line stands where its first device's would
        alike = (
            ""
            if all(rows[j][3] == body for j in members)
            else f" (as on {labels[p]}; on the others with their own peers)"
        )
        group = _group([labels[rows[j][0]] for j in members])
        lines.append(f"  {group} each: {body}{alike} (when it {when})")
    return lines


def _describe(labels: list[str], cands: list[Contribution | Early]) -> str:
    """'the 2 signals from device 0 (x=0) at f.py:3 and the signal from ...'"""
    seen: dict[tuple[str, int, str], int] = {}
    for c in cands:
        what = c.what() if isinstance(c, Contribution) else c.what
        key = (what, c.issuer, c.where)
        seen[key] = seen.get(key, 0) + 1
    parts = [
        f"the {f'{n} {what}s' if n > 1 else what} from {labels[issuer]} at {where}"
        for (what, issuer, where), n in seen.items()
    ]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _fmt_box(box: Box) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"
