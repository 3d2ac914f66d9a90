"""The participants of one verification: buffers, counterparts on other devices, barriers."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import VerificationUnsupportedError
from safedma.testing._verify.naming import element_name
from safedma.testing._verify.model.leftovers import partial_wait
from safedma.testing._verify.model.regions import Buffer
from safedma.testing._verify.model.semantics import Blocked, Machine, SemState
from safedma.testing._verify.model.termination import Budget
from safedma.testing._verify.program.context import Ctx, Gen, RefVal
from safedma.testing._verify.program.scalars import VECTOR, Unknown
from safedma.testing._verify.walk.contents import LIMIT
from safedma.testing._verify.walk.megacore import Chip

__all__ = ["Engine", "collector_paused", "engine_of"]

_MAX_KNOWN = 1 << 16  # elements of a concrete operand kept as known scalars
_IDS = itertools.count(1)  # buffer identities, unique in the process (views are cached by them)


@contextlib.contextmanager
def collector_paused() -> Generator[None, None, None]:
    """Python's cyclic garbage collector off while the devices run.

    Why: a run keeps many objects alive until its end (access records, copies in
    flight, clocks), so the collector's passes re-scan a growing heap for nothing
    (about a tenth of the time at 256 devices). What a run discards is freed by
    reference counting; any cycles are collected once the collector is back on.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Barrier:
    """Mosaic's default device barrier of one kernel call: who arrived, who waits."""

    def __init__(self) -> None:
        self.arrived: set[int] = set()
        self.waiters: list[int] = []
        self.done = False


class Engine:
    """Mesh geometry, the buffer registry and the scheduler of one ``verify`` run."""

    def __init__(
        self,
        axis_names: tuple[str, ...],
        axis_sizes: tuple[int, ...],
        cores: int = 1,
        core_axis: str = "core",
    ) -> None:
        self.axis_names = axis_names
        self.axis_sizes = dict(zip(axis_names, axis_sizes))
        self.shape = axis_sizes
        self.devices = math.prod(axis_sizes) if axis_sizes else 1
        self.cores = cores
        self.core_axis = core_axis
        # the TPU the mesh names (None: unnamed); on a megacore chip a pallas_call's
        # "parallel" grid dimensions are split between its cores (megacore.py)
        self.chip: Chip | None = None
        self._jobs: dict[int, Generator[Blocked, None, Any] | None] = {}
        self._finished: set[int] = set()
        self.futures: list[Buffer] = []
        # arrays that live in VMEM/SMEM between kernels (an out_shape made with
        # pltpu.VMEM(...)): a later kernel gets the buffer itself, not a copied block
        self.resident: set[int] = set()
        # the kernel call whose operand a buffer first was (a semaphore returned by
        # one call and passed to later ones exists from that call on)
        self.born: dict[int, int] = {}
        # checks that wait for every participant to finish (outputs nothing wrote)
        self.deferred: list[Callable[[], None]] = []
        self.participants = self.devices * cores
        self.finished = 0  # participants whose program ended (the progress line reads it)
        self.labels = [self._label(p) for p in range(self.participants)]
        self.machine = Machine(self.labels)
        self.machine.cores = cores
        self.machine.sem_names = self.sem_name
        self._registry: dict[tuple[int, object], Buffer] = {}
        self._roles: dict[int, tuple[object, Any, str, tuple[int, ...] | None]] = {}
        self._barriers: dict[int, _Barrier] = {}
        self.sem_cache: dict[tuple[int, object, int], SemState] = {}
        # the verify call's deadline, shared by its walks (set by the caller)
        self.budget = Budget(math.inf)

    def _label(self, p: int) -> str:
        device, core = divmod(p, self.cores)
        if not self.axis_names:
            where = "device 0"
        else:
            coords = np.unravel_index(device, self.shape)
            inner = ", ".join(f"{n}={int(c)}" for n, c in zip(self.axis_names, coords))
            where = f"device {device} ({inner})"
        return f"{where} core {core}" if self.cores > 1 else where

    def coords(self, p: int) -> dict[str, int]:
        device = p // self.cores
        if not self.axis_names:
            return {}
        return {n: int(c) for n, c in zip(self.axis_names, np.unravel_index(device, self.shape))}

    def participant(self, coords: dict[str, int], core: int) -> int:
        flat = 0
        for n in self.axis_names:
            flat = flat * self.axis_sizes[n] + coords[n]
        return flat * self.cores + core

    # ------------------------------------------------------------ buffers

    def new_buffer(
        self,
        owner: int,
        name: str,
        shape: tuple[int, ...],
        itemsize: int,
        space: str,
        sem_kind: str | None,
        kernel_scoped: bool = True,
    ) -> Buffer:
        return Buffer(
            next(_IDS), owner, name, shape, itemsize, space, sem_kind, kernel_scoped=kernel_scoped
        )

    def buffer(
        self, owner: int, role: object, aval: Any, name: str, shape: tuple[int, ...] | None = None
    ) -> Buffer:
        key = (owner, role)
        buf = self._registry.get(key)
        if buf is None:
            kind = _jax.semaphore_kind(aval)
            space = "SEMAPHORE" if kind is not None else _jax.memory_space(aval)
            buf = self.new_buffer(
                owner, name, shape or _jax.aval_shape(aval), _jax.aval_itemsize(aval), space, kind
            )
            self._registry[key] = buf
            self._roles[buf.ident] = (role, aval, name, shape)
            parts = cast("tuple[object, ...]", role) if isinstance(role, tuple) else ()
            if len(parts) == 3 and parts[0] == "k" and isinstance(parts[1], int):
                self.born[buf.ident] = parts[1]
        return buf

    def counterpart(self, buf: Buffer, owner: int) -> Buffer:
        """The buffer playing ``buf``'s role on participant ``owner``."""
        if buf.owner == owner:
            return buf
        if buf.owner // self.cores == owner // self.cores and buf.space in ("HBM", "ANY", "HOST"):
            return buf  # the cores of a device share its HBM
        role = self._roles.get(buf.ident)
        if role is None:
            raise VerificationUnsupportedError(
                f"a remote copy or signal addresses {buf.name}, which is not a kernel operand, "
                "scratch buffer or semaphore; the verifier cannot find it on the other device"
            )
        r, aval, name, shape = role
        if buf.sem_kind == "BARRIER" and aval is None:
            return self.barrier_buffer(owner, cast(tuple[str, Any], r)[1])
        twin = self.buffer(owner, r, aval, name, shape)
        if buf.ident in self.born:
            self.born[twin.ident] = self.born[buf.ident]
        return twin

    def adopt(self, owner: int, role: object, buf: Buffer, aval: Any, name: str) -> Buffer:
        key = (owner, role)
        existing = self._registry.get(key)
        if existing is not None:
            return existing
        self._registry[key] = buf
        self._roles[buf.ident] = (role, aval, name, None)
        return buf

    def operand_buffer(
        self,
        ctx: Ctx,
        instance: int,
        pos: int,
        desc: Any,
        src: Any,
        smem: bool,
        output: bool = False,
        block: bool = False,
    ) -> Buffer:
        aval = desc.avals[pos]
        name = desc.param_names[pos]
        role = ("k", instance, pos)
        if src is not None and not isinstance(src, RefVal):
            # An array computed outside the kernels (known values when small).
            known: np.ndarray[Any, Any] | None = (
                np.asarray(cast(object, src))
                if isinstance(src, (np.ndarray, np.generic, int, float, bool))
                else None
            )
            lost = src if isinstance(src, Unknown) and src is not VECTOR else None
            src = self.input_value(ctx.p, aval, known, name)
            if lost is not None:
                src.buffer.origin = lost.why  # the operation that computed it
        if isinstance(src, RefVal) and not block and not smem:
            if src.buffer.name.startswith("argument ") and desc.param_named[pos]:
                src.buffer.name = name  # messages name the kernel's own parameter
            return self.adopt(ctx.p, role, src.buffer, aval, name)
        buf = self.buffer(ctx.p, role, aval, name)
        if src is not None and not output:
            self.machine.mark_written(buf)
        elif isinstance(src, RefVal):
            self.machine.mark_written(buf)
        if smem or buf.space == "SMEM":
            values = src.buffer.values if isinstance(src, RefVal) else None
            if values is not None and len(values) == math.prod(buf.shape):
                buf.values = list[object](values)
            else:
                why = operand_origin(name, src)
                unknown: list[object] = [Unknown(why)] * math.prod(buf.shape)
                buf.values = unknown
        return buf

    def barrier_buffer(self, p: int, collective_id: Any) -> Buffer:
        key = (p, ("b", collective_id))
        buf = self._registry.get(key)
        if buf is None:
            buf = self.new_buffer(
                p,
                f"the barrier semaphore (collective_id={collective_id})",
                (),
                4,
                "SEMAPHORE",
                "BARRIER",
                kernel_scoped=False,
            )
            self._registry[key] = buf
            self._roles[buf.ident] = (("b", collective_id), None, buf.name, None)
        return buf

    def _describe_future(self, s: SemState) -> str:
        unit = " bytes" if s.kind == "DMA" else ""
        starts = sorted({c.where for c in s.pending})
        started = f" (started at {'; '.join(starts[:3])})" if starts else ""
        # nothing pending: a later kernel waited less than the future's copy brought
        partial = "" if starts else partial_wait(self.labels, s, unit)
        how = (
            f" was waited only in part{partial}" if partial else " was never waited by a later one"
        )
        return (
            f"{self.labels[s.buffer.owner]}: {s.kind} semaphore {self.sem_name(s)}, "
            f"passed between kernels, holds {s.total()}{unit} at the end of the "
            f"program: a copy started by one pallas_call (a DMA future){started}{how}"
        )

    def _describe_barrier(self, s: SemState) -> str:
        sources = sorted({(self.labels[c.issuer], c.where) for c in s.pending})
        fed = (
            "; counted signals not yet taken by a wait include those from "
            + "; ".join(f"{who} at {where}" for who, where in sources[:3])
            + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
            if sources
            else ""
        )
        return (
            f"{self.labels[s.buffer.owner]}: BARRIER semaphore {self.sem_name(s)} holds "
            f"{s.total()} after the last call: every barrier signal needs a wait "
            f"(the barrier semaphore is shared by every call with this collective_id){fed}"
        )

    def sem_name(self, s: SemState) -> str:
        return element_name(s.buffer.name, s.buffer.shape, s.index)

    def outer_value(
        self, p: int, aval: Any, value: np.ndarray[Any, Any] | None, name: str, arg: str = ""
    ) -> object:
        """An argument of the per-device program: its values when small and known;
        else a buffer whose unknown contents name the user's argument ``arg``."""
        if value is not None and value.size <= _MAX_KNOWN:
            return value
        ref = self.input_value(p, aval, None, name)
        if value is None:
            ref.buffer.origin = (
                f"argument `{arg or name}` of the function, given as a shape (a "
                f"ShapeDtypeStruct): give `{arg or name}` as a concrete array and verify "
                "computes this value exactly"
            )
        return ref

    def input_value(
        self, p: int, aval: Any, value: np.ndarray[Any, Any] | None, name: str
    ) -> RefVal:
        shape = _jax.aval_shape(aval)
        buf = self.new_buffer(
            p, name, shape, _jax.aval_itemsize(aval), "HBM", None, kernel_scoped=False
        )
        self.machine.mark_written(buf)
        if value is not None and value.size <= _MAX_KNOWN:
            buf.values = [v.item() for v in value.reshape(-1)]
        return RefVal(buf)

    # ------------------------------------------------------------ barriers

    def entry_barrier(self, ctx: Ctx, instance: int, where: str, parties: int) -> Gen:
        """Mosaic's default device barrier among the ``parties`` participants that run
        the call (every device's first core, or every core of a megacore split)."""
        st = self._barriers.get(instance)
        if st is None:
            st = self._barriers[instance] = _Barrier()
        st.arrived.add(ctx.p)
        if len(st.arrived) == parties:
            self.machine.clocks.barrier(sorted(st.arrived))
            st.done = True
            for w in st.waiters:
                self.machine.wake(w)
            st.waiters = []
        while not st.done:
            st.waiters.append(ctx.p)
            yield Blocked(
                ctx.p,
                None,
                0,
                where,
                "the other devices at Mosaic's default device barrier before the "
                "kernel (collective_id unset)",
            )
        return None

    # ------------------------------------------------------------ cores

    def core_ctx(self, q: int, axis: str, core: int) -> Ctx:
        coords = self.coords(q)
        coords[axis] = core
        return Ctx(q, self, coords)

    def launch(self, q: int, job: Generator[Blocked, None, Any]) -> None:
        self._jobs[q] = job
        self.machine.wake(q)

    def helper(self, q: int) -> Generator[Blocked, None, None]:
        """Core ``q`` (not core 0): runs the kernel bodies core 0 launches on it."""
        device = q // self.cores
        while True:
            job = self._jobs.get(q)
            if job is None:
                if device in self._finished:
                    return
                yield Blocked(q, None, 0, "", "idle")
                continue
            self._jobs[q] = None
            yield from job

    def main(
        self, p: int, program: Generator[Blocked, None, None]
    ) -> Generator[Blocked, None, None]:
        """Core 0's program; when it ends, the device's other cores stop."""
        yield from program
        device = p // self.cores
        self._finished.add(device)
        for k in range(1, self.cores):
            self.machine.wake(device * self.cores + k)

    # ------------------------------------------------------------ scheduling

    def schedule(self, programs: list[Generator[Blocked, None, Any]]) -> None:
        with collector_paused():
            self._schedule(programs)

    def _schedule(self, programs: list[Generator[Blocked, None, Any]]) -> None:
        m = self.machine
        runnable: deque[int] = deque(range(len(programs)))
        queued = [True] * len(programs)
        blocked: dict[int, Blocked] = {}
        done: list[int] = []

        def wake(p: int) -> None:
            if not queued[p]:
                queued[p] = True
                blocked.pop(p, None)
                runnable.append(p)

        m.wake = wake
        while runnable:
            p = runnable.popleft()
            queued[p] = False
            try:
                b = next(programs[p])
            except StopIteration:
                done.append(p)
                self.finished += 1
                continue
            blocked[p] = b
        for check in self.deferred:
            check()
        stuck = [b for b in blocked.values() if b.what != "idle"]
        if stuck:
            raise m.deadlock(stuck, sorted(done))
        barriers = [
            b
            for (_, role), b in sorted(self._registry.items(), key=lambda kv: kv[0][0])
            if isinstance(role, tuple) and role and role[0] == "b"
        ]
        if barriers:
            # The barrier semaphore persists across calls: it must be back to zero
            # once every call is over.
            for buf in barriers:
                m.leave_scope(buf.owner, [buf], self._describe_barrier, "finished its last call")
        seen: set[int] = set()
        for buf in self.futures:
            if buf.ident not in seen:
                seen.add(buf.ident)
                m.leave_scope(buf.owner, [buf], self._describe_future, "finished")
        err = m.leftover_error()
        if err is not None:
            raise err


def engine_of(ctx: Ctx) -> Engine:
    """The engine that runs ``ctx``'s participant.

    The program layer knows the run only as a ``context.World`` (what its own ops read);
    the walk's rules need the rest of the engine (buffers, counterparts, barriers), and
    every ``Ctx`` of a walk is built by an :class:`Engine` (``Engine.core_ctx``,
    ``face.api``): so this is a narrowing, not a conversion."""
    return cast(Engine, ctx.engine)


def operand_origin(name: str, src: Any) -> str:
    """Why the contents of kernel operand ``name`` (fed by ``src``) are not known: the
    operation outside the kernels that computed it from unknown data, the argument of
    the user's function given as a shape, or a kernel's output the verifier could not
    follow; a plain "give it as a concrete array" only where the operand is an argument."""
    if isinstance(src, Unknown) and src is not VECTOR:
        return f"the contents of operand {name}, {src.why}"
    buf = src.buffer if isinstance(src, RefVal) else None
    if buf is not None and buf.origin is not None:
        link = ", " if buf.origin.startswith("the value computed") else ", from "
        return f"the contents of operand {name}{link}{buf.origin}"
    if buf is not None and buf.values is None and not buf.name.startswith("argument "):
        return (
            f"the contents of operand {name}, {buf.name} (written where the verifier does "
            f"not follow contents: a buffer over {LIMIT} elements, or a copy "
            "from one)"
        )
    return (
        f"the contents of operand {name}, computed by the program from data the verifier "
        "does not have (give the function's arguments as concrete arrays)"
    )
