"""The host side: the flags a sanitized kernel returned, decoded into safedma's error classes.

A mistake is raised as the class ``safedma.testing.simulate`` and ``verify``
raise for it (:class:`~safedma.testing.DeadlockError`,
:class:`~safedma.testing.LeftoverSemaphoreError`,
:class:`~safedma.testing.OutOfBoundsDmaError`,
:class:`~safedma.testing.SemaphoreIndexError`), imported when a mistake is
found, so the library does not load ``safedma.testing`` otherwise.

Eagerly, the call raises it directly. Under ``jax.jit`` (and ``shard_map``)
the flags are checked in a host callback, which jax turns into a
``JaxRuntimeError`` when it raises; the error is also kept here, and
:func:`sanitizer_errors` (a context manager and decorator) raises the
safedma error in place of jax's.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import weakref
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, Literal

import numpy as np

import jax

from safedma._errors import SafeDmaError
from safedma._sanitize._flags import (
    CODE,
    DEADLOCK,
    DEVICE,
    DEVICE_ID,
    LEFTOVER,
    MAX_AXES,
    MAX_GRID,
    MAX_VALUES,
    OUT_OF_BOUNDS,
    PROGRAM,
    SEMAPHORE_INDEX,
    SITE,
    VALUES,
    WORDS,
)
from safedma._sanitize._sites import Site, lookup
from safedma._sanitize._units import Backend, unit_name
from safedma._public import publish

__all__ = [
    "check_flags",
    "count_flagged",
    "decode",
    "recorded_since",
    "report_in_callback",
    "host_check_wanted",
    "sanitizer_errors",
    "unchecked_on_host",
]

_PREFIX = "[safedma sanitizer] "


def decode(flags: Any) -> list[SafeDmaError]:
    """The mistakes recorded in ``flags`` (one per kernel call: a batch or a device each)."""
    words = np.asarray(flags).reshape(-1, WORDS)
    found: list[SafeDmaError] = []
    for row in words:
        if int(row[CODE]) != 0:
            found.append(_error(row))
    return found


def check_flags(flags: Any) -> None:
    """Raise the first mistake recorded in ``flags`` (an eager call's flags)."""
    errors = decode(flags)
    if errors:
        raise _with_others(errors)


def _with_others(errors: Sequence[SafeDmaError]) -> SafeDmaError:
    """One report: the likeliest cause first (a hang is often what another device's
    mistake left behind), the others in a line each."""
    ranked = sorted(errors, key=_rank)
    first = ranked[0]
    if len(ranked) > 1:
        others = "".join(f"\n  {type(e).__name__}: {_headline(e)}" for e in ranked[1:4])
        more = f"\n  and {len(ranked) - 4} more" if len(ranked) > 4 else ""
        hangs = any(_rank(e) == 2 for e in ranked[1:])
        why = "; a hang is often what another device's mistake left behind" if hangs else ""
        first.args = (
            f"{first.args[0]}\n(and {len(ranked) - 1} more sanitizer report(s){why}:"
            f"{others}{more})",
        )
    return first


def _rank(error: SafeDmaError) -> int:
    from safedma.testing._errors import LeftoverSemaphoreError  # noqa: PLC0415
    from safedma.testing._verify.errors import DeadlockError  # noqa: PLC0415

    if isinstance(error, DeadlockError):
        return 2
    return 1 if isinstance(error, LeftoverSemaphoreError) else 0


def _headline(error: SafeDmaError) -> str:
    """What the report is and where, without its explanation."""
    text = str(error.args[0]) if error.args else str(error)
    text = text.removeprefix(_PREFIX)
    head, _, rest = text.partition(": ")
    place = rest.split(" in kernel ")[0].split(": ")[0] if rest else ""
    return f"{head}: {place}" if place else head


# -------------------------------------------------------------------- under jit

_unchecked: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "safedma_sanitizer_unchecked", default=False
)


@contextlib.contextmanager
def unchecked_on_host() -> Generator[None, None, None]:
    """Trace sanitized kernels in the block without the host check of their flags (for
    exporting to another platform, where jax cannot lower a host callback); the kernels
    are instrumented as always."""
    token = _unchecked.set(True)
    try:
        yield
    finally:
        _unchecked.reset(token)


def host_check_wanted() -> bool:
    return not _unchecked.get()


_recorded: list[SafeDmaError] = []
_recorded_lock = threading.Lock()


def count_flagged(flags: Any) -> Any:
    """How many kernel calls in ``flags`` recorded a mistake (never raises)."""
    try:
        return np.int32(len(decode(flags)))
    except Exception:
        return np.int32(-1)


def report_in_callback(flags: Any, after: object = ()) -> None:
    """The host callback under jit: keep the mistake for :func:`sanitizer_errors`, raise it.
    ``after``: a value it must wait for (it is not used)."""
    del after
    errors = decode(flags)
    if not errors:
        return
    with _recorded_lock:
        _recorded.extend(errors)
        if len(_recorded) > 1000:
            del _recorded[:-1000]
    _quiet_callback_log()
    _raised.add(errors[0])
    raise errors[0]


#: The errors the callback raised: jax logs each with its traceback; the filter drops those.
_raised: weakref.WeakSet[BaseException] = weakref.WeakSet()


class _OwnReports(logging.Filter):
    """Drops jax's "jax.debug.callback failed" record of a sanitizer report: jax logs it
    with the callback's traceback on every device that raised, while the report itself
    surfaces once, where jax (or :func:`sanitizer_errors`) raises it."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or error not in _raised


_filter = _OwnReports()


def _quiet_callback_log() -> None:
    from safedma._sanitize._jax import DEBUG_CALLBACK_LOGGER  # noqa: PLC0415

    logger = logging.getLogger(DEBUG_CALLBACK_LOGGER)
    if _filter not in logger.filters:
        logger.addFilter(_filter)


def recorded_since(mark: int) -> list[SafeDmaError]:
    with _recorded_lock:
        return list(_recorded[mark:])


def _mark() -> int:
    with _recorded_lock:
        return len(_recorded)


def _runtime_errors() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = []
    for name in ("JaxRuntimeError", "XlaRuntimeError"):
        kind = getattr(jax.errors, name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            kinds.append(kind)
    return tuple(kinds)


class sanitizer_errors(contextlib.ContextDecorator):  # noqa: N801 (used like a function)
    """Raise the sanitizer's own error where jax reports a failed host callback.

    Under ``jax.jit`` a sanitized kernel's mistake surfaces as jax's
    ``JaxRuntimeError`` ("CpuCallback error ..."); inside this block (or a
    function decorated with it) that error is replaced by the safedma error
    the sanitizer recorded (``DeadlockError``, ...), chained from jax's. Put the
    point where jax waits for the result (``block_until_ready``, printing,
    ``np.asarray``) inside the block.
    """

    def __enter__(self) -> sanitizer_errors:
        self._mark = _mark()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if error is None or not isinstance(error, _runtime_errors()):
            return
        found = recorded_since(self._mark)
        if found:
            _settle_effects()
            raise _with_others(found) from error


def _settle_effects() -> None:
    """Let jax forget the failed computation (see ``_jax.forget_failed_effects``)."""
    from safedma._sanitize import _jax  # noqa: PLC0415

    _jax.forget_failed_effects()


# -------------------------------------------------------------------- messages


def _error(row: Any) -> SafeDmaError:
    # Imported only when there is a mistake, from the modules that define the classes.
    from safedma.testing._errors import (  # noqa: PLC0415
        DeviceOutsideMeshError,
        LeftoverSemaphoreError,
    )
    from safedma.testing._verify.errors import (  # noqa: PLC0415
        DeadlockError,
        OutOfBoundsDmaError,
        SemaphoreIndexError,
    )

    code, ident = int(row[CODE]), int(row[SITE])
    site = lookup(ident)
    if site is None:
        return SafeDmaError(
            f"{_PREFIX}a sanitized kernel recorded mistake {code} at check {ident}, which "
            "this process did not trace (flags passed between processes?)"
        )
    values = [int(v) for v in row[VALUES : VALUES + MAX_VALUES]]
    device, device_id = _device(site, row)
    step = _step(site, row)
    where = _location(site)
    text = _Texts(site, values, device + step, where)
    if code == DEADLOCK:
        return DeadlockError(text.deadlock())
    if code == OUT_OF_BOUNDS:
        return OutOfBoundsDmaError(text.out_of_bounds())
    if code == SEMAPHORE_INDEX:
        return SemaphoreIndexError(text.semaphore_index())
    if code == DEVICE_ID:
        return DeviceOutsideMeshError(text.device_id(), device=device, location=where)
    if code == LEFTOVER:
        message, record = text.leftover(device, device_id)
        error = LeftoverSemaphoreError([record])
        error.args = (message,)
        return error
    return SafeDmaError(f"{_PREFIX}unknown mistake code {code} at {where}")


def _device(site: Site, row: Any) -> tuple[str, int]:
    if not site.axes:
        return "device 0", 0
    coords = [int(row[DEVICE + k]) for k in range(min(len(site.axes), MAX_AXES))]
    flat = 0
    for (_, size), coord in zip(site.axes, coords):
        flat = flat * size + coord
    inner = ", ".join(f"{name}={c}" for (name, _), c in zip(site.axes, coords))
    return f"device {flat} ({inner})", flat


def _step(site: Site, row: Any) -> str:
    if not site.grid:
        return ""
    ids = [str(int(row[PROGRAM + k])) for k in range(min(len(site.grid), MAX_GRID))]
    more = ", ..." if len(site.grid) > MAX_GRID else ""
    return f" at grid step ({', '.join(ids)}{more})"


def _location(site: Site) -> str:
    try:
        from safedma.testing._user_frames import user_frame_of  # noqa: PLC0415

        found = user_frame_of(list(site.frames), whole_kernel=True)
    except Exception:  # only for messages
        found = None
    if found is not None:
        return found
    for frame in site.frames:
        path = str(getattr(frame, "file_name", ""))
        if path and os.sep + "jax" + os.sep not in path:
            return f"{path}:{getattr(frame, 'line_num', '?')}"
    return "an unknown line"


_KINDS: dict[str, Literal["DMA", "REGULAR", "BARRIER"]] = {
    "DMA": "DMA",
    "REGULAR": "REGULAR",
    "BARRIER": "BARRIER",
}


class _Texts:
    """The messages, one per mistake: the mistake, the user's line, the device, the fix."""

    def __init__(self, site: Site, values: list[int], device: str, where: str) -> None:
        self.site = site
        self.values = values
        self.device = device
        self.where = where

    def _view(self, first: int) -> str:
        """The view's indices as the user wrote them, with the recorded values."""
        recorded: list[int] = self.values[first:]

        def value(entry: tuple[str, int]) -> int | None:
            kind, number = entry
            if kind == "value":
                return int(number) if number >= 0 else None
            return recorded[number] if number < len(recorded) else None

        text = ""
        for indexer in self.site.detail.get("view", ()):
            parts: list[str] = []
            for part in indexer:
                if part[0] == "slice":
                    start, size = value(part[1]), value(part[2])
                    if start is None or size is None:
                        parts.append("?")
                    else:
                        stride = f":{part[3]}" if part[3] != 1 else ""
                        parts.append(f"{start}:{start + (size - 1) * part[3] + 1}{stride}")
                else:
                    found = value(part)
                    parts.append("?" if found is None else str(found))
            text += "[" + ", ".join(parts) + "]"
        return text

    def _shape(self) -> str:
        return (
            "("
            + ", ".join("?" if d < 0 else str(d) for d in self.site.shape)
            + (",)" if len(self.site.shape) == 1 else ")")
        )

    def _units(self, kind: str) -> str:
        return f" {unit_name(self.site.backend)}" if kind == "DMA" else ""

    def deadlock(self) -> str:
        site, values = self.site, self.values
        count, needed = values[0], values[1]
        kind = str(site.detail.get("kind", "DMA"))
        units = self._units(kind)
        bound = ""
        if kind == "DMA" and not site.detail.get("exact", True):
            bound = " (a lower bound of what the copy adds on a TPU: its shape is outside the measured ones)"
        seconds = float(site.detail.get("seconds", 0.0))
        return (
            f"{_PREFIX}hang (R3) on {self.device}: the {site.operation} at {self.where} in "
            f"kernel {site.kernel} waits on {kind} semaphore {site.name}{self._view(2)} for "
            f"{needed}{units}{bound}; after {site.detail.get('polls')} polls (about "
            f"{seconds:.3g} s) it still held {count}{units}. On a TPU this wait hangs; the "
            "sanitizer skipped it and the kernel returned, so its outputs are not valid. "
            "Nothing started or signalled enough on this semaphore: a copy or signal "
            "skipped by a condition, aimed at another device or semaphore slot, sized "
            "differently from this wait, waited twice, or a wait-for cycle between devices. "
            "Fix the start or signal this wait stands for (safedma.testing.verify shows the "
            "whole protocol on the CPU)."
        )

    def out_of_bounds(self) -> str:
        site = self.site
        detail = site.detail
        reading = detail.get("role") == "source"
        window = self._window()
        return (
            f"{_PREFIX}copy window out of bounds on {self.device}: the {site.operation} at "
            f"{self.where} in kernel {site.kernel} {'reads' if reading else 'writes'} "
            f"{detail.get('role')} {site.name}{self._view(2 if detail.get('kind') == 'slice' else 1)} "
            f"(shape {self._shape()}); in dimension {detail.get('dim')} of the "
            f"{tuple(detail.get('indexed_shape', ()))} array it indexes, {window} is outside "
            f"0:{detail.get('extent')}. The copy was not issued (on a TPU it would "
            f"{'read' if reading else 'write'} memory outside {site.name}). Keep the window "
            "inside the array: check or clamp the index that places it."
        )

    def _window(self) -> str:
        detail, values = self.site.detail, self.values
        if detail.get("kind") == "slice":
            start, size = values[0], values[1]
            stride = int(detail.get("stride", 1))
            end = start + (size - 1) * stride + 1
            step = f" (stride {stride})" if stride != 1 else ""
            return f"the window {start}:{end}{step}"
        return f"index {values[0]}"

    def semaphore_index(self) -> str:
        site, detail = self.site, self.site.detail
        first = 2 if detail.get("kind") == "slice" else 1
        return (
            f"{_PREFIX}semaphore index out of range (R5) on {self.device}: the "
            f"{site.operation} at {self.where} in kernel {site.kernel} uses "
            f"{detail.get('role')} {site.name}{self._view(first)} (shape {self._shape()}); "
            f"{self._window()} in dimension {detail.get('dim')} is outside "
            f"0:{detail.get('extent')}. On a TPU this silently uses another semaphore's "
            "memory; the sanitizer skipped the operation. Allocate enough semaphores or fix "
            "the index."
        )

    def device_id(self) -> str:
        from safedma.testing._errors import outside_mesh_message  # noqa: PLC0415

        site = self.site
        axis = site.detail.get("axis")
        value = self.values[0]
        return (
            _PREFIX
            + outside_mesh_message(
                operation=site.operation,
                device=self.device,
                where=f"{self.where} in kernel {site.kernel}",
                target=f"{axis}={value}" if axis else str(value),
                axis=str(axis) if axis else None,
                size=int(site.detail.get("size", 0)),
            )
            + " The sanitizer skipped it (on a TPU it reaches another device's memory, "
            "or none)."
        )

    def leftover(self, device: str, device_id: int) -> tuple[str, Any]:
        from safedma.testing._errors import LeftoverSemaphore  # noqa: PLC0415

        site, values = self.site, self.values
        count, flat = values[0], values[1]
        kind = str(site.detail.get("kind", "DMA"))
        slot = ""
        if site.shape:
            index = np.unravel_index(flat, tuple(max(1, d) for d in site.shape))
            slot = "[" + ", ".join(str(int(i)) for i in index) + "]"
        units = self._units(kind)
        approx = ""
        if kind == "DMA" and site.backend is Backend.CHIP:
            approx = f" (up to {count * 32} bytes)"
        when = (
            f"the end of the run_scoped body at {self.where}"
            if site.operation == "end of run_scoped"
            else "kernel exit"
        )
        hint = (
            "a copy started on it was never waited (wait it with handle.wait(), "
            "wait_recv or wait_send before the body ends)"
            if kind == "DMA"
            else "a signal sent to it was never waited (pl.semaphore_wait / sd.wait it "
            "before the body ends); the sanitizer drained it"
        )
        message = (
            f"{_PREFIX}semaphore not back to zero (R2) on {self.device}: {kind} semaphore "
            f"{site.name}{slot} of kernel {site.kernel} holds {count}{units}{approx} at "
            f"{when}: {hint}. On a TPU a semaphore left non-zero crashes the program or "
            "releases a later kernel's wait too early."
        )
        record = LeftoverSemaphore(
            kernel=0,
            device_id=device_id,
            device=device,
            semaphore_id=flat,
            kind=_KINDS.get(kind, "DMA"),
            count=count * 32 if kind == "DMA" and site.backend is Backend.CHIP else count,
            hint=hint,
        )
        return message, record


publish(globals(), __name__)  # public classes print as safedma.X
