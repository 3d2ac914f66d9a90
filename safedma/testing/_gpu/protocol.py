"""The copy/barrier protocol of one thread of a Pallas GPU kernel, and its rules.

One :class:`Protocol` follows one kernel program (one point of the grid, one
warpgroup) through the operations the walker hands it:

* a barrier completes a phase once ``num_arrivals`` arrivals were issued to it
  and the copies among them landed; ``copy_gmem_to_smem(src, dst, barrier)``
  is one arrival (made when the copy is issued, completing when its bytes
  land), ``barrier_arrive`` one more;
* ``barrier_wait`` waits for the next phase the thread has not waited for
  (each wait flips the thread's parity for that barrier): it hangs if that
  phase cannot get its arrivals (nothing else arrives while the thread waits),
  and may hang if the following phase could complete too before it (the parity
  it tests has come round again);
* a copy's destination may be touched only after a wait that observes it;
* ``copy_smem_to_gmem`` reads its source asynchronously; ``commit_group``
  (the copy's default, or ``commit_smem_to_gmem_group``) closes a group, and
  ``wait_smem_to_gmem(n)`` waits until at most the ``n`` most recent groups are in
  flight (``wait_read_only``: their reads of SMEM are done); a store's source may
  be written only once its reads are done;
* SMEM the threads wrote must be ``commit_smem()``-ed before a copy or an MMA
  reads it;
* no copy may still write shared memory, and no store still read it, when the
  kernel or the buffer's scope ends (a store whose reads are done may finish its
  GMEM writes after the kernel: a read-only wait is how jax's own kernels end).
"""

from __future__ import annotations

import copy as _copy
import dataclasses
from collections.abc import Iterable

from safedma.testing._gpu.errors import (
    CopyInFlightAtExitError,
    DeadlockError,
    VerificationUnsupportedError,
    VerifiedRaceError,
)
from safedma.testing._gpu.regions import Buffer, Region, overlap

__all__ = ["Protocol"]


@dataclasses.dataclass
class _Barrier:
    name: str
    num_arrivals: int
    issued: int = 0
    waits: int = 0
    # (phase, what arrived, line) of the latest arrivals, for messages
    arrivals: list[tuple[int, str, str]] = dataclasses.field(
        default_factory=list[tuple[int, str, str]]
    )


@dataclasses.dataclass
class _Load:
    region: Region
    barrier: tuple[int, int]
    barrier_name: str
    phase: int
    line: str


@dataclasses.dataclass
class _Store:
    """A ``copy_smem_to_gmem`` in flight. ``after``: (fewest, most) groups committed
    after its own, over the paths that reach here (None: not committed yet);
    ``maybe``: only some paths issued it, or only some have waited for it."""

    ident: int
    region: Region
    line: str
    after: tuple[int, int] | None = None
    read_done: bool = False
    maybe: bool = False


_KEEP_ARRIVALS = 8


class Protocol:
    """The protocol state of one thread, checked operation by operation."""

    def __init__(self, where: str) -> None:
        self.where = where  # "kernel `k`" or "kernel `k`, program (1, 0)"
        self.barriers: dict[tuple[int, int], _Barrier] = {}
        self.loads: list[_Load] = []
        self.stores: list[_Store] = []
        self.store_ids = 0
        # SMEM the threads wrote since the last commit_smem: (region, line, maybe)
        self.dirty: list[tuple[Region, str, bool]] = []
        self.copies_in = 0
        self.copies_out = 0
        self.waits = 0

    # -- state for branches on unknown values --------------------------------------

    def clone(self) -> Protocol:
        return _copy.deepcopy(self)

    def snapshot(self) -> object:
        """What the rest of the program's checks depend on (counters excluded)."""
        return (
            tuple(sorted((k, b.issued, b.waits) for k, b in self.barriers.items())),
            tuple((ld.region, ld.barrier, ld.phase) for ld in self.loads),
            tuple((s.region, s.after, s.read_done, s.maybe) for s in self.stores),
            tuple(self.dirty),
        )

    def join(self, others: list[Protocol]) -> bool:
        """Merge the states branches on an unknown value left (``self`` is one of them).

        Barrier counts and copies in flight must agree (else False: the caller
        refuses); stores and uncommitted writes some branches made are kept as
        *maybe*: a mistake that needs one is refused, never reported, since the
        branch may not run.
        """
        key = (
            tuple(sorted((k, b.issued, b.waits) for k, b in self.barriers.items())),
            tuple((ld.region, ld.barrier, ld.phase) for ld in self.loads),
        )
        for o in others:
            okey = (
                tuple(sorted((k, b.issued, b.waits) for k, b in o.barriers.items())),
                tuple((ld.region, ld.barrier, ld.phase) for ld in o.loads),
            )
            if okey != key:
                return False
        states = [self, *others]
        by_id: dict[int, list[_Store]] = {}
        for st in states:
            for store in st.stores:
                by_id.setdefault(store.ident, []).append(store)
        merged: list[_Store] = []
        for ident in sorted(by_id):
            copies = by_id[ident]
            afters = [c.after for c in copies]
            if any(a is None for a in afters) and not all(a is None for a in afters):
                return False
            first = copies[0]
            after = None
            if afters[0] is not None:
                los = [a[0] for a in afters if a is not None]
                his = [a[1] for a in afters if a is not None]
                after = (min(los), max(his))
            done = {c.read_done for c in copies}
            merged.append(
                _Store(
                    ident,
                    first.region,
                    first.line,
                    after,
                    read_done=done == {True},
                    maybe=len(copies) < len(states)
                    or len(done) > 1
                    or any(c.maybe for c in copies),
                )
            )
        self.stores = merged
        self.store_ids = max(st.store_ids for st in states)
        # the report counts what the busiest branch issued
        self.copies_in = max(st.copies_in for st in states)
        self.copies_out = max(st.copies_out for st in states)
        self.waits = max(st.waits for st in states)
        dirty: dict[tuple[Region, str], bool] = {}
        for st in states:
            for region, at, maybe in st.dirty:
                dirty[(region, at)] = dirty.get((region, at), False) or maybe
        counts = {
            (region, at): sum((region, at) == (r, a) for st in states for r, a, _ in st.dirty)
            for region, at in dirty
        }
        self.dirty = [(r, a, m or counts[(r, a)] < len(states)) for (r, a), m in dirty.items()]
        return True

    def adopt(self, other: Protocol) -> None:
        self.__dict__.update(other.__dict__)

    # -- helpers -----------------------------------------------------------------

    def _fail(self, cls: type[Exception], text: str) -> Exception:
        return cls(f"{self.where}: {text}")

    def _overlaps(self, a: Region, b: Region, doing: str, line: str) -> bool:
        ov = overlap(a, b)
        if ov is None:
            raise self._fail(
                VerificationUnsupportedError,
                f"cannot tell whether {a.text()} ({doing} at {line}) and {b.text()} "
                "share elements (an index the checker could not evaluate, a strided "
                "slice, or a reshape after an index); the checker refuses rather than "
                "guess.",
            )
        return ov

    def _barrier(self, buffer: Buffer, index: int, name: str) -> _Barrier:
        key = (buffer.ident, index)
        state = self.barriers.get(key)
        if state is None:
            assert buffer.barrier is not None
            state = _Barrier(name, buffer.barrier[0])
            self.barriers[key] = state
        return state

    @staticmethod
    def _arrive(b: _Barrier, what: str, line: str) -> int:
        phase = b.issued // b.num_arrivals
        b.issued += 1
        b.arrivals.append((phase, what, line))
        del b.arrivals[:-_KEEP_ARRIVALS]
        return phase

    # -- operations --------------------------------------------------------------

    def copy_in(
        self, dst: Region, barrier: Buffer, index: int, barrier_name: str, line: str
    ) -> None:
        """``copy_gmem_to_smem(src, dst, barrier)``."""
        for load in self.loads:
            if self._overlaps(dst, load.region, "the destination of a copy", line):
                raise self._fail(
                    VerifiedRaceError,
                    f"data race: the copy into {dst.text()} at {line} writes SMEM that the "
                    f"copy into {load.region.text()} at {load.line} is still writing: no "
                    f"barrier_wait({load.barrier_name}) observed that copy (phase "
                    f"{load.phase}) before. Wait for the earlier copy before reusing its "
                    "destination.",
                )
        for store in self.stores:
            if not store.read_done and self._overlaps(
                dst, store.region, "the destination of a copy", line
            ):
                self._not_maybe(
                    store.maybe,
                    f"the copy at {line} may overwrite SMEM the store at {store.line} reads",
                )
                raise self._fail(
                    VerifiedRaceError,
                    f"data race: the copy into {dst.text()} at {line} overwrites SMEM that "
                    f"the store copy_smem_to_gmem({store.region.text()}, ...) at "
                    f"{store.line} may still be reading. Call "
                    "plgpu.wait_smem_to_gmem(n, wait_read_only=True) with n small enough "
                    "that this store is done before the copy.",
                )
        b = self._barrier(barrier, index, barrier_name)
        phase = self._arrive(b, f"the copy into {dst.text()}", line)
        self.loads.append(_Load(dst, (barrier.ident, index), barrier_name, phase, line))
        self.copies_in += 1

    def arrive(self, barrier: Buffer, index: int, barrier_name: str, line: str) -> None:
        """``barrier_arrive(barrier)``."""
        self._arrive(self._barrier(barrier, index, barrier_name), "barrier_arrive", line)

    def wait(self, barrier: Buffer, index: int, barrier_name: str, line: str) -> None:
        """``barrier_wait(barrier)``."""
        b = self._barrier(barrier, index, barrier_name)
        w, n = b.waits, b.num_arrivals
        if b.issued < (w + 1) * n:
            got = b.issued - w * n
            if w > 0 and got <= 0:
                why = (
                    f"no arrival came after phase {w - 1}, which an earlier barrier_wait "
                    "already observed: this waits a second time for one completion"
                )
            else:
                why = f"only {got} of its {n} arrivals were issued"
            seen = "; ".join(f"{what} at {at} (phase {p})" for p, what, at in b.arrivals) or (
                "none"
            )
            raise self._fail(
                DeadlockError,
                f"deadlock: barrier_wait({barrier_name}) at {line} waits for phase {w} "
                f"of {barrier_name} (Barrier(num_arrivals={n})), but {why}, and nothing "
                f"else can arrive while this thread waits, so it hangs. Arrivals so far: "
                f"{seen}. Issue the missing copy or barrier_arrive before the wait, or "
                "make num_arrivals the number of arrivals each phase gets.",
            )
        if b.issued >= (w + 2) * n:
            later = [(what, at) for p, what, at in b.arrivals if p == w + 1]
            named = "; ".join(f"{what} at {at}" for what, at in later) or "later arrivals"
            raise self._fail(
                DeadlockError,
                f"barrier overrun: barrier_wait({barrier_name}) at {line} waits for phase "
                f"{w}, but phase {w + 1} got all {n} of its arrivals before it "
                f"({named}). When both phases complete before the wait, the parity it "
                "tests has come round again and it hangs; otherwise it returns before "
                f"the later copy lands. {barrier_name} has num_arrivals={n}: give each "
                "copy in flight its own barrier (num_barriers=k), or set num_arrivals "
                "to the number of copies one wait covers.",
            )
        b.waits += 1
        key = (barrier.ident, index)
        self.loads = [ld for ld in self.loads if not (ld.barrier == key and ld.phase <= w)]
        self.waits += 1

    def access(self, region: Region, write: bool, what: str, line: str) -> None:
        """The threads read (``write`` False) or write ``region`` of SMEM."""
        for load in self.loads:
            if self._overlaps(region, load.region, what, line):
                raise self._fail(
                    VerifiedRaceError,
                    f"data race: {what} of {region.text()} at {line} happens before the "
                    f"barrier_wait({load.barrier_name}) that observes the copy into "
                    f"{load.region.text()} at {load.line} (phase {load.phase} of "
                    f"{load.barrier_name}): the copy may still be writing it. Call "
                    f"plgpu.barrier_wait({load.barrier_name}) before the "
                    f"{'write' if write else 'read'}.",
                )
        if not write:
            return
        for store in self.stores:
            if not store.read_done and self._overlaps(region, store.region, what, line):
                self._not_maybe(
                    store.maybe,
                    f"{what} at {line} may overwrite SMEM the store at {store.line} reads",
                )
                raise self._fail(
                    VerifiedRaceError,
                    f"data race: {what} of {region.text()} at {line} overwrites SMEM "
                    f"that the store copy_smem_to_gmem({store.region.text()}, ...) at "
                    f"{store.line} may still be reading. Call "
                    "plgpu.wait_smem_to_gmem(n, wait_read_only=True) with n small enough "
                    "that this store is done before the write.",
                )
        self.dirty.append((region, line, False))

    def async_read(self, region: Region, what: str, line: str) -> None:
        """The copy engine or the tensor core reads ``region`` (a store's source, an MMA operand)."""
        for written, at, maybe in self.dirty:
            if self._overlaps(region, written, what, line):
                self._not_maybe(
                    maybe,
                    f"{what} at {line} reads {region.text()}, which the "
                    f"kernel may have written at {at} without commit_smem",
                )
                raise self._fail(
                    VerifiedRaceError,
                    f"missing commit_smem: {what} at {line} reads {region.text()}, which "
                    f"the kernel wrote at {at} with no plgpu.commit_smem() in between: "
                    "the asynchronous reader may see the old bytes. Call "
                    "plgpu.commit_smem() after the write and before the copy.",
                )
        self.access(region, False, what, line)

    def commit_smem(self) -> None:
        self.dirty.clear()

    def copy_out(self, src: Region, commit_group: bool, line: str) -> None:
        """``copy_smem_to_gmem(src, dst, commit_group=...)``."""
        self.async_read(src, "the store copy_smem_to_gmem", line)
        self.store_ids += 1
        self.stores.append(_Store(self.store_ids, src, line))
        self.copies_out += 1
        if commit_group:
            self.commit_group()

    def commit_group(self) -> None:
        for store in self.stores:
            if store.after is None:
                store.after = (0, 0)
            else:
                store.after = (store.after[0] + 1, store.after[1] + 1)

    def wait_stores(self, n: int, read_only: bool) -> None:
        """``wait_smem_to_gmem(n, wait_read_only)``: groups with ``n`` or more groups
        committed after them are done."""
        kept: list[_Store] = []
        for store in self.stores:
            if store.after is not None and store.after[0] >= n:
                if not read_only:
                    continue
                store.read_done = True
            elif store.after is not None and store.after[1] >= n:
                store.maybe = True  # done on some paths only
            kept.append(store)
        self.stores = kept

    def _not_maybe(self, maybe: bool, what: str) -> None:
        if maybe:
            raise self._fail(
                VerificationUnsupportedError,
                f"{what} only on some values of data the checker does not know (a branch "
                "on a value read from memory issued it or waited for it); the checker "
                "refuses rather than report a mistake that may never happen.",
            )

    # -- ends --------------------------------------------------------------------

    def scope_end(self, buffers: Iterable[Buffer], line: str | None) -> None:
        """The ``run_scoped`` that allocated ``buffers`` returns at ``line`` (None: the
        kernel's own scratch, released when the kernel ends)."""
        idents = {b.ident for b in buffers}
        for load in self.loads:
            if load.region.buffer.ident in idents:
                ends = (
                    f"the scope that allocated {load.region.buffer.name} ends at {line}"
                    if line
                    else "the kernel ends"
                )
                raise self._fail(
                    CopyInFlightAtExitError,
                    f"copy in flight at exit: the copy into {load.region.text()} at "
                    f"{load.line} is never observed by a barrier_wait({load.barrier_name}) "
                    f"(phase {load.phase}) before {ends}, so it may still write released "
                    f"shared memory. Call plgpu.barrier_wait({load.barrier_name}) before "
                    "then, or drop the copy.",
                )
        for store in self.stores:
            if not store.read_done and store.region.buffer.ident in idents:
                self._not_maybe(store.maybe, f"the store at {store.line} may be in flight at exit")
                ends = f"its scope ends at {line}" if line else "the kernel ends"
                raise self._fail(
                    CopyInFlightAtExitError,
                    f"store in flight at exit: copy_smem_to_gmem({store.region.text()}, "
                    f"...) at {store.line} may still read {store.region.buffer.name} when "
                    f"{ends}. Call plgpu.wait_smem_to_gmem(0) before then.",
                )

    def kernel_end(self) -> None:
        """The kernel returns: nothing may be in flight."""
        for load in self.loads:
            raise self._fail(
                CopyInFlightAtExitError,
                f"copy in flight at kernel exit: the copy into {load.region.text()} at "
                f"{load.line} is never observed by a barrier_wait({load.barrier_name}) "
                "(its phase "
                f"{load.phase}): the kernel ends while it may still write shared memory. "
                f"Call plgpu.barrier_wait({load.barrier_name}) before the kernel returns, "
                "or drop the copy.",
            )
        for store in self.stores:
            if store.read_done:
                # Its reads of shared memory are done; the writes to GMEM complete
                # with the kernel (a read-only wait is how jax's own kernels end).
                continue
            self._not_maybe(store.maybe, f"the store at {store.line} may be in flight at exit")
            never = (
                " It was never committed to a group (commit_group=False and no "
                "commit_smem_to_gmem_group() after it), so no wait covers it."
                if store.after is None
                else ""
            )
            raise self._fail(
                CopyInFlightAtExitError,
                f"store in flight at kernel exit: copy_smem_to_gmem({store.region.text()}, "
                f"...) at {store.line} may still read shared memory when the kernel "
                f"returns.{never} Call plgpu.wait_smem_to_gmem(0) (wait_read_only=True "
                "suffices) at the end of the kernel.",
            )
