# pyright: reportPrivateUsage=false
# (the classes of this module read each other's state; none of it is public)
"""TMA copies, SMEM buffers and barriers whose states are tracked at trace time.

The model is the stm32 HAL DMA ``Transfer``: a copy takes its SMEM buffer and its
handle gives it back when waited. A load's handle is bound to the buffer it fills and
to the barrier its bytes arrive on; ``wait()`` emits the ``barrier_wait`` and returns
the buffer, readable. A buffer the kernel wrote is a :class:`WrittenSmem`, which a store
does not take: :func:`commit_smem` turns it back into an :class:`SmemBuffer`. A store's
handle is waited by name: the ``n`` of ``wait_smem_to_gmem(n)`` is the number of stores
issued after it, counted here.

Every state lives in Python while the kernel is traced (one :class:`Tma` per kernel
body), so each call emits exactly the plgpu call a hand-written kernel makes and
nothing else, and a mistake the types cannot see (a buffer read through an older
variable while a load owns it, a handle waited twice) raises at the user's line.
plgpu calls the body and gives nothing back when it returns, so the body's end is the
end of its ``with gpu.Tma() as tma:`` block: a handle still in flight there was dropped.

In a :meth:`Tma.fori_loop` body, as in CUTLASS's ``PipelineTmaAsync``, buffers and
barriers are named relative to the loop counter (``step.slot(k)`` is buffer
``(i + k) % count``), so one traced iteration stands for all of them: the handles the
body returns must be those it received, one step on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar, cast, overload

import jax

from safedma.gpu import _jax_seam as seam
from safedma.gpu._errors import (
    BarrierPhaseError,
    BufferBusyError,
    HandleDroppedError,
    HandleWaitedTwiceError,
    LoopCarryError,
    MissingCommitError,
)
from safedma.gpu._refs import BarrierRef, GmemRef, SmemRef
from safedma.gpu._site import user_line

__all__ = [
    "Barrier",
    "Barriers",
    "LoadHandle",
    "Slot",
    "SmemArray",
    "SmemBuffer",
    "Step",
    "StoreHandle",
    "Tma",
    "WrittenSmem",
    "commit_smem",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
]

_READ = 1
_DONE = 2

Carry = TypeVar("Carry", bound="tuple[LoadHandle | StoreHandle, ...]")


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _require_buffer(value: object, call: str, parameter: str, here: str) -> None:
    """A value where one of this layer's SMEM buffers belongs is refused by name (the
    type checker says so too; unchecked code gets this at trace time)."""
    if not isinstance(value, _View):
        raise TypeError(
            f"{call}() at {here}: {parameter} is {_shown(value)}, not an SMEM buffer of "
            "safedma.gpu. Pass a buffer from tma.smem(ref, name).at(i) (in a "
            "Tma.fori_loop step, step.slot(k)), or the buffer a handle's wait() gave back."
        )


def _require_barrier(value: object, call: str, here: str) -> None:
    if not isinstance(value, Barrier):
        raise TypeError(
            f"{call}() at {here}: barrier is {_shown(value)}, not a barrier of "
            "safedma.gpu. Pass tma.barriers(ref, name).at(i) for a "
            "plgpu.Barrier(num_arrivals=..., num_barriers=...) scratch ref."
        )


class Tma:
    """The typed layer's state for one kernel body: write the body under
    ``with gpu.Tma() as tma:``.

    Its :meth:`smem` and :meth:`barriers` wrap the body's SMEM scratch refs and its
    ``plgpu.Barrier`` ref; the copies made through them share one count of the stores
    in flight (``wait_smem_to_gmem`` counts every store of the thread) and one record of
    uncommitted SMEM writes (``commit_smem`` covers every write of the thread). The end
    of the ``with`` block is the end of the body, where no handle may be in flight
    (:class:`~safedma.gpu.HandleDroppedError`); copies are made only inside it.
    """

    def __init__(self) -> None:
        seam.require("safedma.gpu.Tma")
        self._arrays: list[SmemArray] = []
        self._groups: list[Barriers] = []
        self._stores: list[StoreHandle] = []
        self._issued = 0
        self._step: Step | None = None
        self._open: bool | None = None  # None: not entered yet; False: its block ended

    def __enter__(self) -> Tma:
        if self._open is not None:
            raise TypeError(
                f"with Tma at {user_line()}: this Tma was opened before; a Tma stands for "
                "one kernel body, so open a new one (with gpu.Tma() as tma:)."
            )
        self._open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """The body ends: unless it is raising already, every handle must be waited."""
        self._open = False
        if exc_type is None:
            self._check_nothing_dropped(user_line())

    def _check_nothing_dropped(self, here: str) -> None:
        dropped: list[str] = []
        for array in self._arrays:
            for slot in array._slots:
                load = slot.loading
                # A load whose phase another handle's wait observed has landed.
                if load is not None and load._barrier._state.phase == load._phase:
                    dropped.append(
                        f"the TMA load into {load._buffer._name} started at "
                        f"{load.started_at}, which may still be writing it"
                    )
        for store in self._stores:
            if store._level < _READ:  # reads done is enough: its GMEM writes outlive the kernel
                dropped.append(
                    f"the TMA store from {store._buffer._name} started at "
                    f"{store.started_at}, which may still be reading it"
                )
        if dropped:
            lines = "".join(f"\n  - {d}" for d in dropped)
            raise HandleDroppedError(
                f"the kernel body's with gpu.Tma() block at {here} ends with "
                f"{len(dropped)} copy handle(s) never waited:{lines}\nA copy still in "
                "flight when the kernel exits touches SMEM that is no longer the kernel's. "
                "Wait each handle before the body ends (buffer = load.wait(); "
                "store.wait(read_only=True), or tma.wait_all_stores() for every store), "
                "or carry it through Tma.fori_loop and wait the handle the loop returns."
            )

    def _require_open(self, call: str, here: str) -> None:
        if self._open is not True:
            state = "closed: its with block has ended" if self._open is False else "never opened"
            raise TypeError(
                f"{call}() at {here}: the buffer's Tma is {state}. Write the kernel "
                "body under `with gpu.Tma() as tma:` and make its copies inside the block: "
                "its end is where the layer checks that every copy's handle was waited."
            )

    def smem(self, ref: SmemRef, name: str = "smem") -> SmemArray:
        """Wrap a stacked SMEM scratch ref (``plgpu.SMEM((count, *shape), dtype)``):
        ``.at(i)`` is its buffer ``i``. ``name`` is how messages call it."""
        self._not_in_loop("Tma.smem")
        array = SmemArray(self, ref, name)
        self._arrays.append(array)
        return array

    def barriers(self, ref: BarrierRef, name: str = "barriers") -> Barriers:
        """Wrap a ``plgpu.Barrier(num_arrivals=..., num_barriers=...)`` scratch ref;
        its arrivals per phase are read from the ref at trace time."""
        self._not_in_loop("Tma.barriers")
        group = Barriers(self, ref, name)
        self._groups.append(group)
        return group

    def wait_all_stores(self, *, read_only: bool = False) -> None:
        """``wait_smem_to_gmem(0)``: every store issued so far is done (``read_only``:
        has finished reading its SMEM)."""
        level = _READ if read_only else _DONE
        seam.wait_smem_to_gmem(0, read_only)
        for store in self._stores:
            store._reach(level)

    def fori_loop(
        self, lower: int, upper: int, body: Callable[[Step, Carry], Carry], carry: Carry
    ) -> Carry:
        """``jax.lax.fori_loop(lower, upper, ...)`` over ``body(step, carry)``, carrying
        handles.

        ``carry`` is a tuple of the load and store handles in flight when the loop
        starts; ``body`` receives them as seen from step ``i`` and returns the handles
        in flight at its end, which must be the same ones seen from step ``i + 1``
        (same kinds, buffers and barriers ``step.slot(k)`` one further back, same
        stores after each). In the body, index buffers and barriers with
        ``step.slot(k)``; ``step.index`` is the loop counter. The bounds are Python
        ints (the states after the loop are computed from them). Returns the handles
        in flight after the loop, with their buffers' indices as ints. The jax carry
        is ``None``: the loop is the one a hand-written kernel runs.
        """
        here = user_line()
        if self._step is not None:
            raise LoopCarryError(f"Tma.fori_loop at {here}: loops of loops are not supported.")
        if not (_is_int(lower) and _is_int(upper)) or upper <= lower:
            raise LoopCarryError(
                f"Tma.fori_loop at {here}: the bounds must be Python ints with "
                f"upper > lower (got {lower!r}, {upper!r}); the states after the loop are "
                "computed from them."
            )
        frame = _LoopFrame(self, lower, upper, carry, here)
        out: list[tuple[LoadHandle | StoreHandle, ...]] = []

        def run(i: Any, none: None) -> None:
            if out:  # jax traces a fori_loop body once; run eagerly (disable_jit), it is not
                raise LoopCarryError(
                    f"Tma.fori_loop at {here}: its body ran a second time; the typed layer "
                    "checks one traced step, so it needs the loop traced (not under "
                    "jax.disable_jit)."
                )
            step = Step(self, i)
            inside = frame.enter(step)
            returned = body(step, cast("Carry", inside))
            out.append(frame.leave(returned))
            return none

        seam.fori_loop(lower, upper, run)
        return cast("Carry", out[0])

    def _not_in_loop(self, what: str) -> None:
        if self._step is not None:
            raise LoopCarryError(
                f"{what} at {user_line()}: wrap the kernel's refs before Tma.fori_loop, "
                "not in its body."
            )

    def _index(self, index: int | Slot, count: int, name: str) -> _Index:
        if isinstance(index, Slot):
            step = self._step
            if step is None or index._step is not step:
                raise TypeError(
                    f"{name}.at({index}) at {user_line()}: this slot belongs to a loop "
                    "that is not running here; use step.slot(k) of the loop you are in."
                )
            key = index._ahead % count
            return _Index(key, step._value(index._ahead, count), f"{index}")
        if not _is_int(index):
            raise TypeError(
                f"{name}.at({index!r}) at {user_line()}: the typed GPU layer tracks each "
                "buffer's and barrier's state while the kernel is traced, so it needs a "
                "Python int index, or step.slot(k) in a Tma.fori_loop body. Unroll the "
                "loop, or loop with Tma.fori_loop."
            )
        if not 0 <= index < count:
            raise IndexError(f"{name}.at({index}) at {user_line()}: {name} has {count} entries.")
        if self._step is not None and count > 1:
            raise TypeError(
                f"{name}.at({index}) at {user_line()}: in a Tma.fori_loop body, name "
                f"buffers and barriers by step.slot(k) (buffer (i + k) % {count}), so that "
                "one traced step stands for every step."
            )
        return _Index(index, index, str(index))

    def _issue_store(self, store: StoreHandle) -> int:
        self._stores.append(store)
        self._issued += 1
        return self._issued - 1

    def _committed(self) -> None:
        for array in self._arrays:
            for slot in array._slots:
                slot.written_at = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Step:
    """One step of a :meth:`Tma.fori_loop`: ``index`` is the loop counter ``i``;
    ``slot(k)`` names buffer and barrier ``(i + k) % count``."""

    def __init__(self, tma: Tma, index: jax.Array) -> None:
        self._tma = tma
        self.index: jax.Array = index
        """The loop counter (traced)."""
        self._values: dict[tuple[int, int], object] = {}

    def slot(self, ahead: int = 0) -> Slot:
        """Buffer or barrier ``(i + ahead) % count`` of whatever ``.at()`` it is given."""
        if not _is_int(ahead):
            raise TypeError(f"step.slot({ahead!r}) at {user_line()}: ahead is a Python int.")
        return Slot(self, ahead)

    def _value(self, ahead: int, count: int) -> object:
        # Computed once per step, where first used: ``i % count`` or ``(i + k) % count``.
        key = (ahead, count)
        if key not in self._values:
            i = self.index
            self._values[key] = i % count if ahead == 0 else (i + ahead) % count
        return self._values[key]


class Slot:
    """A buffer or barrier index relative to the loop counter: ``(i + ahead) % count``."""

    def __init__(self, step: Step, ahead: int) -> None:
        self._step = step
        self._ahead = ahead

    def __str__(self) -> str:
        return "i" if self._ahead == 0 else f"i{self._ahead:+d}"


@dataclass(frozen=True)
class _Index:
    key: int  # which state: the buffer's index, or (i + k) % count's k
    value: object  # what the plgpu call gets: an int, or the traced (i + k) % count
    text: str


@dataclass
class _Slot:
    """What owns one SMEM buffer now."""

    loading: LoadHandle | None = None
    storing: list[StoreHandle] = field(default_factory=list["StoreHandle"])
    written_at: str | None = None


class SmemArray:
    """A stacked SMEM scratch ref; :meth:`at` gives one of its buffers."""

    def __init__(self, tma: Tma, ref: SmemRef, name: str) -> None:
        if not isinstance(cast(object, name), str):  # unchecked callers pass anything
            raise TypeError(
                f"Tma.smem() at {user_line()}: name is {_shown(name)}; give the buffers' "
                "name as a string (messages call them by it), e.g. tma.smem(ref, 'x_smem')."
            )
        shape = cast("tuple[int, ...]", getattr(ref, "shape", ()))
        if len(shape) < 1:
            raise TypeError(
                f"{name} at {user_line()}: safedma.gpu.Tma.smem wraps a stacked SMEM ref "
                f"(plgpu.SMEM((count, ...), dtype)); this ref is {_shown(ref)}, of shape "
                f"{shape}."
            )
        self._tma = tma
        self._ref: Any = ref
        self._name = name
        self._slots = [_Slot() for _ in range(shape[0])]

    @property
    def count(self) -> int:
        """How many buffers the ref stacks."""
        return len(self._slots)

    def at(self, index: int | Slot) -> SmemBuffer:
        """Buffer ``index``: a Python int, or ``step.slot(k)`` in a loop body."""
        return SmemBuffer(self, self._tma._index(index, self.count, self._name))


class _View:
    """One buffer of an :class:`SmemArray`, in some state."""

    def __init__(self, array: SmemArray, index: _Index) -> None:
        self._array = array
        self._at = index
        self._step = array._tma._step

    @property
    def _slot(self) -> _Slot:
        if self._array._tma._step is not self._step:
            raise LoopCarryError(
                f"{self._name} used at {user_line()} was taken outside the loop step it is "
                "used in: pass the handle that owns it in the loop's carry, or take the "
                "buffer again in the body with .at(step.slot(k))."
            )
        return self._array._slots[self._at.key]

    @property
    def _name(self) -> str:
        return f"{self._array._name}[{self._at.text}]"

    def _view(self) -> object:
        return seam.view(self._array._ref, self._at.value)

    def _check_not_loading(self, doing: str) -> None:
        load = self._slot.loading
        if load is not None:
            raise BufferBusyError(
                f"{doing} {self._name} at {user_line()}, but the TMA load into it started at "
                f"{load.started_at} may still be landing: nothing orders this access after "
                "its bytes. Wait the load's handle (buffer = handle.wait()) and use the "
                "buffer that wait() returns."
            )

    def _check_not_stored(self, doing: str) -> None:
        store = next(iter(self._slot.storing), None)
        if store is not None:
            raise BufferBusyError(
                f"{doing} {self._name} at {user_line()}, but the TMA store from it started at "
                f"{store.started_at} may still be reading it, so the store could write the "
                "new bytes to GMEM. Wait the store's handle first (buffer = "
                "store.wait(read_only=True)) and write the buffer that wait() returns."
            )

    def read(self) -> jax.Array:
        """The buffer's value (``ref[i]``)."""
        self._check_not_loading("read of")
        return cast("jax.Array", seam.read(self._array._ref, self._at.value))

    def write(self, value: jax.Array) -> WrittenSmem:
        """Store ``value`` into the buffer (``ref[i] = value``); a TMA store may read it
        only after :func:`commit_smem`."""
        self._check_not_loading("write to")
        self._check_not_stored("write to")
        seam.write(self._array._ref, self._at.value, value)
        self._slot.written_at = user_line()
        return WrittenSmem(self._array, self._at)


class SmemBuffer(_View):
    """An SMEM buffer that no copy owns and whose writes, if any, are committed: it can be
    read, written, loaded into and stored from."""


class WrittenSmem(_View):
    """An SMEM buffer the kernel wrote: a TMA store does not take it until
    :func:`commit_smem` returns it as an :class:`SmemBuffer`."""


@overload
def commit_smem(a: WrittenSmem, /) -> SmemBuffer: ...
@overload
def commit_smem(a: WrittenSmem, b: WrittenSmem, /) -> tuple[SmemBuffer, SmemBuffer]: ...
@overload
def commit_smem(
    a: WrittenSmem, b: WrittenSmem, c: WrittenSmem, /
) -> tuple[SmemBuffer, SmemBuffer, SmemBuffer]: ...
def commit_smem(*written: WrittenSmem) -> SmemBuffer | tuple[SmemBuffer, ...]:
    """``plgpu.commit_smem()``: the kernel's SMEM writes become visible to the TMA.

    One call covers every write of the thread; it returns the buffers given, ready for
    :func:`copy_smem_to_gmem`.
    """
    here = user_line()
    if not written:
        raise TypeError(f"commit_smem() at {here}: pass the written buffers it commits.")
    for k, w in enumerate(written):
        _require_buffer(w, "commit_smem", f"argument {k + 1}", here)
    seam.commit_smem()
    written[0]._array._tma._committed()
    out = tuple(SmemBuffer(w._array, w._at) for w in written)
    return out[0] if len(out) == 1 else out


@dataclass
class _Phase:
    """One barrier's state: phases waited so far, and the arrivals toward the next."""

    phase: int = 0
    arrivals: list[str] = field(default_factory=list[str])


class Barriers:
    """A ``plgpu.Barrier`` scratch ref: :meth:`at` gives one barrier."""

    def __init__(self, tma: Tma, ref: BarrierRef, name: str) -> None:
        if not isinstance(cast(object, name), str):  # unchecked callers pass anything
            raise TypeError(
                f"Tma.barriers() at {user_line()}: name is {_shown(name)}; give the "
                "barriers' name as a string (messages call them by it)."
            )
        arrivals = seam.num_arrivals(ref)
        if arrivals is None:
            raise TypeError(
                f"{name} at {user_line()}: safedma.gpu.Tma.barriers wraps a "
                "plgpu.Barrier(num_arrivals=..., num_barriers=...) scratch ref; this ref "
                f"is {_shown(ref)}, not one."
            )
        shape = cast("tuple[int, ...]", getattr(ref, "shape", ()))
        self._tma = tma
        self._ref: Any = ref
        self._name = name
        self.num_arrivals: int = arrivals
        """Arrivals that complete one phase of each barrier, known at trace time."""
        self._states = [_Phase() for _ in range(shape[0] if shape else 1)]

    @property
    def count(self) -> int:
        """How many barriers the ref holds."""
        return len(self._states)

    def at(self, index: int | Slot) -> Barrier:
        """Barrier ``index``: a Python int, or ``step.slot(k)`` in a loop body."""
        return Barrier(self, self._tma._index(index, self.count, self._name))


class Barrier:
    """One barrier: its phase and the arrivals issued toward it, tracked at trace time
    (the hardware keeps the phase bit; this tracks the same count to check the waits)."""

    def __init__(self, group: Barriers, index: _Index) -> None:
        self._group = group
        self._at = index

    @property
    def _state(self) -> _Phase:
        return self._group._states[self._at.key]

    @property
    def phase(self) -> int:
        """Phases of this barrier this thread has waited so far (in a loop body: since
        the step began)."""
        return self._state.phase

    @property
    def num_arrivals(self) -> int:
        """Arrivals that complete one phase."""
        return self._group.num_arrivals

    @property
    def name(self) -> str:
        """How messages call this barrier: ``bars[1]``."""
        return f"{self._group._name}[{self._at.text}]"

    def _view(self) -> object:
        return seam.view(self._group._ref, self._at.value)

    def _add_arrival(self, what: str) -> None:
        here = user_line()
        state = self._state
        if len(state.arrivals) >= self.num_arrivals:
            raise BarrierPhaseError(
                f"{what} at {here} arrives on {self.name}, whose phase already got its "
                f"{self.num_arrivals} arrival(s) ({', '.join(state.arrivals)}) and has not "
                "been waited: this arrival counts toward the next phase, which can then "
                "complete before the thread waits, and the wait hangs (the phase bit has "
                "come round). Wait the earlier load's handle before this copy, or create the "
                "barrier with more arrivals per phase."
            )
        state.arrivals.append(here)

    def arrive(self) -> None:
        """``plgpu.barrier_arrive``: one arrival from this thread."""
        self._add_arrival("barrier_arrive")
        seam.barrier_arrive(self._view())


class LoadHandle:
    """A TMA load in flight: it owns its SMEM buffer until :meth:`wait` gives it back.

    It has no ``read``: the buffer is readable only through what ``wait()`` returns.
    """

    def __init__(self, buffer: SmemBuffer, barrier: Barrier, line: str) -> None:
        self._buffer = buffer
        self._barrier = barrier
        self._phase = barrier.phase
        self._line = line
        self._waited_at: str | None = None

    @property
    def started_at(self) -> str:
        """The user's line that started the load."""
        return self._line

    def wait(self) -> SmemBuffer:
        """``plgpu.barrier_wait`` on the load's barrier; returns the filled buffer.

        When another load on the same barrier phase was waited already, the phase is
        observed and nothing is emitted.
        """
        here = user_line()
        barrier = self._barrier
        name = self._buffer._name
        if self._waited_at is not None:
            raise HandleWaitedTwiceError(
                f"the handle of the TMA load into {name} (started at {self._line}) was waited "
                f"at {self._waited_at} and again at {here}: a second barrier_wait on "
                f"{barrier.name} waits for a phase no copy completes, so the kernel hangs. "
                "Delete the second wait and keep using the buffer the first wait() returned."
            )
        slot = self._buffer._slot
        state = barrier._state
        if state.phase == self._phase:
            arrived = len(state.arrivals)
            if arrived < barrier.num_arrivals:
                raise BarrierPhaseError(
                    f"wait() at {here} on the load into {name} waits for the phase of "
                    f"{barrier.name} that needs {barrier.num_arrivals} arrivals, but only "
                    f"{arrived} were issued: the barrier_wait hangs. Issue the missing copies "
                    "(or barrier.arrive()) on this barrier before the wait, or create the "
                    f"barrier with num_arrivals={arrived}."
                )
            seam.barrier_wait(barrier._view())
            state.phase += 1
            state.arrivals = []
        self._waited_at = here
        if slot.loading is self:
            slot.loading = None
        return SmemBuffer(self._buffer._array, self._buffer._at)


def copy_gmem_to_smem(src: GmemRef, dst: SmemBuffer, barrier: Barrier) -> LoadHandle:
    """``plgpu.copy_gmem_to_smem(src, dst, barrier)``: a TMA load of the GMEM ref ``src``
    into ``dst``, arriving on ``barrier``. The returned handle owns ``dst``; its
    ``wait()`` gives the buffer back."""
    here = user_line()
    _require_buffer(dst, "copy_gmem_to_smem", "dst", here)
    _require_barrier(barrier, "copy_gmem_to_smem", here)
    dst._array._tma._require_open("copy_gmem_to_smem", here)
    dst._check_not_loading("a TMA load into")
    dst._check_not_stored("a TMA load into")
    barrier._add_arrival(f"the TMA load into {dst._name}")
    seam.copy_gmem_to_smem(src, dst._view(), barrier._view())
    handle = LoadHandle(dst, barrier, here)
    dst._slot.loading = handle
    return handle


class StoreHandle:
    """A TMA store in flight: it reads its SMEM buffer until waited; :meth:`wait` gives
    the buffer back, writable."""

    def __init__(self, buffer: SmemBuffer, line: str, *, seq: int | None = None) -> None:
        self._buffer = buffer
        self._line = line
        self._tma = buffer._array._tma
        self._seq = self._tma._issue_store(self) if seq is None else seq
        self._level = 0
        self._waited: dict[int, str] = {}

    @property
    def started_at(self) -> str:
        """The user's line that started the store."""
        return self._line

    def _reach(self, level: int) -> None:
        if level > self._level:
            self._level = level
        if level >= _READ:
            storing = self._buffer._array._slots[self._buffer._at.key].storing
            if self in storing:
                storing.remove(self)

    def wait(self, *, read_only: bool = False) -> SmemBuffer:
        """``plgpu.wait_smem_to_gmem(n)``, ``n`` the stores issued after this one: this
        store (and every older one) is done; ``read_only``: has finished reading its
        SMEM (``wait_read_only=True``), enough to overwrite the buffer. Returns it.

        A store that a wait of a later one already covered emits nothing.
        """
        here = user_line()
        level = _READ if read_only else _DONE
        _ = self._buffer._slot  # a store from another loop step is refused here
        earlier = next((at for lv, at in self._waited.items() if lv >= level), None)
        if earlier is not None:
            raise HandleWaitedTwiceError(
                f"the handle of the TMA store from {self._buffer._name} (started at "
                f"{self._line}) was waited at {earlier} and again at {here}. Delete the "
                "second wait and keep using the buffer the first wait() returned."
            )
        if self._level < level:
            seam.wait_smem_to_gmem(self._tma._issued - 1 - self._seq, read_only)
            for store in self._tma._stores:
                if store._seq <= self._seq:
                    store._reach(level)
        self._waited[level] = here
        return SmemBuffer(self._buffer._array, self._buffer._at)


def copy_smem_to_gmem(src: SmemBuffer, dst: GmemRef) -> StoreHandle:
    """``plgpu.copy_smem_to_gmem(src, dst)``: a TMA store of ``src`` into the GMEM ref
    ``dst``, committed as its own group. ``src`` must be committed (a
    :class:`WrittenSmem` is refused by the type checker, and at trace time)."""
    here = user_line()
    _require_buffer(src, "copy_smem_to_gmem", "src", here)
    src._array._tma._require_open("copy_smem_to_gmem", here)
    src._check_not_loading("a TMA store from")
    written = src._slot.written_at
    if written is not None:
        raise MissingCommitError(
            f"the TMA store from {src._name} at {here} reads SMEM the kernel wrote at "
            f"{written} without commit_smem: the TMA does not see the thread's writes until "
            "they are committed and may store stale bytes. Commit first: "
            "buffer = safedma.gpu.commit_smem(written), then store that buffer."
        )
    seam.copy_smem_to_gmem(src._view(), dst)
    handle = StoreHandle(src, here)
    src._slot.storing.append(handle)
    return handle


# --- loops -------------------------------------------------------------------------------


def _carried(j: int | None) -> str:
    return "not carried" if j is None else f"carry[{j}]"


class _LoopFrame:
    """The states of one :meth:`Tma.fori_loop`: before it (indices as ints), in its
    traced step (relative to ``i``), and after it."""

    def __init__(
        self,
        tma: Tma,
        lower: int,
        upper: int,
        carry: tuple[LoadHandle | StoreHandle, ...],
        line: str,
    ) -> None:
        self._tma = tma
        self._lower = lower
        self._upper = upper
        self._carry = carry
        self._line = line
        self._entry: list[str] = []
        self._saved_slots: list[list[_Slot]] = []
        self._saved_states: list[list[_Phase]] = []
        self._saved_stores: list[StoreHandle] = []
        self._saved_issued = 0

    def _check_carry(self) -> None:
        carried = set(map(id, self._carry))
        for handle in self._carry:
            if not isinstance(handle, (LoadHandle, StoreHandle)):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise LoopCarryError(
                    f"Tma.fori_loop at {self._line}: the carry holds {type(handle).__name__}; "
                    "it is a tuple of LoadHandle and StoreHandle."
                )
        for array in self._tma._arrays:
            for index, slot in enumerate(array._slots):
                what = f"{array._name}[{index}]"
                if slot.written_at is not None:
                    raise LoopCarryError(
                        f"Tma.fori_loop at {self._line}: {what} was written at "
                        f"{slot.written_at} and not committed; commit_smem before the loop."
                    )
                if slot.loading is not None and id(slot.loading) not in carried:
                    raise LoopCarryError(
                        f"Tma.fori_loop at {self._line}: the TMA load into {what} started at "
                        f"{slot.loading.started_at} is in flight but not in the loop's carry: "
                        "pass its handle, and wait it in the body."
                    )
                for store in slot.storing:
                    if id(store) not in carried:
                        raise LoopCarryError(
                            f"Tma.fori_loop at {self._line}: the TMA store from {what} "
                            f"started at {store.started_at} may still read it and is not in "
                            "the loop's carry: pass its handle, or wait it before the loop."
                        )

    def enter(self, step: Step) -> tuple[LoadHandle | StoreHandle, ...]:
        """Swap in the step's states, relative to ``i``; return the carry as seen there."""
        tma = self._tma
        self._check_carry()
        self._saved_slots = [a._slots for a in tma._arrays]
        self._saved_states = [g._states for g in tma._groups]
        self._saved_stores, self._saved_issued = tma._stores, tma._issued
        for array in tma._arrays:
            old, n = array._slots, array.count
            array._slots = [_Slot() for _ in range(n)]
            for index, slot in enumerate(old):
                array._slots[(index - self._lower) % n].written_at = slot.written_at
        for group in tma._groups:
            old_states, n = group._states, group.count
            group._states = [_Phase() for _ in range(n)]
            for index, state in enumerate(old_states):
                group._states[(index - self._lower) % n].arrivals = list(state.arrivals)
        tma._step = step
        tma._stores, tma._issued = list[StoreHandle](), 0
        inside: list[LoadHandle | StoreHandle] = []
        for handle in self._carry:
            array = handle._buffer._array
            ahead = (handle._buffer._at.key - self._lower) % array.count
            buffer = array.at(step.slot(ahead))
            if isinstance(handle, LoadHandle):
                group = handle._barrier._group
                b_ahead = (handle._barrier._at.key - self._lower) % group.count
                load = LoadHandle(buffer, group.at(step.slot(b_ahead)), handle.started_at)
                buffer._slot.loading = load
                inside.append(load)
            else:
                after = self._saved_issued - 1 - handle._seq
                store = StoreHandle(buffer, handle.started_at, seq=-1 - after)
                tma._stores.append(store)
                buffer._slot.storing.append(store)
                inside.append(store)
        self._entry = self._signature(tuple(inside), 0)
        return tuple(inside)

    def _signature(self, handles: tuple[LoadHandle | StoreHandle, ...], shift: int) -> list[str]:
        """The state relative to the step ``shift`` ahead of the traced one, in words."""
        tma = self._tma
        number = {id(h): j for j, h in enumerate(handles)}
        words: list[str] = []
        for array in tma._arrays:
            n = array.count
            for k in range(n):
                slot = array._slots[(k + shift) % n]
                where = f"{array._name}[{Slot(cast('Step', tma._step), k)}]"
                if slot.loading is not None:
                    load = slot.loading
                    j = number.get(id(load))
                    g = load._barrier._group
                    on = f"{g._name}[{Slot(cast('Step', tma._step), (load._barrier._at.key - shift) % g.count)}]"
                    words.append(f"{where}: loading ({_carried(j)}, on {on})")
                for store in slot.storing:
                    j = number.get(id(store))
                    after = tma._issued - 1 - store._seq
                    words.append(f"{where}: stored from ({_carried(j)}, {after} later stores)")
                if slot.written_at is not None:
                    words.append(f"{where}: written at {slot.written_at}, not committed")
        for group in tma._groups:
            n = group.count
            for k in range(n):
                arrivals = len(group._states[(k + shift) % n].arrivals)
                if arrivals:
                    words.append(
                        f"{group._name}[{Slot(cast('Step', tma._step), k)}]: {arrivals} arrival(s)"
                    )
        for j, handle in enumerate(handles):
            if isinstance(handle, LoadHandle) and handle._waited_at is not None:
                words.append(f"carry[{j}]: a load already waited at {handle._waited_at}")
            if isinstance(handle, StoreHandle) and handle._level >= _READ:
                words.append(f"carry[{j}]: a store already waited")
        return sorted(words)

    def leave(
        self, returned: tuple[LoadHandle | StoreHandle, ...]
    ) -> tuple[LoadHandle | StoreHandle, ...]:
        """Check the step's end against its start, one step on; restore the states after
        the loop, and return the carry as seen there."""
        tma = self._tma
        if not isinstance(returned, tuple):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise LoopCarryError(
                f"Tma.fori_loop at {self._line}: the body returned {type(returned).__name__}; "
                "it returns the tuple of handles in flight at its end."
            )
        leaving = self._signature(returned, 1)
        if leaving != self._entry:
            gone = [w for w in self._entry if w not in leaving]
            new = [w for w in leaving if w not in self._entry]
            raise LoopCarryError(
                f"Tma.fori_loop at {self._line}: the body's end does not match its start one "
                "step on, so the next step would not find what this one found. At the start "
                f"of step i: {'; '.join(self._entry) or 'nothing in flight'}. At the end, seen "
                f"from step i+1: {'; '.join(leaving) or 'nothing in flight'}. Missing: "
                f"{'; '.join(gone) or '-'}; extra: {'; '.join(new) or '-'}. Return the handles "
                "in flight, as many and in the same order as the body receives, each for the "
                "buffer one step further on (step.slot(k + 1) where it received step.slot(k))."
            )
        trips = self._upper - self._lower
        body_issued = tma._issued
        # After the loop: the last step's end, relative to i = upper - 1.
        last = self._upper - 1
        for array, saved in zip(tma._arrays, self._saved_slots, strict=True):
            n = array.count
            inside = array._slots
            array._slots = [_Slot() for _ in saved]
            for k, slot in enumerate(inside):
                array._slots[(last + k) % n].written_at = slot.written_at
        for group, saved_states in zip(tma._groups, self._saved_states, strict=True):
            n = group.count
            inside_states = group._states
            waits = sum(s.phase for s in inside_states)
            group._states = [_Phase(phase=s.phase) for s in saved_states]
            for k, state in enumerate(inside_states):
                outside_state = group._states[(last + k) % n]
                outside_state.arrivals = list(state.arrivals)
                outside_state.phase += (trips * waits) // n
        issued = self._saved_issued + trips * body_issued
        tma._step = None
        tma._stores, tma._issued = list(self._saved_stores), issued
        for store in tma._stores:
            store._reach(_READ)  # checked above: no store before the loop still reads
        for handle in self._carry:  # the loop's first step took these over
            if isinstance(handle, LoadHandle):
                handle._waited_at = f"the loop at {self._line}"
            else:
                handle._waited[_READ] = f"the loop at {self._line}"
        outside: list[LoadHandle | StoreHandle] = []
        for handle in returned:
            array = handle._buffer._array
            index = (last + handle._buffer._at.key) % array.count
            buffer = array.at(index)
            if isinstance(handle, LoadHandle):
                group = handle._barrier._group
                barrier = group.at((last + handle._barrier._at.key) % group.count)
                load = LoadHandle(buffer, barrier, handle.started_at)
                load._phase = barrier.phase
                buffer._slot.loading = load
                outside.append(load)
            else:
                later = body_issued - 1 - handle._seq
                store = StoreHandle(buffer, handle.started_at, seq=issued - 1 - later)
                tma._stores.append(store)
                buffer._slot.storing.append(store)
                outside.append(store)
        return tuple(outside)
