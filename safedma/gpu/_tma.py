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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast, overload

import jax

from safedma.gpu import _jax_seam as seam
from safedma.gpu._errors import (
    BarrierPhaseError,
    BufferBusyError,
    HandleWaitedTwiceError,
    MissingCommitError,
)
from safedma.gpu._refs import BarrierRef, GmemRef, SmemRef
from safedma.gpu._site import user_line

__all__ = [
    "Barrier",
    "Barriers",
    "LoadHandle",
    "SmemArray",
    "SmemBuffer",
    "StoreHandle",
    "Tma",
    "WrittenSmem",
    "commit_smem",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
]


class Tma:
    """The typed layer's state for one kernel body: create one at the top of the body.

    Its :meth:`smem` and :meth:`barriers` wrap the body's SMEM scratch refs and its
    ``plgpu.Barrier`` ref; the copies made through them share one count of the stores
    in flight (``wait_smem_to_gmem`` counts every store of the thread) and one record of
    uncommitted SMEM writes (``commit_smem`` covers every write of the thread).
    """

    def __init__(self) -> None:
        seam.require("safedma.gpu.Tma")
        self._stores: list[StoreHandle] = []
        self._arrays: list[SmemArray] = []

    def smem(self, ref: SmemRef, name: str = "smem") -> SmemArray:
        """Wrap a stacked SMEM scratch ref (``plgpu.SMEM((count, *shape), dtype)``):
        ``.at(i)`` is its buffer ``i``. ``name`` is how messages call it."""
        array = SmemArray(self, ref, name)
        self._arrays.append(array)
        return array

    def barriers(self, ref: BarrierRef, name: str = "barriers") -> Barriers:
        """Wrap a ``plgpu.Barrier(num_arrivals=..., num_barriers=...)`` scratch ref;
        its arrivals per phase are read from the ref at trace time."""
        return Barriers(ref, name)

    def wait_all_stores(self, *, read_only: bool = False) -> None:
        """``wait_smem_to_gmem(0)``: every store issued so far is done (``read_only``:
        has finished reading its SMEM)."""
        level = _READ if read_only else _DONE
        seam.wait_smem_to_gmem(0, read_only)
        for store in self._stores:
            store._reach(level)  # pyright: ignore[reportPrivateUsage]  # same module

    def _issue_store(self, store: StoreHandle) -> int:
        self._stores.append(store)
        return len(self._stores) - 1

    def _stores_after(self, seq: int) -> int:
        return len(self._stores) - 1 - seq

    def _committed(self) -> None:
        for array in self._arrays:
            for slot in array._slots:  # pyright: ignore[reportPrivateUsage]  # same module
                slot.written_at = None


@dataclass
class _Slot:
    """What owns one SMEM buffer now."""

    loading: LoadHandle | None = None
    storing: list[StoreHandle] = field(default_factory=lambda: [])
    written_at: str | None = None


class SmemArray:
    """A stacked SMEM scratch ref; :meth:`at` gives one of its buffers."""

    def __init__(self, tma: Tma, ref: SmemRef, name: str) -> None:
        shape = cast("tuple[int, ...]", getattr(ref, "shape", ()))
        if len(shape) < 1:
            raise TypeError(
                f"{name}: safedma.gpu.Tma.smem wraps a stacked SMEM ref "
                f"(plgpu.SMEM((count, ...), dtype)); this one has shape {shape}. "
                f"(at {user_line()})"
            )
        self._tma = tma
        self._ref: Any = ref
        self._name = name
        self._slots = [_Slot() for _ in range(shape[0])]

    @property
    def count(self) -> int:
        """How many buffers the ref stacks."""
        return len(self._slots)

    def at(self, index: int) -> SmemBuffer:
        """Buffer ``index`` (a Python int: its state is tracked at trace time)."""
        _check_index(index, self.count, self._name)
        return SmemBuffer(self, index)

    def _describe(self, index: int) -> str:
        return f"{self._name}[{index}]"


def _check_index(index: object, count: int, name: str) -> None:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(
            f"{name}.at({index!r}) at {user_line()}: the typed GPU layer tracks each buffer's "
            "and barrier's state while the kernel is traced, so it needs a Python int index. "
            "Unroll the loop (for i in range(steps)) or index the raw ref."
        )
    if not 0 <= index < count:
        raise IndexError(f"{name}.at({index}) at {user_line()}: {name} has {count} entries.")


class _View:
    """One buffer of an :class:`SmemArray`, in some state."""

    def __init__(self, array: SmemArray, index: int) -> None:
        self._array = array
        self._index = index

    @property
    def _slot(self) -> _Slot:
        return self._array._slots[self._index]  # pyright: ignore[reportPrivateUsage]

    @property
    def _name(self) -> str:
        return self._array._describe(self._index)  # pyright: ignore[reportPrivateUsage]

    @property
    def _ref(self) -> Any:
        return self._array._ref  # pyright: ignore[reportPrivateUsage]

    def _check_not_loading(self, doing: str) -> None:
        load = self._slot.loading
        if load is not None:
            raise BufferBusyError(
                f"{doing} {self._name} at {user_line()}, but the TMA load into it started at "
                f"{load.started_at} may still be landing: nothing orders this access after its "
                "bytes. Wait the load's handle (buffer = handle.wait()) and use the buffer "
                "that wait() returns."
            )

    def _check_not_stored(self, doing: str) -> None:
        store = next(iter(self._slot.storing), None)
        if store is not None:
            raise BufferBusyError(
                f"{doing} {self._name} at {user_line()}, but the TMA store from it started at "
                f"{store.started_at} may still be reading it, so the store could write the new "
                "bytes to GMEM. Wait the store's handle first (buffer = "
                "store.wait(read_only=True)) and write the buffer that wait() returns."
            )

    def read(self) -> jax.Array:
        """The buffer's value (``ref[i]``)."""
        self._check_not_loading("read of")
        return cast("jax.Array", seam.read(self._ref, self._index))

    def write(self, value: jax.Array) -> WrittenSmem:
        """Store ``value`` into the buffer (``ref[i] = value``); a TMA store may read it
        only after :func:`commit_smem`."""
        self._check_not_loading("write to")
        self._check_not_stored("write to")
        seam.write(self._ref, self._index, value)
        self._slot.written_at = user_line()
        return WrittenSmem(self._array, self._index)


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
    if not written:
        raise TypeError(f"commit_smem() at {user_line()}: pass the written buffers it commits.")
    seam.commit_smem()
    tma = written[0]._array._tma  # pyright: ignore[reportPrivateUsage]  # same module
    tma._committed()  # pyright: ignore[reportPrivateUsage]  # same module
    out = tuple(SmemBuffer(w._array, w._index) for w in written)  # pyright: ignore[reportPrivateUsage]
    return out[0] if len(out) == 1 else out


class Barriers:
    """A ``plgpu.Barrier`` scratch ref: :meth:`at` gives one barrier."""

    def __init__(self, ref: BarrierRef, name: str) -> None:
        arrivals = seam.num_arrivals(ref)
        if arrivals is None:
            raise TypeError(
                f"{name} at {user_line()}: safedma.gpu.Tma.barriers wraps a "
                "plgpu.Barrier(num_arrivals=..., num_barriers=...) scratch ref; this ref "
                "is not one."
            )
        shape = cast("tuple[int, ...]", getattr(ref, "shape", ()))
        self._ref: Any = ref
        self._name = name
        self.num_arrivals: int = arrivals
        """Arrivals that complete one phase of each barrier, known at trace time."""
        self._barriers = [Barrier(self, i) for i in range(shape[0] if shape else 1)]

    @property
    def count(self) -> int:
        """How many barriers the ref holds."""
        return len(self._barriers)

    def at(self, index: int) -> Barrier:
        """Barrier ``index`` (a Python int: its phase is tracked at trace time)."""
        _check_index(index, self.count, self._name)
        return self._barriers[index]


class Barrier:
    """One barrier: its phase and the arrivals issued toward it, tracked at trace time
    (the hardware keeps the phase bit; this tracks the same count to check the waits)."""

    def __init__(self, group: Barriers, index: int) -> None:
        self._group = group
        self._index = index
        self.phase: int = 0
        """Phases this thread has waited so far."""
        self._arrivals: list[str] = []

    @property
    def num_arrivals(self) -> int:
        """Arrivals that complete one phase."""
        return self._group.num_arrivals

    @property
    def name(self) -> str:
        """How messages call this barrier: ``bars[1]``."""
        return f"{self._group._name}[{self._index}]"  # pyright: ignore[reportPrivateUsage]

    @property
    def _ref(self) -> object:
        return seam.view(self._group._ref, self._index)  # pyright: ignore[reportPrivateUsage]

    def _add_arrival(self, what: str) -> None:
        here = user_line()
        if len(self._arrivals) >= self.num_arrivals:
            raise BarrierPhaseError(
                f"{what} at {here} arrives on {self.name}, whose phase {self.phase} already got "
                f"its {self.num_arrivals} arrival(s) ({', '.join(self._arrivals)}) and has not "
                "been waited: this arrival counts toward the next phase, which can then "
                "complete before the thread waits, and the wait hangs (the phase bit has "
                "come round). Wait the earlier load's handle before this copy, or create the "
                "barrier with more arrivals per phase."
            )
        self._arrivals.append(here)

    def arrive(self) -> None:
        """``plgpu.barrier_arrive``: one arrival from this thread."""
        self._add_arrival("barrier_arrive")
        seam.barrier_arrive(self._ref)


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
        name = self._buffer._name  # pyright: ignore[reportPrivateUsage]  # same module
        if self._waited_at is not None:
            raise HandleWaitedTwiceError(
                f"the handle of the TMA load into {name} (started at {self._line}) was waited "
                f"at {self._waited_at} and again at {here}: a second barrier_wait on "
                f"{barrier.name} waits for a phase no copy completes, so the kernel hangs. "
                "Delete the second wait and keep using the buffer the first wait() returned."
            )
        if barrier.phase == self._phase:
            arrived = len(barrier._arrivals)  # pyright: ignore[reportPrivateUsage]
            if arrived < barrier.num_arrivals:
                raise BarrierPhaseError(
                    f"wait() at {here} on the load into {name} waits for phase {self._phase} "
                    f"of {barrier.name}, which needs {barrier.num_arrivals} arrivals, but only "
                    f"{arrived} were issued: the barrier_wait hangs. Issue the missing copies "
                    "(or barrier.arrive()) on this barrier before the wait, or create the "
                    f"barrier with num_arrivals={arrived}."
                )
            seam.barrier_wait(barrier._ref)  # pyright: ignore[reportPrivateUsage]
            barrier.phase += 1
            barrier._arrivals = []  # pyright: ignore[reportPrivateUsage]  # same module
        self._waited_at = here
        slot = self._buffer._slot  # pyright: ignore[reportPrivateUsage]  # same module
        if slot.loading is self:
            slot.loading = None
        return SmemBuffer(self._buffer._array, self._buffer._index)  # pyright: ignore[reportPrivateUsage]


def copy_gmem_to_smem(src: GmemRef, dst: SmemBuffer, barrier: Barrier) -> LoadHandle:
    """``plgpu.copy_gmem_to_smem(src, dst, barrier)``: a TMA load of the GMEM ref ``src``
    into ``dst``, arriving on ``barrier``. The returned handle owns ``dst``; its
    ``wait()`` gives the buffer back."""
    here = user_line()
    dst._check_not_loading("a TMA load into")  # pyright: ignore[reportPrivateUsage]
    dst._check_not_stored("a TMA load into")  # pyright: ignore[reportPrivateUsage]
    barrier._add_arrival(f"the TMA load into {dst._name}")  # pyright: ignore[reportPrivateUsage]
    seam.copy_gmem_to_smem(src, seam.view(dst._ref, dst._index), barrier._ref)  # pyright: ignore[reportPrivateUsage]
    handle = LoadHandle(dst, barrier, here)
    dst._slot.loading = handle  # pyright: ignore[reportPrivateUsage]
    return handle


_READ = 1
_DONE = 2


class StoreHandle:
    """A TMA store in flight: it reads its SMEM buffer until waited; :meth:`wait` gives
    the buffer back, writable."""

    def __init__(self, buffer: SmemBuffer, line: str) -> None:
        self._buffer = buffer
        self._line = line
        self._tma = buffer._array._tma  # pyright: ignore[reportPrivateUsage]  # same module
        self._seq = self._tma._issue_store(self)  # pyright: ignore[reportPrivateUsage]
        self._level = 0
        self._waited: dict[int, str] = {}

    @property
    def started_at(self) -> str:
        """The user's line that started the store."""
        return self._line

    def _reach(self, level: int) -> None:
        if level > self._level:
            self._level = level
        slot = self._buffer._slot  # pyright: ignore[reportPrivateUsage]  # same module
        if self in slot.storing:
            slot.storing.remove(self)

    def wait(self, *, read_only: bool = False) -> SmemBuffer:
        """``plgpu.wait_smem_to_gmem(n)``, ``n`` the stores issued after this one: this
        store (and every older one) is done; ``read_only``: has finished reading its
        SMEM (``wait_read_only=True``), enough to overwrite the buffer. Returns it.

        A store an later wait already covered emits nothing.
        """
        here = user_line()
        level = _READ if read_only else _DONE
        earlier = next((at for lv, at in self._waited.items() if lv >= level), None)
        if earlier is not None:
            name = self._buffer._name  # pyright: ignore[reportPrivateUsage]  # same module
            raise HandleWaitedTwiceError(
                f"the handle of the TMA store from {name} (started at {self._line}) was "
                f"waited at {earlier} and again at {here}. Delete the second wait and keep "
                "using the buffer the first wait() returned."
            )
        if self._level < level:
            seam.wait_smem_to_gmem(self._tma._stores_after(self._seq), read_only)  # pyright: ignore[reportPrivateUsage]
            for older in self._tma._stores[: self._seq + 1]:  # pyright: ignore[reportPrivateUsage]
                older._reach(level)
        self._waited[level] = here
        return SmemBuffer(self._buffer._array, self._buffer._index)  # pyright: ignore[reportPrivateUsage]


def copy_smem_to_gmem(src: SmemBuffer, dst: GmemRef) -> StoreHandle:
    """``plgpu.copy_smem_to_gmem(src, dst)``: a TMA store of ``src`` into the GMEM ref
    ``dst``, committed as its own group. ``src`` must be committed (a
    :class:`WrittenSmem` is refused by the type checker, and at trace time)."""
    here = user_line()
    src._check_not_loading("a TMA store from")  # pyright: ignore[reportPrivateUsage]
    written = src._slot.written_at  # pyright: ignore[reportPrivateUsage]
    if written is not None:
        raise MissingCommitError(
            f"the TMA store from {src._name} at {here} reads SMEM the kernel wrote at "  # pyright: ignore[reportPrivateUsage]
            f"{written} without commit_smem: the TMA does not see the thread's writes until "
            "they are committed and may store stale bytes. Commit first: "
            "buffer = safedma.gpu.commit_smem(written), then store that buffer."
        )
    seam.copy_smem_to_gmem(seam.view(src._ref, src._index), dst)  # pyright: ignore[reportPrivateUsage]
    handle = StoreHandle(src, here)
    src._slot.storing.append(handle)  # pyright: ignore[reportPrivateUsage]
    return handle
