"""Copies and their handles: the typestate of a DMA.

A copy is described first and started second. Describing it checks its refs
(trace time); starting it returns a *handle*, and only a handle can be
waited. A :class:`LocalCopy` has one semaphore and no device. A
:class:`RemoteCopy` also needs a send semaphore and a target device; its type
parameters record whether each has been given, and ``start()`` type-checks
only once both have (``RemoteCopy[Given, Given]``). Builders are immutable:
each step returns a new description, so a half-built copy cannot leak into a
started one.

Waiting for a copy whose start the current code did not see (a copy started
in the previous loop iteration, the receive side of another device's send, or
one aggregate wait for many copies on one semaphore) goes through
``started_elsewhere()`` or ``incoming()``, never through a rebuilt
descriptor.

A wait gives back what it protected, as the stm32 HAL's ``release()`` hands
the buffer back: ``wait()`` and ``wait_recv()`` return the destination (now
safe to read), ``wait_send()`` the source (now safe to overwrite). Reading
the returned ref instead of the one the copy was built from keeps "read only
after the wait" visible in the code.

Copies are frozen dataclasses, checked when built; every handle shares one
base. Everything lowers to ``pltpu.make_async_copy`` /
``make_async_remote_copy`` and the descriptor's ``start`` / ``wait*`` calls,
exactly as written by hand.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Generic, Literal, NoReturn, cast, final

from typing_extensions import TypeVar

from safedma import _compat
from safedma._checks import (
    check_data_ref,
    check_add,
    check_no_add,
    check_priority,
    check_push_stream,
    check_same_layout,
    check_static_sizes,
    check_semaphore,
)
from safedma._compat import AsyncCopyDescriptor, SemaphoreKind
from safedma._describe import describe_ref
from safedma._ledger import HandleState, Side
from safedma._devices import Device
from safedma._errors import DeviceIdError, IncompleteCopyError, WrongOperationError
from safedma._messages import MISSING_OPERATIONS
from safedma._refs import DataRef, SemRef
from safedma._public import publish

__all__ = [
    "Given",
    "Missing",
    "LocalCopy",
    "RemoteCopy",
    "Handle",
    "LocalHandle",
    "RemoteHandle",
    "IncomingHandle",
    "wait_all_into",
]

_DMA = (SemaphoreKind.DMA,)


@final
class Given:
    """Type state: this part of a :class:`RemoteCopy` has been given."""


@final
class Missing:
    """Type state: this part of a :class:`RemoteCopy` has not been given yet."""


SendSemState = TypeVar("SendSemState", default=Missing)
TargetState = TypeVar("TargetState", default=Missing)


def _no_such_operation(obj: object, name: str, hints: Mapping[str, str]) -> NoReturn:
    """Explain, for unchecked code, an operation the type checker would have rejected."""
    kind = type(obj).__name__
    if name in hints:
        raise WrongOperationError(f"{kind} has no {name}(): {hints[name]}")
    raise AttributeError(f"{kind!r} object has no attribute {name!r}")


# The sentences are shared with the mypy plugin (safedma._messages), so both say the same.
_LOCAL_HANDLE_HINTS = MISSING_OPERATIONS["LocalHandle"]
_LOCAL_COPY_HINTS = MISSING_OPERATIONS["LocalCopy"]
_REMOTE_COPY_HINTS = MISSING_OPERATIONS["RemoteCopy"]
_INCOMING_HINTS = MISSING_OPERATIONS["IncomingHandle"]


def _check_copy_refs(src: object, dst: object, what: str) -> None:
    check_data_ref(src, f"{what} source")
    check_data_ref(dst, f"{what} destination")
    # A static size opposite a traced one fails a start on every jax version, a wait only
    # where the wait lowering compares shapes: a descriptor only ever waited (through
    # started_elsewhere() / incoming()) is checked by start() on the others.
    check_same_layout(src, dst, what, sizes=_compat.waits_compare_shapes())


class Handle:
    """A started (or started-elsewhere) copy: the only thing that can be waited.

    Each wait is recorded by the kernel scope (the trace-time checks of T7 and T8)
    and returns the ref it made safe to use.
    """

    __slots__ = ("_descriptor", "_state", "_src", "_dst")
    _HINTS: ClassVar[Mapping[str, str]] = {}

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, self._HINTS)

    def __init__(
        self, descriptor: AsyncCopyDescriptor, state: HandleState, src: DataRef, dst: DataRef
    ) -> None:
        self._descriptor = descriptor
        self._state = state
        self._src = src
        self._dst = dst

    def _waited(
        self, side: Side, wait: Callable[[], object], ready: DataRef, *, call: str | None = None
    ) -> DataRef:
        """Record the wait on ``side`` with the kernel scope, wait, hand back ``ready``.

        ``call``: the public wait the user wrote, when it is not ``side``'s own (a remote
        handle's ``wait()`` waits both sides), so that messages name the call written."""
        self._state.record_wait(side, call=call)
        wait()
        return _give_back(ready, caller_depth=3)


def _give_back(ready: DataRef, caller_depth: int) -> DataRef:
    """The buffer a wait made safe, for its caller; None when jax itself called the wait.

    ``pl.when(c)(handle.wait)`` and ``lax.cond(c, handle.wait, ...)`` hand the
    bound method to jax as a branch, and a branch may not return a ref ("Cannot
    return `Ref`s from `cond`"). When the public wait's caller (``caller_depth``
    frames up from here) is jax's tracing machinery, no user code can read the
    result, so the wait returns nothing, as the raw ``pltpu`` wait does. (A
    lambda that returns the wait's result is the user's code: the kernel scope
    turns jax's error into :class:`~safedma.BranchReturnedRefError` with the fix.)
    """
    caller = sys._getframe(caller_depth)  # pyright: ignore[reportPrivateUsage]  # documented CPython API
    if str(caller.f_globals.get("__name__", "")).startswith("jax."):
        return cast(DataRef, None)
    return ready


@final
class LocalHandle(Handle):
    """A started (or started-elsewhere) local copy; ``wait()`` once."""

    __slots__ = ()
    _HINTS = _LOCAL_HANDLE_HINTS

    def wait(self) -> DataRef:
        """Block until the copy's bytes have landed; return the destination, now readable."""
        return self._waited(Side.LOCAL, self._descriptor.wait, self._dst)


@final
class RemoteHandle(Handle):
    """A started remote copy: ``wait_send()`` on the sending side, ``wait_recv()`` on
    the receiving side, or ``wait()`` for both (the symmetric case, where every
    device sends and receives)."""

    __slots__ = ()

    def wait_send(self) -> DataRef:
        """Block until the source has been read; return the source, now free to overwrite."""
        return self._waited(Side.SEND, self._descriptor.wait_send, self._src)

    def wait_recv(self) -> DataRef:
        """Block until the incoming copy has landed; return this device's destination."""
        return self._waited(Side.RECV, self._descriptor.wait_recv, self._dst)

    def wait(self) -> DataRef:
        """``wait_send()`` then ``wait_recv()``; return the destination, now readable."""
        self._waited(Side.SEND, self._descriptor.wait_send, self._src, call="wait()")
        self._waited(Side.RECV, self._descriptor.wait_recv, self._dst, call="wait()")
        return _give_back(self._dst, caller_depth=2)


@final
class IncomingHandle(Handle):
    """The receive side of a copy another device sends to this one: ``wait_recv()``."""

    __slots__ = ()
    _HINTS = _INCOMING_HINTS

    def wait_recv(self) -> DataRef:
        """Block until the incoming copy has landed; return this device's destination."""
        return self._waited(Side.RECV, self._descriptor.wait_recv, self._dst)


@final
@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class LocalCopy:
    """A copy between two refs on this device, tracked by one DMA semaphore.

    ``LocalCopy(x_hbm.at[pl.ds(i, n)], buf, sem).start()`` returns a
    :class:`LocalHandle`; ``handle.wait()`` blocks until the copy has landed
    and returns ``buf``. The refs are checked when the copy is built.

    ``sem`` is ``None`` only for a SparseCore push stream on jax 0.12 (a copy from
    VMEM to HBM, VMEM_SHARED or SMEM, or from VMEM_SHARED to SMEM), which the hardware
    tracks without a semaphore: jax asks for ``sem=None`` there, and ``wait()`` waits
    for the stream's writes. Anywhere else ``None`` is :class:`MissingSemaphoreError` (T6).
    """

    __slots__ = ("src", "dst", "sem")

    src: DataRef
    dst: DataRef
    sem: SemRef | None

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _LOCAL_COPY_HINTS)

    def __post_init__(self) -> None:
        _check_copy_refs(self.src, self.dst, "LocalCopy")
        if self.sem is None:
            check_push_stream(self.src, self.dst, "LocalCopy semaphore")
        else:
            check_semaphore(self.sem, "LocalCopy semaphore", _DMA, what_for="a local copy")

    def __repr__(self) -> str:
        return self._describe()

    def _describe(self) -> str:
        return f"LocalCopy {describe_ref(self.src)} -> {describe_ref(self.dst)}"

    def _handle(self, descriptor: AsyncCopyDescriptor, *, started_elsewhere: bool) -> LocalHandle:
        state = HandleState(
            self._describe, {Side.LOCAL: self.sem}, started_elsewhere=started_elsewhere
        )
        return LocalHandle(descriptor, state, self.src, self.dst)

    def start(self, *, priority: Literal[0, 1] = 0, add: bool = False) -> LocalHandle:
        """Start the copy; wait for it through the returned handle.

        ``priority=1`` uses the second DMA queue. ``add`` (DMA accumulate) lowers only on
        SparseCore, for a copy with one side indexed by an array of rows (a scatter-add
        or gather-add); anywhere else it is rejected at trace time (T5).
        """
        check_priority(priority, remote=False)
        check_static_sizes(self.src, self.dst, "LocalCopy")
        check_add(add, self.src, self.dst)
        descriptor = _compat.make_local_descriptor(self.src, self.dst, self.sem)
        handle = self._handle(descriptor, started_elsewhere=False)
        if add:
            descriptor.start(priority, add=True)
        else:
            descriptor.start(priority)
        return handle

    def started_elsewhere(self) -> LocalHandle:
        """A handle for this copy, started where this code cannot see it.

        Use it to wait for a copy started in an earlier loop iteration or grid
        step (double buffering), or for several copies on this semaphore whose
        sizes add up to this one (one aggregate wait). For the kernel-scope
        check it may stand for any copy started on the same semaphore slot.
        """
        descriptor = _compat.make_local_descriptor(self.src, self.dst, self.sem)
        return self._handle(descriptor, started_elsewhere=True)


@final
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class RemoteCopy(Generic[SendSemState, TargetState]):
    """A copy from a ref on this device to a ref on another device.

    Built in steps, each returning a new description::

        copy = RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(dev)
        handle = copy.start()
        received = handle.wait()   # o_ref, now readable

    ``recv_sem`` is signalled on the target device as bytes land there;
    ``send_sem`` on this device as the source is read. ``start()``,
    ``started_elsewhere()`` and ``incoming()`` need both the send semaphore
    and the target device.
    """

    __slots__ = ("src", "dst", "recv_sem", "_send_sem", "_device")

    src: DataRef
    dst: DataRef
    recv_sem: SemRef
    _send_sem: SemRef | None
    _device: Device | None

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _REMOTE_COPY_HINTS)

    def __init__(
        self: RemoteCopy[Missing, Missing], src: DataRef, dst: DataRef, recv_sem: SemRef
    ) -> None:
        # The self type pins a new copy to [Missing, Missing]: without it the
        # checker would infer the states from the expected type.
        _check_copy_refs(src, dst, "RemoteCopy")
        check_semaphore(recv_sem, "RemoteCopy receive semaphore", _DMA, what_for="a remote copy")
        _freeze(self, src=src, dst=dst, recv_sem=recv_sem, _send_sem=None, _device=None)

    def _replace(self, send_sem: SemRef | None, device: Device | None) -> RemoteCopy[Given, Given]:
        # The one place a state is asserted; callers narrow it to what they gave.
        new = cast("RemoteCopy[Given, Given]", object.__new__(RemoteCopy))
        _freeze(
            new,
            src=self.src,
            dst=self.dst,
            recv_sem=self.recv_sem,
            _send_sem=send_sem,
            _device=device,
        )
        return new

    def __repr__(self) -> str:
        return self._describe()

    def with_send_sem(self, send_sem: SemRef) -> RemoteCopy[Given, TargetState]:
        """The DMA semaphore signalled on this device once the source has been read."""
        check_semaphore(send_sem, "RemoteCopy send semaphore", _DMA, what_for="a remote copy")
        return cast("RemoteCopy[Given, TargetState]", self._replace(send_sem, self._device))

    def to(self, device: Device) -> RemoteCopy[SendSemState, Given]:
        """The device whose ``dst`` receives the copy."""
        # Checked at run time too, for callers without a type checker.
        if not isinstance(cast(object, device), Device):
            raise DeviceIdError(
                f"RemoteCopy.to() takes a safedma.Device, got {type(device).__name__} "
                f"{device!r}. Build one with safedma.device(x=i), safedma.mesh_coords(...) "
                "or safedma.neighbour('x')."
            )
        return cast("RemoteCopy[SendSemState, Given]", self._replace(self._send_sem, device))

    def _describe(self) -> str:
        return (
            f"RemoteCopy {describe_ref(self.src)} -> {describe_ref(self.dst)} "
            f"{'to ' + repr(self._device) if self._device is not None else 'to no device yet'}"
        )

    def _descriptor(self, action: str) -> AsyncCopyDescriptor:
        if self._send_sem is None or self._device is None:
            missing: list[str] = []
            if self._send_sem is None:
                missing.append("send semaphore (call .with_send_sem(sem))")
            if self._device is None:
                missing.append("target device (call .to(device))")
            raise IncompleteCopyError(
                f"{self._describe()} cannot {action}: it has no {' and no '.join(missing)}. "
                "A remote copy needs both; for a copy on this device use LocalCopy."
            )
        return _compat.make_remote_descriptor(
            self.src,
            self.dst,
            self._send_sem,
            self.recv_sem,
            self._device.pltpu_device_id,
        )

    def _state(self, *, started_elsewhere: bool) -> HandleState:
        sems: dict[Side, object] = {Side.SEND: self._send_sem, Side.RECV: self.recv_sem}
        return HandleState(self._describe, sems, started_elsewhere=started_elsewhere)

    def start(
        self: RemoteCopy[Given, Given],
        *,
        priority: Literal[0] = 0,
        add: Literal[False] = False,
    ) -> RemoteHandle:
        """Start sending; wait through the returned handle (remote copies take priority 0)."""
        check_priority(priority, remote=True)
        check_static_sizes(self.src, self.dst, "RemoteCopy")
        check_no_add(add)
        descriptor = self._descriptor("start")
        state = self._state(started_elsewhere=False)
        descriptor.start(priority)
        return RemoteHandle(descriptor, state, self.src, self.dst)

    def started_elsewhere(self: RemoteCopy[Given, Given]) -> RemoteHandle:
        """A handle for this copy, started in an earlier loop iteration or grid step.

        For the kernel-scope check its waits may stand for any copy started
        on the same send (or receive) semaphore slot.
        """
        descriptor = self._descriptor("be waited")
        return RemoteHandle(descriptor, self._state(started_elsewhere=True), self.src, self.dst)

    def incoming(self: RemoteCopy[Given, Given]) -> IncomingHandle:
        """The receive side of this copy as sent *to* this device by another device.

        Use it when this device only receives (the sender runs a different
        branch); its ``wait_recv()`` returns ``dst``, and may stand for any
        copy received on the same semaphore slot.
        """
        descriptor = self._descriptor("be waited")
        return IncomingHandle(descriptor, self._state(started_elsewhere=True), self.src, self.dst)


def _freeze(copy: object, **fields: object) -> None:
    """Set the fields of a frozen copy (its own __init__ and the builder steps only)."""
    for name, value in fields.items():
        object.__setattr__(copy, name, value)


def wait_all_into(dst: DataRef, sem: SemRef) -> DataRef:
    """One wait for all the local copies into ``dst`` tracked by ``sem``: the aggregate wait.

    For several copies started on one semaphore into parts of ``dst`` (the
    pages of a paged-attention block, say), whose sizes add up to ``dst``'s.
    A DMA wait decrements the semaphore by its descriptor's size, so one wait
    sized like ``dst`` stands for all of them. It discharges every copy
    started on ``sem`` in the kernel (like ``started_elsewhere()``), returns
    ``dst`` (now readable) and lowers to
    ``pltpu.make_async_copy(dst, dst, sem).wait()``. Sizes that do not add up
    hang on a TPU; ``safedma.testing.verify`` and ``simulate`` report them.
    """
    return LocalCopy(dst, dst, sem).started_elsewhere().wait()


publish(globals(), __name__)  # public classes print as safedma.X
