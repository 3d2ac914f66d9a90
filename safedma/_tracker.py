"""Kernel-scope bookkeeping: which copies are in flight while a body is traced.

A DMA that is started and never waited makes interpret mode return NaNs and a
TPU crash (T7); a handle waited twice hangs (T8). Neither is visible to pltpu
at trace time. While a kernel body decorated with :func:`safedma.checked` (or
run through :func:`safedma.pallas_call`) is traced, every ``start()`` records
an obligation and every handle wait discharges it; what is left when the body
returns is reported.

Three legitimate patterns wait for copies the trace cannot pair with their
start: the wait for a copy started in an earlier loop iteration (double
buffering), one aggregate wait for many starts on one semaphore (paged
attention), and the receive-side wait for another device's send. All three go
through an explicitly named API (``started_elsewhere()`` / ``incoming()``),
whose wait discharges every obligation of the same side on the same
semaphore; the ordinary ``start(); wait()`` pairing stays strict.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import functools
import sys
from collections.abc import Callable, Generator, Mapping
from typing import NamedTuple

from safedma import _compat
from safedma._errors import CopyNeverWaitedError, HandleWaitedTwiceError

__all__ = [
    "Side",
    "KernelScope",
    "current_scope",
    "kernel_scope",
    "call_site",
    "SourceLine",
    "describe_ref",
    "describe_value",
    "settle_semaphore",
]


class Side(enum.Enum):
    """Which semaphore a wait decrements."""

    LOCAL = "wait()"
    SEND = "wait_send()"
    RECV = "wait_recv()"


class SourceLine(NamedTuple):
    """Where user code called safedma; formatted only when an error names it."""

    filename: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


# Descriptions of copies are built only when an error needs them: formatting
# them on every start() was most of safedma's trace-time cost.
Describe = Callable[[], str]


@dataclasses.dataclass(eq=False)
class _Obligation:
    describe: Describe
    started_at: SourceLine
    sides: dict[Side, object]  # side -> root of the semaphore that side waits on
    waited: dict[Side, SourceLine] = dataclasses.field(default_factory=dict[Side, SourceLine])


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """What the surrounding ``safedma.pallas_call`` knows about the kernel."""

    collective_id: int | None


@dataclasses.dataclass(eq=False)
class KernelScope:
    """The state of one kernel body being traced."""

    kernel_name: str
    names: dict[int, str]
    config: KernelConfig | None
    obligations: list[_Obligation] = dataclasses.field(default_factory=list[_Obligation])
    elsewhere_waits: dict[Side, dict[int, SourceLine]] = dataclasses.field(
        default_factory=lambda: {side: {} for side in Side}
    )
    keep_alive: list[object] = dataclasses.field(default_factory=list[object])
    # Semaphores (by root) whose copies are settled outside the start/wait pairing,
    # on every side: waited by total size (safedma.wait_bytes / wait_copies) or
    # handed on in a DmaFuture. See settle_semaphore().
    settled: dict[int, SourceLine] = dataclasses.field(default_factory=dict[int, SourceLine])

    def name_of(self, ref: object) -> str | None:
        return self.names.get(id(_compat.root_of(ref)))

    def check_all_waited(self) -> None:
        """Raise if a started copy is still in flight (T7), or more was waited than started (T8)."""
        left: list[str] = []
        for ob in self.obligations:
            missing = [
                side
                for side, root in ob.sides.items()
                if side not in ob.waited
                and id(root) not in self.elsewhere_waits[side]
                and id(root) not in self.settled
            ]
            if missing:
                calls = " and ".join(side.value for side in missing)
                left.append(f"  - {ob.describe()}, started at {ob.started_at}: {calls} never called")
        if left:
            count = len(left)
            raise CopyNeverWaitedError(
                f"kernel {self.kernel_name!r}: {count} cop{'y was' if count == 1 else 'ies were'} "
                "started and never waited before the kernel body returned:\n"
                + "\n".join(left)
                + "\nOn a TPU this crashes the program; in interpret mode the copy never "
                "lands. Wait each handle that start() returned (handle.wait()). For a copy "
                "waited in a later loop iteration, or by the receiving device, wait it "
                "there through copy.started_elsewhere() or copy.incoming()."
            )
        self._check_no_extra_waits()


    def _check_no_extra_waits(self) -> None:
        # A started_elsewhere()/incoming() wait must stand for a copy whose own
        # handle was not waited: otherwise it waits for bytes nobody sends.
        for side, roots in self.elsewhere_waits.items():
            for root_id, where in roots.items():
                if root_id in self.settled:  # sizes settled by wait_bytes or a future
                    continue
                pending = [
                    ob for ob in self.obligations
                    if side in ob.sides and id(ob.sides[side]) == root_id and side not in ob.waited
                ]
                if pending:
                    continue
                started = any(
                    side in ob.sides and id(ob.sides[side]) == root_id for ob in self.obligations
                )
                reason = (
                    "every copy started on that semaphore was already waited through its own handle"
                    if started
                    else "no copy in this kernel is started on that semaphore"
                )
                raise HandleWaitedTwiceError(
                    f"kernel {self.kernel_name!r}: the {side.value} of a started_elsewhere() or "
                    f"incoming() handle at {where} waits for a copy that is never in flight: "
                    f"{reason}. More would be waited than started, so the kernel hangs. Drop the "
                    "extra wait, or start the copy it stands for (without waiting its handle)."
                )


_current: contextvars.ContextVar[KernelScope | None] = contextvars.ContextVar(
    "safedma_kernel_scope", default=None
)
_config: contextvars.ContextVar[KernelConfig | None] = contextvars.ContextVar(
    "safedma_kernel_config", default=None
)


def current_scope() -> KernelScope | None:
    return _current.get()


def current_config() -> KernelConfig | None:
    scope = _current.get()
    return scope.config if scope is not None else _config.get()


@contextlib.contextmanager
def kernel_config(config: KernelConfig) -> Generator[None, None, None]:
    """Make ``config`` visible to the kernel bodies traced inside this block."""
    token = _config.set(config)
    try:
        yield
    finally:
        _config.reset(token)


@contextlib.contextmanager
def kernel_scope(
    kernel_name: str, named_refs: Mapping[str, object]
) -> Generator[KernelScope, None, None]:
    """Track copies while one kernel body is traced; check them if it returns normally."""
    scope = KernelScope(
        kernel_name=kernel_name,
        names={id(_compat.root_of(ref)): name for name, ref in named_refs.items()},
        config=_config.get(),
        keep_alive=list(named_refs.values()),
    )
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def settle_semaphore(sem: object) -> None:
    """Mark every copy on ``sem``'s semaphore (any side, started before or after) as
    accounted for in the current kernel scope, if there is one.

    For waits that decrement a semaphore shared by many copies by their total size,
    and for copies a kernel leaves in flight on purpose (a DMA future), neither of
    which the trace can pair with individual starts.
    """
    scope = _current.get()
    if scope is None:
        return
    root = _compat.root_of(sem)
    scope.settled.setdefault(id(root), call_site())
    scope.keep_alive.append(root)


@functools.lru_cache(maxsize=None)
def _is_library_frame(module_name: str) -> bool:
    # safedma's own top-level modules; safedma.kernels and the like are user code.
    return module_name == "safedma" or (
        module_name.startswith("safedma.") and module_name.count(".") == 1
    )


def call_site() -> SourceLine:
    """The nearest caller outside safedma's own top-level modules (``str()`` is ``file:line``)."""
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]  # documented CPython API
    while frame.f_back is not None and _is_library_frame(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return SourceLine(frame.f_code.co_filename, frame.f_lineno)


def describe_value(value: object) -> str:
    """A short, readable rendering of an index or device-id component."""
    if isinstance(value, (int, str)):
        return repr(value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return f"<traced {getattr(dtype, 'name', dtype)}>"
    return repr(value)


def describe_ref(ref: object) -> str:
    """A ref as an author recognises it: its kernel parameter name, dtype and shape."""
    scope = _current.get()
    name = scope.name_of(ref) if scope is not None else None
    shape = getattr(ref, "shape", None)
    dtype = getattr(ref, "dtype", None)
    layout = (
        f"{getattr(dtype, 'name', dtype)}[{','.join(str(d) for d in shape)}]"
        if shape is not None
        else type(ref).__name__
    )
    is_view = ref is not _compat.root_of(ref)
    if name is None:
        return layout
    return f"{name}{'.at[...]' if is_view else ''} {layout}"


class HandleState:
    """Per-handle wait bookkeeping; works with or without a kernel scope."""

    __slots__ = ("_obligation", "_waited", "_describe", "_elsewhere", "_sides")

    def __init__(
        self, describe: Describe, sides: dict[Side, object], *, started_elsewhere: bool
    ) -> None:
        self._describe = describe
        self._sides = sides
        self._waited: dict[Side, SourceLine] = {}
        self._elsewhere = started_elsewhere
        self._obligation: _Obligation | None = None
        scope = _current.get()
        if scope is not None and not started_elsewhere:
            self._obligation = _Obligation(describe, call_site(), sides, self._waited)
            scope.obligations.append(self._obligation)
            scope.keep_alive.extend(sides.values())

    def record_wait(self, side: Side) -> None:
        """Mark ``side`` waited; raise HandleWaitedTwiceError on a second wait."""
        here = call_site()
        if side in self._waited:
            origin = "started elsewhere" if self._elsewhere else (
                f"started at {self._obligation.started_at}" if self._obligation else "started"
            )
            raise HandleWaitedTwiceError(
                f"{side.value} on the handle of {self._describe()} ({origin}) was called "
                f"twice: first at {self._waited[side]}, again at {here}. Each wait "
                "decrements the semaphore by the copy's size once, so the second wait "
                "can never be satisfied and the kernel hangs. Wait each handle once."
            )
        self._waited[side] = here
        if self._elsewhere:
            scope = _current.get()
            if scope is not None:
                scope.elsewhere_waits[side].setdefault(id(self._sides[side]), here)
