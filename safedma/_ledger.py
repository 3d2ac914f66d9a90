"""The obligations ledger: which copies a kernel body starts, and where it waits them.

The checks here run while Python traces the body, so they see every branch
of a ``lax.cond`` / ``pl.when`` and one iteration of each loop, not the paths
a device takes. They therefore reject only what is wrong on *every* path:

* a copy started and waited nowhere in the body: not through its handle (in
  any branch or loop), and not through any ``started_elsewhere()``,
  ``incoming()``, aggregate or raw-pltpu wait whose semaphore slot could be its own
  (:class:`~safedma.CopyNeverWaitedError`, T7);
* one handle waited twice in the same straight-line block, so whenever that
  block runs the second wait hangs (:class:`~safedma.HandleWaitedTwiceError`, T8);
* a handle waited outside the loop iteration or branch that started it,
  which jax cannot trace either (:class:`~safedma.HandleEscapedError`).

What depends on the path or on counts (a wait in one branch only, a wait the
other path repeats, waits that add up to more than was started) is left to
``safedma.testing.verify``, which follows each device's real path.

Semaphores are compared per *slot*: a wait on ``sems.at[0]`` never stands for
a copy on ``sems.at[1]``. Where an index is computed, it stands for every slot it
can take in any loop iteration or grid step, read from the body's jaxpr once the
body is traced (``_slot_ranges``): a wait on ``sems.at[i % 2]`` may stand for a
copy on slot 0 or 1, never 2, and a copy started on ``(i + 1) % 2`` meets a wait on
``i % 2`` an iteration later. An index the analysis cannot follow (an SMEM read, a
carry, a shift) may be any slot of its dimension (no error). The index of a copy
started in a branch or a while loop is read without the loops' and the grid's bounds
(a loop index or ``program_id`` there is any value): the copy may never start (its
guard may fail on exactly the iterations the bounds narrow it to), and a copy that
never starts needs no wait. Waits are read within the bounds wherever they are.

Where the array is a loop body's or branch's argument (a new tracer for whichever
semaphore was passed in, as ``emit_pipeline`` passes its buffered refs), it is followed out to
the operand it received once the body is traced (``_raw_waits.outer_ref``); where it
cannot be, it may stand for any array of its type.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import NamedTuple

from safedma import _compat, _raw_waits
from safedma._slot_ranges import BodySlots
from safedma._compat import FlowKind
from safedma._describe import Describe, SourceLine, call_site, copies_of, is_library_file
from safedma._errors import CopyNeverWaitedError, HandleEscapedError, HandleWaitedTwiceError

__all__ = [
    "Side",
    "Ledger",
    "HandleState",
    "current_ledger",
    "ledger_scope",
    "current_block",
    "record_wait_on",
    "settle_semaphore",
    "started_on",
    "waited_on",
]

VERIFY_HINT = "run safedma.testing.verify(...) to check the waits on every path a device takes"


class Side(enum.Enum):
    """Which semaphore a wait decrements."""

    LOCAL = "wait()"
    SEND = "wait_send()"
    RECV = "wait_recv()"


@dataclasses.dataclass(frozen=True)
class _Wait:
    where: SourceLine
    block: object  # the jax trace of the straight-line block the wait is in


@dataclasses.dataclass(eq=False)
class _Obligation:
    """One started copy: its semaphore per side, and where each side was waited."""

    describe: Describe
    started_at: SourceLine
    sems: dict[Side, object]
    waited: dict[Side, list[_Wait]]
    # The bodies it was started in and not waited in, innermost first (see _hand_over).
    bodies: tuple[str, ...] = ()
    # Its description when handed over, fixed by the body that started it (whose refs'
    # names the enclosing body may not know); None: ``describe()`` as it is.
    described: str | None = None
    # The equations of the block it was started in (a branch's, a loop body's:
    # ``_compat.eqn_record``): unless that runs on every run of the body, its computed
    # indices are read without the loops' and grid's bounds (see BodySlots.runs_always).
    record: object = None

    def text(self) -> str:
        return self.described if self.described is not None else self.describe()


@dataclasses.dataclass(frozen=True)
class _ElsewhereWait:
    """A wait through started_elsewhere() / incoming() / wait_all_into(): any copy on ``sem``."""

    sem: object


class _Slot(NamedTuple):
    """A semaphore view: the id of its root array and the positions it covers (None:
    unknown). ``aliased``: the root is a loop body's or branch's argument, a new tracer
    for some semaphore passed in (an emit_pipeline hands its buffered refs to its loop
    and branches that way), so its identity says nothing about which one: it meets any
    slot of a semaphore of the same type (``ref``)."""

    root: int
    positions: frozenset[int] | None
    ref: object = None
    aliased: bool = False


def _slot(sem: object, body: BodySlots | None = None) -> _Slot:
    """``sem``'s slot; with ``body`` (the body traced so far), a computed index is read
    as the slots it can take (``_slot_ranges``), else as any slot."""
    root = _compat.root_of(sem)
    return _Slot(id(root), _positions(sem, body), root, _raw_waits.is_block_argument(root))


def _positions(view: object, body: BodySlots | None) -> frozenset[int] | None:
    positions = _compat.static_positions(view)
    if positions is None and body is not None:
        positions = body.positions(view)
    return positions


_ANY_SEMAPHORE = -1
"""The root id of a raw wait whose semaphore the check cannot name: it meets every slot."""
_ALLOCATED_INSIDE = -2
"""The root id of raw waits on semaphores allocated inside a block (``run_scoped``): they
meet every slot of such a semaphore, and none of the body's own (see _on_slot)."""


def _raw_wait_slots(
    since: int = 0, primitive: str = "dma_wait", body: BodySlots | None = None
) -> list[_Slot]:
    """Slots waited in raw pltpu (``pltpu.make_async_copy(...).wait()``) in the body so far
    (from the ``since``-th equation of its frame: where the body began).

    They stand for any safedma copy on the same slot, like started_elsewhere():
    the body's jaxpr, not safedma's bookkeeping, says what is waited.
    """
    slots: list[_Slot] = []
    frame = _compat.current_frame()
    for root, view in _raw_waits.raw_dma_waits(frame, is_library_file, since, primitive):
        if root is _raw_waits.ALLOCATED_INSIDE:
            slots.append(_Slot(_ALLOCATED_INSIDE, None))
        elif root is None:
            slots.append(_Slot(_ANY_SEMAPHORE, None))
        else:
            positions = None if view is None else _positions(view, body)
            slots.append(_Slot(id(root), positions, root, _raw_waits.is_block_argument(root)))
    return slots


def _slots_meet(a: _Slot, b: _Slot) -> bool:
    """Could two semaphore views be the same semaphore? (Unknown positions: yes.)"""
    if _ANY_SEMAPHORE in (a.root, b.root):
        return True
    if a.root != b.root:
        # A block's argument may be any semaphore of its type passed in (see _Slot).
        return (a.aliased or b.aliased) and _compat.same_ref_type(a.ref, b.ref)
    return a.positions is None or b.positions is None or not a.positions.isdisjoint(b.positions)


def _named_in(slot: _Slot, outer_of: Callable[[object], object | None]) -> _Slot:
    """``slot`` named by the semaphore of the body's frame it stands for: a loop's or
    branch's argument followed out to the operand it received (``outer_of``:
    ``_raw_waits.outer_ref`` in that frame). Unchanged where it cannot be followed (then only
    the same tracer names it)."""
    if slot.root in (_ANY_SEMAPHORE, _ALLOCATED_INSIDE) or slot.ref is None:
        return slot
    outer = outer_of(slot.ref)
    if outer is None:
        return slot._replace(aliased=False)
    return _Slot(id(outer), slot.positions, outer)


def _on_slot(sem: object, slots: Iterable[_Slot], body: BodySlots | None = None) -> bool:
    """Whether ``sem`` could be one of the semaphores ``slots`` name: the per-slot match
    every question of this ledger (is a copy covered, started, waited?) comes down to."""
    slot = _slot(sem, body)
    for other in slots:
        if other.root == _ALLOCATED_INSIDE:
            if _raw_waits.allocated_inside(_compat.root_of(sem), _compat.current_frame()):
                return True
        elif _slots_meet(slot, other):
            return True
    return False


@dataclasses.dataclass(eq=False)
class Ledger:
    """The copies started and the waits seen while one kernel body is traced."""

    obligations: list[_Obligation] = dataclasses.field(default_factory=list[_Obligation])
    elsewhere: list[_ElsewhereWait] = dataclasses.field(default_factory=list[_ElsewhereWait])
    # Semaphores whose copies are accounted for outside start/wait pairing (see
    # settle_semaphore): they cover copies like a wait does, but are not waits.
    settled: list[object] = dataclasses.field(default_factory=list[object])
    # Refs and traces are compared by identity: keep them alive for the whole trace.
    keep_alive: list[object] = dataclasses.field(default_factory=list[object])
    # The ledger of the kernel this body runs inside (an emit_pipeline body checked as a
    # kernel of its own): a wait by slot here waits the enclosing kernel's copies too.
    parent: Ledger | None = None
    # Equations already in the body's frame when it began: an emit_pipeline body is traced
    # into the pipeline's step, after the pipeline's own waits on its buffers' semaphores
    # (raw, on loop arguments of the same type as a user's): those are not the body's.
    begins_at: int = 0
    # The jax trace the body began in (see _hand_over).
    frame: object = None
    # Semaphores followed out to this frame's (see _outer_ref), by the id of their root.
    outer_refs: dict[int, object | None] = dataclasses.field(default_factory=dict[int, object])

    def chain(self) -> Iterator[Ledger]:
        """This ledger and those of the bodies it runs inside, innermost first."""
        ledger: Ledger | None = self
        while ledger is not None:
            yield ledger
            ledger = ledger.parent

    def check_all_waited(self, kernel_name: str) -> None:
        """Raise CopyNeverWaitedError for a copy no wait in the body can stand for (T7)."""
        # Computed indices are read as the slots they can take, now the body is traced.
        left = self._left_unwaited(
            kernel_name, BodySlots(self.frame), BodySlots(self.frame, bounds=False)
        )
        if left:
            count = sum(left.values())
            raise CopyNeverWaitedError(
                f"kernel {kernel_name!r}: {count} cop{'y was' if count == 1 else 'ies were'} "
                "started and never waited anywhere in the kernel body (in no branch, no loop, "
                "and by no started_elsewhere() wait on the same semaphore slot):\n"
                + "\n".join(
                    f"  - {copies_of(n)}{what}, started at {where}: {calls} never called"
                    for (what, where, calls), n in left.items()
                )
                + "\nOn a TPU this crashes the program; in interpret mode the copy never "
                f"lands. {_t7_fix(left)} Then {VERIFY_HINT}."
            )

    def _left_unwaited(
        self, kernel_name: str, body: BodySlots, unbounded: BodySlots
    ) -> dict[tuple[str, SourceLine, str], int]:
        """The copies no wait can stand for, one entry per start site (see
        check_all_waited); those this body hands over to the one around it are not.
        ``body`` reads computed indices within the loops' and grid's bounds, ``unbounded``
        without them (for a copy that may not start on every run of the body)."""
        # One entry per start site: copies with the same description, start line (with
        # the calls that led there) and unwaited sides are one line with a count, so a
        # row loop that leaks 16 copies says so once; distinct sites stay distinct, in
        # the order they were started.
        left: dict[tuple[str, SourceLine, str], int] = {}
        elsewhere: list[_Slot] | None = None  # computed only if some copy needs it
        named: list[_Slot] | None = None  # those that name their semaphore (see _hand_over)
        waited_inside: Callable[[object], bool] = bool
        for ob in self.obligations:
            missing: list[Side] = []
            # A copy's computed indices are read within the loops' and grid's bounds only
            # where it starts on every run of the body; not in a branch, which may never
            # run on the iterations the bounds narrow them to.
            computed = any(_compat.static_positions(s) is None for s in ob.sems.values())
            own = body if not computed or body.runs_always(ob.record) else unbounded
            for side, sem in ob.sems.items():
                if ob.waited[side]:
                    continue
                if elsewhere is None:
                    elsewhere = [_slot(w.sem, body) for w in self.elsewhere]
                    elsewhere += [_slot(sem, body) for sem in self.settled]
                    elsewhere += _raw_wait_slots(self.begins_at, body=body)
                if not ob.bodies:
                    covered = self.covers(sem, elsewhere, own=own)
                else:
                    # A copy handed over: both sides named by this body's semaphores, or
                    # a raw wait inside a block on the very semaphore a block allocated.
                    if named is None:
                        named = [self._named(s) for s in elsewhere if s.root != _ALLOCATED_INSIDE]
                        waited_inside = _raw_waits.raw_waited_inside(
                            self.frame, is_library_file, self.begins_at
                        )
                    mine = self._named(_slot(sem, own))
                    covered = any(_slots_meet(mine, s) for s in named) or waited_inside(mine.ref)
                if not covered:
                    missing.append(side)
            if missing and self._hand_over(ob, kernel_name):
                continue
            if missing:
                calls = " and ".join(side.value for side in missing)
                inside = (
                    " in the body " + " inside ".join(map(repr, ob.bodies)) if ob.bodies else ""
                )
                key = (ob.text() + inside, ob.started_at, calls)
                left[key] = left.get(key, 0) + 1
        return left

    def _named(self, slot: _Slot) -> _Slot:
        return _named_in(slot, self._outer_ref)

    def _outer_ref(self, ref: object) -> object | None:
        """``_raw_waits.outer_ref`` in this body's frame, once per root (it walks the frame's
        jaxprs); only while the body checks, when the frame's equations are final."""
        root = _compat.root_of(ref)
        if id(root) not in self.outer_refs:
            self.keep_alive.append(root)
            self.outer_refs[id(root)] = _raw_waits.outer_ref(root, self.frame, self.begins_at)
        return self.outer_refs[id(root)]

    def covers(self, sem: object, slots: list[_Slot], *, own: BodySlots | None = None) -> bool:
        """Whether a wait of ``slots`` may stand for a copy on ``sem`` (see _on_slot), once
        the body is traced. A ref of a block nested in the body (a loop's or branch's
        argument, a ``jax.jit`` helper's parameter) is followed out to the operand it
        received (``_named``); where both sides are followed, only the same semaphore slot
        meets (a copy on ``s.at[0]`` of a branch argument ``s`` is not waited by a wait on
        ``sems.at[1]`` after the branch, and is by one on ``sems.at[0]``); where one is not,
        a block's argument meets any semaphore of its type, as before. ``own``: what
        reads ``sem``'s computed indices (None: any slot; see _slot)."""
        mine = _slot(sem, own)
        for other in slots:
            if _ANY_SEMAPHORE in (mine.root, other.root):
                return True
            met = _on_slot(sem, [other], own)
            if met and (mine.root == other.root or other.root == _ALLOCATED_INSIDE):
                return True
            if other.root == _ALLOCATED_INSIDE:
                continue
            a, b = self._named(mine), self._named(other)
            followed = not (
                _raw_waits.allocated_inside(a.ref, self.frame)
                or _raw_waits.allocated_inside(b.ref, self.frame)
            )
            if (met and not followed) or (followed and _slots_meet(a, b)):
                return True
        return False

    def _hand_over(self, ob: _Obligation, kernel_name: str) -> bool:
        """Leave a copy this body does not wait to the body it runs inside: a copy an
        emit_pipeline step starts may be waited by the kernel after the pipeline, as a copy
        a loop iteration starts may be waited after the loop.

        Not a copy on a semaphore allocated inside this body (it is gone outside). There,
        only waits that name the copy's semaphore stand for it (check_all_waited: safedma's
        waits by slot, raw waits on that semaphore), never a raw wait matched by type or as
        one on some scoped semaphore: the pipeline's own waits on its buffers' semaphores
        are such waits in the enclosing frame. A loop's or branch's argument (a cond
        operand, a fori_loop carry, a ref the pipeline passes through its loop) is named
        there by the operand it received (``_named_in``), followed out when the enclosing
        body checks, once jax has made those blocks equations of its frame."""
        parent = self.parent
        if parent is None:
            return False
        if any(self._outer_ref(sem) is None for sem in ob.sems.values()):
            return False
        parent.keep_alive.extend(ob.sems.values())
        # Described now: the refs are named by this body's parameters, which the
        # enclosing body may not know (a ref the pipeline hands the body).
        ob.described = ob.text()
        ob.bodies = (*ob.bodies, kernel_name)
        parent.obligations.append(ob)
        return True


_ELSEWHERE_FIX = {
    Side.LOCAL: "copy.started_elsewhere().wait() in a later loop iteration or grid step",
    Side.SEND: "copy.started_elsewhere().wait_send() in a later loop iteration or grid step",
    Side.RECV: "copy.incoming().wait_recv() on the receiving device (or "
    "copy.started_elsewhere().wait_recv() in a later step)",
}


def _t7_fix(left: dict[tuple[str, SourceLine, str], int]) -> str:
    """The fix, naming the waits the listed copies lack (not a local wait() for a copy
    whose receive side is what is missing)."""
    sides = [side for side in Side if any(side.value in calls for _, _, calls in left)]
    on_handle = " / ".join(f"handle.{side.value}" for side in sides)
    elsewhere = "; ".join(_ELSEWHERE_FIX[side] for side in sides)
    both = f"{Side.SEND.value} and {Side.RECV.value}"
    if any(calls == both for _, _, calls in left):
        # A remote copy with neither side waited: one call waits both, as jax's wait() does.
        on_handle = f"handle.wait() (both sides) or {on_handle}"
        elsewhere = (
            "copy.started_elsewhere().wait() for both sides in a later loop iteration, grid "
            f"step or pl.when block, or one side: {elsewhere}"
        )
    return (
        f"Call {on_handle} on each handle that start() returned, or, for a copy waited "
        f"elsewhere, wait it there: {elsewhere}, on the semaphore the copy was started on."
    )


_current: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar(
    "safedma_ledger", default=None
)


def current_ledger() -> Ledger | None:
    return _current.get()


@contextlib.contextmanager
def ledger_scope() -> Generator[Ledger, None, None]:
    """Record the copies and waits of the kernel body traced inside this block."""
    frame = _compat.current_frame()
    ledger = Ledger(parent=_current.get(), begins_at=_compat.traced_so_far(frame), frame=frame)
    ledger.keep_alive.append(frame)
    token = _current.set(ledger)
    try:
        yield ledger
    finally:
        _current.reset(token)


def settle_semaphore(sem: object) -> None:
    """Count every copy on ``sem``'s slot (any side) as waited in the body being traced.

    For waits that decrement a semaphore shared by many copies by their total
    size (``wait_bytes`` / ``wait_copies``), and for copies a kernel leaves in
    flight on purpose (a DMA future): neither can be paired with individual
    starts at trace time, so they count like a ``started_elsewhere()`` wait.
    """
    ledger = _current.get()
    for each in ledger.chain() if ledger is not None else ():
        each.keep_alive.append(sem)
        each.settled.append(sem)


def record_wait_on(sem: object) -> None:
    """Note a wait on ``sem``'s slot that no handle made (a wait by total size)."""
    ledger = _current.get()
    for each in ledger.chain() if ledger is not None else ():
        each.keep_alive.append(sem)
        each.elsewhere.append(_ElsewhereWait(sem))


def started_on(sem: object) -> bool:
    """Whether the body being traced starts a copy on ``sem``'s slot (True outside a body)."""
    ledger = _current.get()
    if ledger is None:
        return True
    started = [s for ob in ledger.obligations for s in ob.sems.values()]
    # Raw pltpu starts count too (the body's jaxpr says what is started); a copy on a ref a
    # nested block received (a jax.jit helper's parameter) is followed out (covers).
    raw = _raw_wait_slots(ledger.begins_at, "dma_start")
    if _on_slot(sem, [*map(_slot, started), *raw]):
        return True
    return any(ledger.covers(s, [_slot(sem)]) for s in started)


def waited_on(sem: object) -> bool:
    """Whether the body being traced waits anything on ``sem``'s slot (True outside a body)."""
    ledger = _current.get()
    if ledger is None:
        return True
    waited = [w.sem for w in ledger.elsewhere]
    waited += [s for ob in ledger.obligations for side, s in ob.sems.items() if ob.waited[side]]
    # Raw pltpu waits count as they do for T7: the body's jaxpr says what is waited.
    return _on_slot(sem, [*map(_slot, waited), *_raw_wait_slots(ledger.begins_at)])


# ------------------------------------------------------------------ control flow


def _block_of(frame: object) -> object:
    """The straight-line block ``frame`` belongs to: run-once bodies (run_scoped) are see-through."""
    while _compat.frame_kind(frame) is FlowKind.ONCE:
        parent = _compat.frame_parent(frame)
        if parent is None:
            break
        frame = parent
    return frame


def current_block() -> object:
    """The straight-line block being traced (a branch of a ``cond`` is a block of its own)."""
    return _block_of(_compat.current_frame())


def _chain(frame: object) -> list[object]:
    chain: list[object] = []
    current: object | None = frame
    while current is not None:
        chain.append(current)
        current = _compat.frame_parent(current)
    return chain


def _left_behind(start: object, here: object) -> list[FlowKind]:
    """The kinds of the blocks that enclose ``start`` but not ``here`` (empty: not escaped)."""
    around_here = {id(f) for f in _chain(here)}
    kinds: list[FlowKind] = []
    for frame in _chain(start):
        if id(frame) in around_here:
            break
        kinds.append(_compat.frame_kind(frame))
    return kinds


# ------------------------------------------------------------------ handles


class HandleState:
    """Per-handle wait bookkeeping; works with or without a kernel scope."""

    __slots__ = ("_obligation", "_waited", "_describe", "_elsewhere", "_sems", "_frame")

    def __init__(
        self, describe: Describe, sems: dict[Side, object], *, started_elsewhere: bool
    ) -> None:
        self._describe = describe
        self._sems = sems
        self._waited: dict[Side, list[_Wait]] = {side: [] for side in sems}
        self._elsewhere = started_elsewhere
        self._frame = _compat.current_frame()
        self._obligation: _Obligation | None = None
        ledger = _current.get()
        if ledger is not None:
            ledger.keep_alive.append(self._frame)
            ledger.keep_alive.extend(sems.values())
            if not started_elsewhere:
                self._obligation = _Obligation(
                    describe,
                    call_site(),
                    sems,
                    self._waited,
                    record=_compat.eqn_record(self._frame),
                )
                ledger.obligations.append(self._obligation)

    def _origin(self) -> str:
        if self._elsewhere:
            return "started elsewhere"
        if self._obligation is not None:
            return f"started at {self._obligation.started_at}"
        return "started"

    def record_wait(self, side: Side, *, call: str | None = None) -> None:
        """Note a wait of ``side``; raise if it escapes its block or repeats one in the same block.

        ``call``: the wait the user wrote, when not ``side``'s own (``wait()`` of a remote
        handle waits both sides); messages name it and suggest the same call."""
        here = call_site()
        frame = _compat.current_frame()
        left = _left_behind(self._frame, frame)
        shown = call or side.value
        if left:
            raise HandleEscapedError(
                _escape_message(self._describe(), shown, here, left, elsewhere=self._elsewhere)
            )
        block = _block_of(frame)
        earlier = next((w for w in self._waited[side] if w.block is block), None)
        if earlier is not None:
            raise HandleWaitedTwiceError(
                f"{shown} on the handle of {self._describe()} ({self._origin()}) was "
                f"called twice in the same block: first at {earlier.where}, again at {here}. "
                "Both waits run on every path that reaches them, and each decrements the "
                "semaphore by the copy's size, so the second can never be satisfied and the "
                "kernel hangs. Keep one of these two waits. (Waits in different branches "
                f"or loop iterations are not checked here: {VERIFY_HINT}.)"
            )
        self._waited[side].append(_Wait(here, block))
        if self._elsewhere:
            record_wait_on(self._sems[side])


def _escape_message(
    description: str, call: str, here: SourceLine, left: list[FlowKind], *, elsewhere: bool
) -> str:
    made = "created" if elsewhere else "started"
    # The fix waits what the escaped wait did (``call``: "wait_send()", ...): a send-side
    # wait rewritten as started_elsewhere().wait() would also wait the receive side, a
    # second time on a device that already waited its incoming copy (the kernel hangs).
    again = f"copy.started_elsewhere().{call}"
    if FlowKind.LOOP in left:
        return (
            f"{call} at {here} waits the handle of {description}, which was {made} inside "
            "a loop body (fori_loop / while_loop / scan) that this wait is outside of. A handle "
            "is tied to the loop iteration that started it: after the loop there is no one "
            "iteration's copy to wait, and jax cannot carry the handle out of the loop "
            "(it would fail with 'captures constants'). Either wait the handle inside the "
            "loop body, or, after the loop, wait the copies the loop left in flight through "
            f"{again} (one per copy still in flight), describing the "
            f"copy again outside the loop. Then {VERIFY_HINT}."
        )
    if FlowKind.BRANCH in left:
        return (
            f"{call} at {here} waits the handle of {description}, which was {made} inside "
            "a branch (pl.when / lax.cond) that this wait is outside of. A handle is tied to "
            "the branch that started it, and jax cannot carry it out of the branch (it would "
            "fail with 'captures constants'). Wait it inside the same branch, or wait the copy "
            f"elsewhere through {again}, describing it again there."
        )
    return (
        f"{call} at {here} waits the handle of {description}, which was {made} inside "
        "a traced block (a run_scoped body or other jax-traced function) that has already "
        "ended; jax cannot carry the handle out of it. Wait it inside that block, or "
        f"through {again} after it."
    )
