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

Everything lowers to ``pltpu.make_async_copy`` / ``make_async_remote_copy``
and the descriptor's ``start`` / ``wait*`` calls, exactly as written by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, cast, final

from typing_extensions import TypeVar

from safedma import _compat
from safedma._checks import (
    check_data_ref,
    check_no_add,
    check_priority,
    check_same_layout,
    check_semaphore,
)
from safedma._compat import SemaphoreKind
from safedma._tracker import HandleState, Side, describe_ref
from safedma._devices import Device
from safedma._errors import DeviceIdError, IncompleteCopyError, WrongOperationError
from safedma._messages import MISSING_OPERATIONS
from safedma._refs import DataRef, SemRef

__all__ = [
    "Given",
    "Missing",
    "LocalCopy",
    "RemoteCopy",
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
    check_same_layout(src, dst, what)


@final
class LocalHandle:
    """A started (or started-elsewhere) local copy; ``wait()`` once."""

    __slots__ = ("_descriptor", "_state")

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _LOCAL_HANDLE_HINTS)

    def __init__(self, descriptor: Any, state: HandleState) -> None:
        self._descriptor = descriptor
        self._state = state

    def wait(self) -> None:
        """Block until the copy's bytes have landed in the destination."""
        self._state.record_wait(Side.LOCAL)
        self._descriptor.wait()


@final
class LocalCopy:
    """A copy between two refs on this device, tracked by one DMA semaphore.

    ``LocalCopy(x_hbm.at[pl.ds(i, n)], buf, sem).start()`` returns a
    :class:`LocalHandle`; ``handle.wait()`` blocks until the copy has landed.
    """

    __slots__ = ("_src", "_dst", "_sem")

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _LOCAL_COPY_HINTS)

    def __init__(self, src: DataRef, dst: DataRef, sem: SemRef) -> None:
        _check_copy_refs(src, dst, "LocalCopy")
        check_semaphore(sem, "LocalCopy semaphore", _DMA, what_for="a local copy")
        self._src = src
        self._dst = dst
        self._sem = sem

    @property
    def src(self) -> DataRef:
        return self._src

    @property
    def dst(self) -> DataRef:
        return self._dst

    @property
    def sem(self) -> SemRef:
        return self._sem

    def _describe(self) -> str:
        return f"LocalCopy {describe_ref(self._src)} -> {describe_ref(self._dst)}"

    def _handle(self, descriptor: Any, *, started_elsewhere: bool) -> LocalHandle:
        sides: dict[Side, object] = {Side.LOCAL: _compat.root_of(self._sem)}
        state = HandleState(self._describe, sides, started_elsewhere=started_elsewhere)
        return LocalHandle(descriptor, state)

    def start(self, *, priority: Literal[0, 1] = 0, add: Literal[False] = False) -> LocalHandle:
        """Start the copy; wait for it through the returned handle.

        ``priority=1`` uses the second DMA queue. ``add`` (DMA accumulate) has
        no TPU lowering and is rejected.
        """
        check_priority(priority, remote=False)
        check_no_add(add)
        descriptor = _compat.make_local_descriptor(self._src, self._dst, self._sem)
        handle = self._handle(descriptor, started_elsewhere=False)
        descriptor.start(priority)
        return handle

    def started_elsewhere(self) -> LocalHandle:
        """A handle for this copy, started where this code cannot see it.

        Use it to wait for a copy started in an earlier loop iteration (double
        buffering), or for several copies on this semaphore whose sizes add up
        to this one (one aggregate wait). Its wait discharges every copy
        started on this semaphore in the kernel.
        """
        descriptor = _compat.make_local_descriptor(self._src, self._dst, self._sem)
        return self._handle(descriptor, started_elsewhere=True)


@final
class RemoteHandle:
    """A started remote copy: ``wait_send()`` on the sending side, ``wait_recv()`` on
    the receiving side, or ``wait()`` for both (the symmetric case, where every
    device sends and receives)."""

    __slots__ = ("_descriptor", "_state")

    def __init__(self, descriptor: Any, state: HandleState) -> None:
        self._descriptor = descriptor
        self._state = state

    def wait_send(self) -> None:
        """Block until the source has been read (it may then be overwritten)."""
        self._state.record_wait(Side.SEND)
        self._descriptor.wait_send()

    def wait_recv(self) -> None:
        """Block until the incoming copy into this device's destination has landed."""
        self._state.record_wait(Side.RECV)
        self._descriptor.wait_recv()

    def wait(self) -> None:
        """``wait_send()`` then ``wait_recv()``."""
        self.wait_send()
        self.wait_recv()


@final
class IncomingHandle:
    """The receive side of a copy another device sends to this one: ``wait_recv()``."""

    __slots__ = ("_descriptor", "_state")

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _INCOMING_HINTS)

    def __init__(self, descriptor: Any, state: HandleState) -> None:
        self._descriptor = descriptor
        self._state = state

    def wait_recv(self) -> None:
        """Block until the incoming copy into this device's destination has landed."""
        self._state.record_wait(Side.RECV)
        self._descriptor.wait_recv()


@final
class RemoteCopy(Generic[SendSemState, TargetState]):
    """A copy from a ref on this device to a ref on another device.

    Built in steps, each returning a new description::

        copy = RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(dev)
        handle = copy.start()
        handle.wait()

    ``recv_sem`` is signalled on the target device as bytes land there;
    ``send_sem`` on this device as the source is read. ``start()``,
    ``started_elsewhere()`` and ``incoming()`` need both the send semaphore
    and the target device.
    """

    __slots__ = ("_src", "_dst", "_recv_sem", "_send_sem", "_device")

    if not TYPE_CHECKING:  # hidden from type checkers, which report these statically

        def __getattr__(self, name: str) -> NoReturn:
            _no_such_operation(self, name, _REMOTE_COPY_HINTS)

    _send_sem: SemRef | None
    _device: Device | None

    def __init__(
        self: RemoteCopy[Missing, Missing], src: DataRef, dst: DataRef, recv_sem: SemRef
    ) -> None:
        # The self type pins a new copy to [Missing, Missing]: without it the
        # checker would infer the states from the expected type.
        _check_copy_refs(src, dst, "RemoteCopy")
        check_semaphore(
            recv_sem, "RemoteCopy receive semaphore", _DMA, what_for="a remote copy"
        )
        self._src = src
        self._dst = dst
        self._recv_sem = recv_sem
        self._send_sem = None
        self._device = None

    def _replace(self, send_sem: SemRef | None, device: Device | None) -> Any:
        new = object.__new__(RemoteCopy)
        new._src, new._dst, new._recv_sem = self._src, self._dst, self._recv_sem
        new._send_sem, new._device = send_sem, device
        return new

    @property
    def src(self) -> DataRef:
        return self._src

    @property
    def dst(self) -> DataRef:
        return self._dst

    @property
    def recv_sem(self) -> SemRef:
        return self._recv_sem

    def with_send_sem(self, send_sem: SemRef) -> RemoteCopy[Given, TargetState]:
        """The DMA semaphore signalled on this device once the source has been read."""
        check_semaphore(
            send_sem, "RemoteCopy send semaphore", _DMA, what_for="a remote copy"
        )
        result: RemoteCopy[Given, TargetState] = self._replace(send_sem, self._device)
        return result

    def to(self, device: Device) -> RemoteCopy[SendSemState, Given]:
        """The device whose ``dst`` receives the copy."""
        # Checked at run time too, for callers without a type checker.
        if not isinstance(cast(object, device), Device):
            raise DeviceIdError(
                f"RemoteCopy.to() takes a safedma.Device, got {type(device).__name__} "
                f"{device!r}. Build one with safedma.device(x=i), safedma.mesh_coords(...) "
                "or safedma.neighbour('x')."
            )
        result: RemoteCopy[SendSemState, Given] = self._replace(self._send_sem, device)
        return result

    def _describe(self) -> str:
        return (
            f"RemoteCopy {describe_ref(self._src)} -> {describe_ref(self._dst)} "
            f"{'to ' + repr(self._device) if self._device is not None else 'to no device yet'}"
        )

    def _descriptor(self, action: str) -> Any:
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
            self._src,
            self._dst,
            self._send_sem,
            self._recv_sem,
            self._device.pltpu_device_id,
        )

    def _sides(self) -> dict[Side, object]:
        return {
            Side.SEND: _compat.root_of(self._send_sem),
            Side.RECV: _compat.root_of(self._recv_sem),
        }

    def start(
        self: RemoteCopy[Given, Given],
        *,
        priority: Literal[0] = 0,
        add: Literal[False] = False,
    ) -> RemoteHandle:
        """Start sending; wait through the returned handle (remote copies take priority 0)."""
        check_priority(priority, remote=True)
        check_no_add(add)
        descriptor = self._descriptor("start")
        state = HandleState(self._describe, self._sides(), started_elsewhere=False)
        descriptor.start(priority)
        return RemoteHandle(descriptor, state)

    def started_elsewhere(self: RemoteCopy[Given, Given]) -> RemoteHandle:
        """A handle for this copy, started in an earlier loop iteration.

        Its waits discharge every copy started on the same send (or receive)
        semaphore in the kernel.
        """
        descriptor = self._descriptor("be waited")
        state = HandleState(self._describe, self._sides(), started_elsewhere=True)
        return RemoteHandle(descriptor, state)

    def incoming(self: RemoteCopy[Given, Given]) -> IncomingHandle:
        """The receive side of this copy as sent *to* this device by another device.

        Use it when this device only receives (the sender runs a different
        branch); its ``wait_recv()`` discharges every copy received on the
        same semaphore in the kernel.
        """
        descriptor = self._descriptor("be waited")
        state = HandleState(self._describe, self._sides(), started_elsewhere=True)
        return IncomingHandle(descriptor, state)


def wait_all_into(dst: DataRef, sem: SemRef) -> None:
    """One wait for all the local copies into ``dst`` tracked by ``sem``: the aggregate wait.

    For several copies started on one semaphore into parts of ``dst`` (the
    pages of a paged-attention block, say), whose sizes add up to ``dst``'s.
    A DMA wait decrements the semaphore by its descriptor's size, so one wait
    sized like ``dst`` stands for all of them. It discharges every copy
    started on ``sem`` in the kernel (like ``started_elsewhere()``), and
    lowers to ``pltpu.make_async_copy(dst, dst, sem).wait()``. Sizes that do
    not add up hang on a TPU; the strict simulation in ``safedma.testing``
    reports them.
    """
    LocalCopy(dst, dst, sem).started_elsewhere().wait()
