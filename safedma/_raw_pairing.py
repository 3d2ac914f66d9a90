"""Raw pltpu copies paired per semaphore slot from the kernel body's jaxpr.

``pltpu.make_async_copy(...).start()`` / ``.wait()`` (and remote copies' ``wait_send`` /
``wait_recv``) leave no record in safedma's ledger; the body's equations do:
``dma_start`` and ``dma_wait``. Once the body is traced, its equations (and those of
every branch, loop body, ``run_scoped`` and ``jax.jit`` helper inside) are read; each
start signals its semaphore slots (the destination's, on the target device for a remote
copy, and the source's), each wait decrements one. safedma's own copies are equations
too: they count as partners, but only raw ones are reported (the ledger reports its own).

Only what is wrong on every path is reported, so a correct kernel is never rejected:

* a raw start no wait anywhere in the body could pair with (every wait on its semaphore
  array is on another static slot): :class:`~safedma.CopyNeverWaitedError`;
* unconditional waits (top level of the body) on a static slot that the starts able to
  signal it cannot cover, counted in bytes (each start outside loops runs at most once
  per body run): a wait no start signals, :class:`~safedma.WaitNeverSignalledError`; a
  second wait of one copy, or a wait larger than its copy,
  :class:`~safedma.WaitExceedsCopiesError` (both subclasses of
  :class:`~safedma.HandleWaitedTwiceError`);
* a root whose every start and wait is unconditional, where the bytes started and waited
  on one static slot differ: :class:`~safedma.CopyShapeMismatchError`.

A computed slot index stands for every slot it can take in any loop iteration or grid
step (``_slot_ranges``: ``i % 2`` is slot 0 or 1, a loop index is within the loop's
bounds), and for every slot of its dimension where that is not known; a wait meets a
start where their slots can be equal in every dimension. A semaphore used by anything
else (a kernel operand, a ``semaphore_signal``, a block the reader does not know) is
skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from safedma import _compat
from safedma import _raw_balance as balance
from safedma._raw_balance import Net
from safedma._slot_ranges import Index, Ranges, Scope, index_of, top_scope
from safedma._errors import (
    CopyNeverWaitedError,
    CopyShapeMismatchError,
    WaitExceedsCopiesError,
    WaitNeverSignalledError,
)
from safedma._raw_waits import block_inputs

__all__ = ["check_raw_copies"]

_LOOPS = ("scan", "while", "emit_pipeline")
_BRANCHES = ("cond",)

Slot = tuple[Index, ...] | None
"""A semaphore view's index per dimension of its array (``()``: the bare ref); None: a
view the reader cannot follow (a slice, a reshape), any slot."""


@dataclasses.dataclass(frozen=True)
class _Event:
    start: bool
    root: int  # the key of the semaphore array (a kernel-level variable, an allocation)
    slot: Slot
    nbytes: int | None
    raw: bool  # not emitted by safedma
    remote: bool  # the signal lands on another device (a remote copy's destination side)
    top: bool  # runs exactly once per body run (no loop or branch around it)
    in_loop: bool
    line: tuple[str, int] | None
    eqn: int  # the identity of its equation (one start eqn signals at most once a run)
    source: Any = dataclasses.field(default=None, compare=False)  # the eqn's source_info


def _meet(a: Slot, b: Slot) -> bool:
    if a is None or b is None or len(a) != len(b):
        return True
    return all(x.meets(y) for x, y in zip(a, b))


def _static(slot: Slot) -> bool:
    return slot is not None and all(x.static for x in slot)


class _Reader:
    def __init__(self, is_own_file: Any) -> None:
        self.events: list[_Event] = []
        self.opaque: set[int] = set()
        # The values semaphore indices can take (a literal a block received, a loop
        # index, ``i % 2``...).
        self.ranges = Ranges()
        self.unbounded = Ranges(bounds=False)  # for starts that may not always run
        self.is_own_file = is_own_file
        self.unsized: set[int] = set()  # roots with a copy or wait of unknown size
        self.allocated: set[int] = set()  # roots a run_scoped in the body allocates
        self.lost = False  # a copy or wait on a semaphore the reader could not name

    def slot(self, view: object, scope: Scope, *, start: bool) -> Slot:
        """The view's index per dimension. A start's index is read within the loops' and
        the grid's bounds only where the start runs on every run of the body
        (``Scope.always``): one in a branch may never run (its guard may fail on exactly
        the iterations the bounds narrow its index to), and then its slot proves nothing;
        there the bounds are left out (a constant stays itself)."""
        axes = _compat.view_index_axes(view)
        if axes is None:
            return None
        ranges = self.ranges if not start or scope.always else self.unbounded
        slot: list[Index] = []
        for i, size in axes:
            literal = not _compat.is_jaxpr_var(i)
            span = ranges.span(i, scope)
            slot.append(index_of(i, size, span, ranges.key(i, scope), literal=literal))
        return tuple(slot)

    def root(self, var: object, env: Mapping[int, int]) -> int | None:
        base = _compat.view_base(var)
        if not _compat.is_jaxpr_var(base):
            return None
        return env.get(id(base), id(base))

    def read(self, scope: Scope, env: dict[int, int], *, top: bool, loop: bool) -> dict[int, Net]:
        """Record the block's events; return, per semaphore root, the bytes its starts
        add less those its waits take over one run of the block, as the range over
        every path through it (:mod:`safedma._raw_balance`)."""
        net: dict[int, Net] = {}
        for eqn in scope.eqns:
            operands = scope.operands_of(eqn)
            name = eqn.primitive.name
            if name in (_compat.DMA_START, _compat.DMA_WAIT):
                before = len(self.events)
                self.dma(eqn, operands, scope, env, top=top, loop=loop)
                for event in self.events[before:]:
                    if event.nbytes is None:
                        self.unsized.add(event.root)
                    else:
                        step = event.nbytes if event.start else -event.nbytes
                        balance.add_to(net, event.root, step)
                continue
            subs = list(_compat.sub_jaxprs(eqn.params))
            sems = [
                self.root(v, env)
                for v in operands
                if _compat.is_jaxpr_var(v) and _compat.is_semaphore_var(v)
            ]
            if not subs:
                self.opaque.update(r for r in sems if r is not None)
                continue
            blocks = block_inputs(eqn)
            if blocks is None:
                self.opaque.update(r for r in sems if r is not None)
                continue
            inner_top = top and name not in _LOOPS and name not in _BRANCHES
            inner_loop = loop or name in _LOOPS
            nets: list[dict[int, Net]] = []
            for jaxpr, positions in blocks:
                inner = dict(env)
                for var, k in zip([*jaxpr.constvars, *jaxpr.invars], positions):
                    if not 0 <= k < len(operands):
                        continue
                    if _compat.is_jaxpr_var(operands[k]):
                        key = self.root(operands[k], env)
                        if key is not None:
                            inner[id(var)] = key
                if name == "run_scoped":
                    self.allocated.update(
                        id(var)
                        for var, k in zip([*jaxpr.constvars, *jaxpr.invars], positions)
                        if k < 0
                    )
                block = self.ranges.enter(eqn, scope, jaxpr)
                nets.append(self.read(block, inner, top=inner_top, loop=inner_loop))
            net = balance.added(net, balance.of_equation(name, eqn.params, nets))
        return net

    def dma(
        self,
        eqn: Any,
        operands: list[Any],
        scope: Scope,
        env: Mapping[int, int],
        *,
        top: bool,
        loop: bool,
    ) -> None:
        args = _compat.dma_operands(eqn, operands)
        raw = not _compat.emitted_from(eqn, self.is_own_file)
        if args is None:
            # Unknown layout: every semaphore it names is left alone.
            for v in operands:
                if _compat.is_jaxpr_var(v) and _compat.is_semaphore_var(v):
                    key = self.root(v, env)
                    if key is not None:
                        self.opaque.add(key)
            return
        src, dst, sem, other, device_id = args
        line = _compat.eqn_user_line(eqn)
        start = eqn.primitive.name == _compat.DMA_START

        def add(view: object, data: object, *, remote: bool) -> None:
            if view is None:
                return
            key = self.root(view, env)
            if key is None:
                self.lost = True
                return
            self.events.append(
                _Event(
                    start,
                    key,
                    self.slot(view, scope, start=start),
                    _compat.view_nbytes(data),
                    raw,
                    remote,
                    top,
                    loop,
                    line,
                    id(eqn),
                    getattr(eqn, "source_info", None),
                )
            )

        if start:
            add(sem, dst, remote=device_id is not None)
            add(other, src, remote=False)
        else:
            add(sem, dst, remote=False)


def _where(line: tuple[str, int] | None) -> str:
    return "an unknown line" if line is None else f"{line[0]}:{line[1]}"


def _name(root: int, names: Mapping[int, str], slot: Slot) -> str:
    base = names.get(root, "a semaphore allocated in the body")
    if slot:
        base += "[" + ", ".join(map(str, slot)) + "]"
    return base


def check_raw_copies(
    frame: object,
    since: int,
    kernel_name: str,
    names: Mapping[int, str],
    skip: set[int],
    is_own_file: Any,
) -> None:
    """Check the raw copies traced into ``frame`` (from its ``since``-th equation on).

    ``names``: kernel-level semaphore variables (by id) and the parameter text naming
    them; ``skip``: ids of semaphore variables whose copies may outlive the body (kernel
    operands: DMA futures)."""
    reader = _Reader(is_own_file)
    net = reader.read(top_scope(_compat.traced_eqns(frame, since)), {}, top=True, loop=False)
    events = [e for e in reader.events if e.root not in reader.opaque and e.root not in skip]
    starts = [e for e in events if e.start]
    waits = [e for e in events if not e.start]
    _never_waited(kernel_name, starts, waits, names)
    _over_waited(kernel_name, starts, waits, names)
    _bytes_differ(kernel_name, starts, waits, names)
    # The balance needs every copy and wait of a semaphore under one name: a semaphore
    # that reached a block under a name the reader could not tie to a parameter or an
    # allocation splits its events, and then nothing is said.
    known = set(names) | reader.allocated
    if reader.lost or any(e.root not in known for e in reader.events):
        return
    unbalanced = {
        root: span
        for root, span in net.items()
        if root not in reader.unsized and (span[0] > 0 or span[1] < 0)
    }
    _unbalanced_on_every_path(kernel_name, unbalanced, events, names)


def _never_waited(
    kernel_name: str, starts: list[_Event], waits: list[_Event], names: Mapping[int, str]
) -> None:
    left = [
        s
        for s in starts
        if s.raw and not any(w.root == s.root and _meet(w.slot, s.slot) for w in waits)
    ]
    if not left:
        return
    lines = sorted({(_where(s.line), _name(s.root, names, s.slot), s.remote) for s in left})
    notes = {_where(s.line): _where_the_wait_belongs([s]) for s in left}
    listed = "\n".join(
        f"  - a raw pltpu copy signalling {sem}{' on the target device' if remote else ''}, "
        f"started at {where}: no wait on that semaphore slot{notes.get(where, '')}"
        for where, sem, remote in lines
    )
    raise CopyNeverWaitedError(
        f"kernel {kernel_name!r}: {len(lines)} raw cop{'y was' if len(lines) == 1 else 'ies were'} "
        "started and never waited anywhere in the kernel body (in no branch, no loop; every "
        "wait on the same semaphore array is on another slot):\n"
        f"{listed}\nOn a TPU this crashes the program; in interpret mode the copy never lands. "
        "Call .wait() on the descriptor (wait_send() and wait_recv() for a remote copy), or "
        "wait a descriptor of the same size on the same semaphore slot where the copy is "
        "consumed (a later loop iteration or grid step)."
    )


def _over_waited(
    kernel_name: str, starts: list[_Event], waits: list[_Event], names: Mapping[int, str]
) -> None:
    for w in waits:
        if not (w.raw and w.top and _static(w.slot)):
            continue
        same = [o for o in waits if o.top and o.root == w.root and o.slot == w.slot]
        signals = [s for s in starts if s.root == w.root and _meet(s.slot, w.slot)]
        if any(s.remote or s.in_loop or s.nbytes is None for s in signals):
            continue  # peers may signal it, or a loop any number of times
        if any(o.nbytes is None for o in same):
            continue
        most = sum({s.eqn: s.nbytes or 0 for s in signals}.values())
        needed = sum(o.nbytes or 0 for o in same)
        if needed <= most:
            continue
        sem = _name(w.root, names, w.slot)
        extra = [o for o in same if o.raw][-1]  # the wait past what is signalled
        at = _where(extra.line)
        if not signals:
            raise WaitNeverSignalledError(
                f"kernel {kernel_name!r}: the raw wait at {at} waits on {sem}, which no copy "
                f"or signal in the kernel body adds to, so the kernel hangs there on every "
                "path. Wait the semaphore slot the copy was started on (or start the copy on "
                "this slot)."
            )
        started = ", ".join(sorted({_where(s.line) for s in signals}))
        copies = len({s.eqn for s in signals})
        if len(same) > copies:
            fix = "Keep one wait per copy started: remove the extra wait."
        else:
            fix = (
                "Give the wait the copy's own descriptor (the same source, destination and "
                "size as the copy it stands for)."
            )
        raise WaitExceedsCopiesError(
            f"kernel {kernel_name!r}: the raw wait at {at} can never be satisfied: "
            f"{len(same)} wait(s) on {sem} take {needed} bytes on every run of the body, "
            f"while the {copies} cop{'y' if copies == 1 else 'ies'} able to signal it "
            f"(started at {started}) add at most {most} bytes, so the kernel hangs there on "
            f"every path. {fix}"
        )


def _bytes_differ(
    kernel_name: str, starts: list[_Event], waits: list[_Event], names: Mapping[int, str]
) -> None:
    roots = {e.root for e in waits if e.raw} | {e.root for e in starts if e.raw}
    for root in roots:
        mine = [e for e in (*starts, *waits) if e.root == root]
        if not all(
            e.top and _static(e.slot) and e.nbytes is not None and not e.remote for e in mine
        ):
            continue
        for slot in {e.slot for e in mine}:
            here = [e for e in mine if e.slot == slot]
            started = sum(e.nbytes or 0 for e in here if e.start)
            waited = [e for e in here if not e.start]
            total = sum(e.nbytes or 0 for e in waited)
            if not waited or total == started or started == 0:
                continue
            raw_waits = [e for e in waited if e.raw]
            subject = raw_waits[0] if raw_waits else waited[0]
            begun = ", ".join(sorted({_where(e.line) for e in here if e.start}))
            raise CopyShapeMismatchError(
                f"kernel {kernel_name!r}: the wait at {_where(subject.line)} on "
                f"{_name(root, names, slot)} waits {total} bytes in all, while the copies "
                f"started on that slot (at {begun}) signal {started}: a wait decrements the "
                "semaphore by its descriptor's size, so the kernel "
                + (
                    "hangs"
                    if total > started
                    else "reads data still in flight and ends with the semaphore not zero"
                )
                + ". Wait with a descriptor of the same source and destination as the copy "
                "started (the same .at[...] slices)."
            )


def _unbalanced_on_every_path(
    kernel_name: str,
    unbalanced: Mapping[int, Net],
    events: list[_Event],
    names: Mapping[int, str],
) -> None:
    """A semaphore whose copies add more bytes than its waits take (or fewer) on every
    path through the body: summed over every grid step (and every device, a remote
    copy's signal counted where it starts), some slot ends non-zero or some wait never
    completes, whatever the inputs."""
    for root, (low, high) in unbalanced.items():
        mine = [e for e in events if e.root == root]
        if not any(e.raw for e in mine):
            continue  # only safedma's own copies: its ledger reports them
        sem = _name(root, names, None)
        begun = ", ".join(sorted({_where(e.line) for e in mine if e.start})) or "nowhere"
        waited = ", ".join(sorted({_where(e.line) for e in mine if not e.start})) or "nowhere"
        if low > 0:
            raise CopyNeverWaitedError(
                f"kernel {kernel_name!r}: on every path through the kernel body, the raw "
                f"copies started on {sem} (at {begun}) add at least {low:.0f} bytes more "
                f"than its waits (at {waited}) take, in every grid step: a copy is never "
                f"waited, or a wait's descriptor is smaller than its copy"
                f"{_where_the_wait_belongs([e for e in mine if e.start])}. On a TPU the "
                "semaphore is left non-zero at exit (a crash) and the copy's data may be "
                "read while in flight. Wait each copy with a descriptor of its own size "
                "(its own source and destination slices)."
            )
        raise WaitExceedsCopiesError(
            f"kernel {kernel_name!r}: on every path through the kernel body, the raw "
            f"waits on {sem} (at {waited}) take at least {-high:.0f} bytes more than the "
            f"copies started on it (at {begun}) add, in every grid step: a wait is "
            "repeated, or its descriptor is larger than its copy, so the kernel hangs. "
            "Keep one wait per copy, each with the copy's own descriptor."
        )


def _where_the_wait_belongs(started: list[_Event]) -> str:
    """Where the kernel's source says the missing wait of one of ``started`` goes (a
    start-or-wait helper's other branch, a waiting counterpart...), as a note starting
    ``"; "``, or ``""``. Read only when an error is raised: the source readers live
    with verify's messages, which give the same notes."""
    try:
        from safedma.testing._missing_waits import where_the_wait_belongs
        from safedma.testing._user_frames import traceback_frames, user_frame_of
    except ImportError:  # a stripped install: the error is worth more than the note
        return ""

    for event in started:
        where = user_frame_of(traceback_frames(event.source)) if event.source else None
        note = where_the_wait_belongs(where) if where else ""
        if note:
            return note
    return ""
