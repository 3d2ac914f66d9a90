"""Probes into TPU interpret mode: the one module of safedma.testing that patches private JAX.

Interpret mode prints a leftover semaphore instead of failing, hangs on a wait
nothing can satisfy, sometimes reports a secondary ``BrokenBarrierError``
instead of the error that stopped the kernel, and keeps its whole simulated
TPU in module globals of ``jax._src.pallas.mosaic.interpret``.  None of that
has a public hook, so :func:`interpret_probes` wraps the few names listed in
:data:`_PROBES` (one entry each, saying why) for the duration of one
``simulate``, and reports what they see to an :class:`InterpretObserver`.
Every name is checked before anything is patched; a JAX release that moved
one fails with :class:`~safedma.testing._private.PrivateJaxApiError`.

Only names the interpreter looks up *at run time* are wrapped (methods,
module globals), never functions an ``io_callback`` captured at trace time,
so jit caching cannot bypass a probe.  One lock guards the one global: the
installed probes.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import itertools
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from types import ModuleType, TracebackType
from typing import Any, Literal, Protocol, cast

import numpy as np
from jax.experimental.pallas import tpu as _pltpu

import safedma
from safedma.testing import _copy_clock_entries, _semaphore_clocks
from safedma.testing._errors import ConcurrentInterpretError
from safedma.testing._interrupts import deferred_interrupts
from safedma.testing._off_mesh import check_target
from safedma.testing._private import moved, private_callable, private_module
from safedma.testing._kernel_lines import enclosing_lines, sub_jaxprs, user_location

__all__ = [
    "DMA_CLOCK_ENTRIES",
    "FIRST_SEMAPHORE_ID",
    "MAX_DMA_CLOCK_ENTRIES",
    "DmaStart",
    "Installed",
    "InterpretObserver",
    "InterpretRun",
    "LeftoverCount",
    "RaceReport",
    "SignalSent",
    "StopRun",
    "StrictInterpretParams",
    "WaitStart",
    "callback_failures",
    "current_interpret_run",
    "enclosing_lines",
    "exception_location",
    "force_interpret_params",
    "interpret_mode_busy",
    "interpret_probes",
    "large_callback_copies_can_hang",
    "races_raise_natively",
    "strict_interpret_params",
    "sub_jaxprs",
    "unfiltered_tracebacks",
    "user_location",
    "warm_up",
]

_INTERPRET = "jax._src.pallas.mosaic.interpret"
_IPC = f"{_INTERPRET}.interpret_pallas_call"
_SHM = f"{_INTERPRET}.shared_memory"
_RDS = f"{_INTERPRET}.race_detection_state"


#: Vector-clock entries for copies, beyond one per simulated core, in a first run.
#: jax gives each copy one of ``vector_clock_size - cores`` entries (at random),
#: and by default that is as many entries as cores: on one device every copy
#: shares one entry, so a read of a copy's destination after the wait of ANOTHER
#: copy started before it counted as ordered (a missed race).  Entries are handed
#: out so that copies share one only when the core starting the later copy knows
#: the earlier one completed (``_copy_clock_entries``); a run with more copies in
#: flight at once than entries is run again with more (``_runner``).
DMA_CLOCK_ENTRIES = 64

#: The number interpret mode gives a kernel call's first semaphore operand; the others
#: follow in operand order (``SharedMemory.next_semaphore_id`` starts there, jax 0.10.2
#: and 0.12 alike). simulate names semaphores by it (``_kernel_names``); the naming
#: tests (tests/testing/test_simulate_names.py) fail if jax numbers them otherwise.
FIRST_SEMAPHORE_ID = 2000

#: The most entries for copies a run gets: each recorded access keeps a clock of
#: ``cores + entries`` 32-bit counts (4 KiB at this bound).
MAX_DMA_CLOCK_ENTRIES = 1024


class StrictInterpretParams(_pltpu.InterpretParams):
    """simulate's interpret parameters; the subclass marks a kernel as simulate's own.

    jax accepts any ``InterpretParams`` instance (``isinstance`` checks), and
    dataclass equality compares classes, so no kernel built elsewhere compares
    equal to one of these.
    """

    def get_vector_clock_size(self, num_devices: int) -> int:
        """One entry per core, and the run's entries for the copies.

        jax calls this (a method of its ``InterpretParams``) when a kernel starts,
        with the number of devices; its default leaves the copies as many entries
        as there are cores.  The run's count (:data:`DMA_CLOCK_ENTRIES` first) is
        the installed probes', read when the kernel starts, so a run again with
        more entries needs no new compilation.
        """
        cores = int(num_devices) * int(getattr(self, "num_cores_or_threads", 1))
        installed = _installed
        entries = DMA_CLOCK_ENTRIES if installed is None else installed.clock_entries
        return cores + entries


class StopRun(RuntimeError):
    """What the watchdog makes every device of a run raise to stop it."""


# --------------------------------------------------------------------------
# What the probes report


@dataclasses.dataclass(frozen=True, eq=False)
class InterpretRun:
    """The simulated TPU of one interpreted kernel (jax's ``SharedMemory``), kept opaque."""

    _memory: Any

    @property
    def key(self) -> int:
        return id(self._memory)

    @property
    def cores(self) -> int:
        return int(getattr(self._memory, "num_cores", 1) or 1)

    @property
    def cores_per_device(self) -> int:
        return int(getattr(self._memory, "num_cores_per_device", 1) or 1)

    @property
    def failed(self) -> bool:
        """True once the run has failed (jax keeps the first failure in ``_failure``)."""
        return getattr(self._memory, "_failure", None) is not None

    def fail(self, error: Exception) -> None:
        """Make every device of this run raise ``error`` at its next interpreter step.

        ``top_level=False``: the caller is not one of the device threads, so it
        must not take a place in the clean-up barrier.
        """
        self._memory.set_failed(error, top_level=False)

    def abort_barriers(self) -> None:
        """Break the interpreter's start and clean-up barriers.

        For a run where a device will never reach them (it died outside the
        interpreter, or the watchdog could not stop it otherwise).
        """
        for name in ("barrier", "clean_up_barrier"):
            barrier = getattr(self._memory, name, None)
            if isinstance(barrier, threading.Barrier):
                barrier.abort()

    def is_barrier_semaphore(self, semaphore: object) -> bool:
        fixed: Mapping[object, object] = getattr(self._memory, "fixed_id_sem", None) or {}
        return any(value is semaphore for value in fixed.values())

    def nonzero_counts(self) -> list[LeftoverCount]:
        """Every semaphore count that is not zero, on every core."""
        with self._memory.lock:
            sems = [*dict(self._memory.sem).values(), *dict(self._memory.fixed_id_sem).values()]
        per_device = self.cores_per_device
        counts: list[LeftoverCount] = []
        for sem in sems:
            with sem.cv:
                values = [int(v) for v in sem.count_by_core]
            counts.extend(
                LeftoverCount(
                    semaphore_id=int(sem.id),
                    device_id=gci // per_device,
                    core_id=gci % per_device,
                    count=value,
                    is_barrier=self.is_barrier_semaphore(sem),
                )
                for gci, value in enumerate(values)
                if value != 0
            )
        return counts


@dataclasses.dataclass(frozen=True)
class WaitStart:
    """A device began waiting on a semaphore (``dma_wait`` or ``semaphore_wait``)."""

    run: InterpretRun
    semaphore_id: int
    device_id: int
    core_id: int
    global_core_id: int
    value: int
    is_dma: bool
    is_barrier: bool
    location: str | None
    read_count: Callable[[], int]


@dataclasses.dataclass(frozen=True)
class DmaStart:
    """A copy was started (in eager mode it has also run by the time it is reported)."""

    run: InterpretRun
    src_device_id: int
    dst_device_id: int
    send_semaphore_id: int | None
    recv_semaphore_id: int
    location: str | None


@dataclasses.dataclass(frozen=True)
class SignalSent:
    """A ``semaphore_signal`` reached a semaphore (DMA completions are DmaStart)."""

    run: InterpretRun
    semaphore_id: int
    device_id: int
    sender_device_id: int
    location: str | None


@dataclasses.dataclass(frozen=True)
class LeftoverCount:
    """A semaphore with a non-zero count on one core when every device had finished."""

    semaphore_id: int
    device_id: int
    core_id: int
    count: int
    is_barrier: bool


@dataclasses.dataclass(frozen=True)
class RaceReport:
    """A race found by interpret mode's happens-before detector."""

    access: Literal["read", "write"]
    accessor: tuple[int, int]
    buffer: tuple[object, ...]
    location: str | None
    message: str
    other_location: str | None = None  # the earlier access it raced with
    device_count: int | None = None  # of the run: lower accessor ids are devices, not DMAs


class InterpretObserver(Protocol):
    """Receives probe events; called from the interpreter's device threads."""

    def wait_started(self, token: int, wait: WaitStart) -> None: ...
    def wait_finished(self, token: int) -> None: ...
    def dma_started(self, dma: DmaStart) -> None: ...
    def semaphore_signalled(self, signal: SignalSent) -> None: ...
    def device_thread(self, run: InterpretRun, device_id: int) -> None: ...
    def kernel_exited(self, run: InterpretRun, device_id: int) -> None: ...
    def kernel_ended(self, run: InterpretRun, counts: Sequence[LeftoverCount]) -> None: ...
    def race_detected(self, race: RaceReport) -> None: ...
    def run_failed(
        self, run: InterpretRun, error: BaseException, device_id: int | None
    ) -> None: ...
    def callback_failed(self, error: BaseException) -> bool: ...


# --------------------------------------------------------------------------
# The user's line


_SAFEDMA_DIR = os.path.dirname(os.path.abspath(safedma.__file__)) + os.sep
_KERNELS_DIR = os.path.join(_SAFEDMA_DIR, "kernels") + os.sep


def _is_library_file(path: str) -> bool:
    """A file of safedma's library (not its ``kernels``, which are code like the user's)."""
    full = os.path.abspath(path)
    return full.startswith(_SAFEDMA_DIR) and not full.startswith(_KERNELS_DIR)


def _source_info_util() -> ModuleType:
    return private_module("jax._src.source_info_util")


def exception_location(error: BaseException) -> str | None:
    """The user's line an exception raised in a kernel came from, if it can be told.

    An interpreter step that raised (an out-of-bounds ``get``, a copy) was
    handed the kernel equation's ``source_info``; an exception raised by the
    user's own code (a ``jax.debug.callback``) has the user's frame in its
    traceback.  The innermost of either wins.
    """
    frames: list[tuple[str, int, str, Mapping[str, object]]] = []
    tb: TracebackType | None = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name, tb.tb_frame.f_locals))
        tb = tb.tb_next
    try:
        is_user = private_callable(_source_info_util(), "is_user_filename")
    except Exception:
        return None
    for filename, line, name, local in reversed(frames):
        info = local.get("source_info")
        if info is None and "self" in local:
            info = getattr(local["self"], "source_info", None)
        if info is None and "eqn" in local:  # the interpreter's loop over a kernel's equations
            info = getattr(local["eqn"], "source_info", None)
        if info is not None:
            where = user_location(info)
            if where is not None:
                return where
        if bool(is_user(filename)) and not _is_library_file(filename):
            return f"{filename}:{line} ({name})"
    return None


# --------------------------------------------------------------------------
# Parameters and status


def _interpret_module(name: str) -> ModuleType:
    return private_module(name)


def races_raise_natively() -> bool:
    """True where interpret mode raises on a race itself (jax >= 0.11: ``on_race``)."""
    state = getattr(_interpret_module(_RDS), "RaceDetectionState", None)
    return "on_race" in getattr(state, "__dataclass_fields__", {})


def large_callback_copies_can_hang() -> bool:
    """Whether a run of 8 or more devices with 100 KiB or more per device can hang.

    jax's ``io_callback``, through which the interpreter runs each device, copies every
    argument onto the first CPU device. jaxlib's CPU client copies a buffer under
    100 KiB inline (XLA's ``kSmallDataTransferByteSize``) and queues a larger one on its
    worker threads; with jaxlib 0.10.2 and 8 or more devices the queued copy never runs
    (measured: 8 devices at 99 KiB run, at 100 KiB never finish; 7 devices at 128 KiB
    run), with jaxlib 0.11.2 and 0.12 it does (8 devices at 128 KiB in 9 s on 0.11.2).

    Decided by jaxlib's version number, the one such decision in the testing helpers:
    what changed is compiled into jaxlib's CPU client, and jax's Python code on the path
    (``io_callback``, ``device_put``, the interpreter's callbacks, the CPU client's
    creation) is the same in jax 0.10.2 and 0.11.2, so no feature tells the two apart;
    running a large copy to find out would risk the hang itself.
    """
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = [int(p) if p.isdigit() else 0 for p in version.split(".")[:2]]
    return tuple(parts) < (0, 11)


def strict_interpret_params(
    uninitialized_memory: Literal["nan", "zero"] = "nan",
) -> StrictInterpretParams:
    """Interpret mode with race detection, races fatal and DMAs run when started."""
    extra: dict[str, Any] = {}
    if "on_race" in getattr(_pltpu.InterpretParams, "__dataclass_fields__", {}):
        extra["on_race"] = "raise"
    return StrictInterpretParams(
        detect_races=True,
        dma_execution_mode="eager",
        uninitialized_memory=uninitialized_memory,
        **extra,
    )


def current_interpret_run() -> InterpretRun | None:
    """The simulated state of the kernel being interpreted now, if any."""
    memory = getattr(_interpret_module(_IPC), "_shared_memory", None)
    return None if memory is None else InterpretRun(memory)


def interpret_mode_busy() -> bool:
    """True while an interpreted kernel is running (its state exists and has not failed).

    A kernel that finished cleared the state; one that failed left it with its
    failure recorded, for debugging, until the next reset.
    """
    run = current_interpret_run()
    return run is not None and not run.failed


# Modules jax imports lazily the first time it lowers an interpret-mode
# pallas_call (pallas_call._pallas_call_lowering tries the GPU interpreter for
# every interpret= value).  An interrupt landing inside that first import
# leaves jaxlib's MLIR dialect registry half-filled ("Dialect namespace 'llvm'
# is already registered") and every later lowering fails; importing them once,
# up front and uninterrupted, closes that window.
_LAZY_IMPORTS = (
    "jax._src.pallas.mosaic.interpret.interpret_pallas_call",
    "jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call",
)
_warmed = False


def warm_up() -> None:
    """Import what jax would import lazily while lowering the first interpreted kernel."""
    global _warmed
    if _warmed:
        return
    for name in _LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # jax skips it too (no GPU support installed, say)
            pass
    _warmed = True


# --------------------------------------------------------------------------
# The probes: one entry per patched name


_wait_tokens = itertools.count(1)


@dataclasses.dataclass
class Installed:
    """The probes of one simulate: its observer, and whether it is stopping."""

    observer: InterpretObserver
    stopping: str | None = None
    #: vector-clock entries for copies in this run (``get_vector_clock_size``)
    clock_entries: int = DMA_CLOCK_ENTRIES
    #: copies of this run that found no entry of their own (``_copy_clock_entries``)
    clock_shortages: int = 0
    #: the user's line of the first of them
    clock_short_at: str | None = None
    # The user's line per source_info: a kernel equation keeps one source_info
    # object, so a loop pays for the traceback walk once, not every iteration.
    _locations: dict[int, tuple[object, str | None]] = dataclasses.field(
        default_factory=dict[int, tuple[object, str | None]]
    )

    def location(self, source_info: object) -> str | None:
        if source_info is None:
            return None
        hit = self._locations.get(id(source_info))
        if hit is not None and hit[0] is source_info:
            return hit[1]
        where = user_location(source_info)
        self._locations[id(source_info)] = (source_info, where)
        return where


def _args(fn: Callable[..., object], *args: object, **kwargs: object) -> dict[str, Any]:
    try:
        return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except TypeError:
        return {}


def _probe_wait(orig: Any, probes: Installed) -> object:
    def wait(self: Any, value: Any, global_core_id: Any, *args: Any, **kwargs: Any) -> Any:
        token = next(_wait_tokens)
        gci = int(global_core_id)
        run = InterpretRun(self.shared_memory)
        per_device = run.cores_per_device

        def read_count() -> int:
            with self.cv:
                return int(self.count_by_core[gci])

        try:
            probes.observer.wait_started(
                token,
                WaitStart(
                    run=run,
                    semaphore_id=int(self.id),
                    device_id=gci // per_device,
                    core_id=gci % per_device,
                    global_core_id=gci,
                    value=int(value),
                    is_dma=bool(kwargs.get("has_tasks", False)),
                    is_barrier=run.is_barrier_semaphore(self),
                    location=probes.location(
                        getattr(kwargs.get("logging_info"), "source_info", None)
                    ),
                    read_count=read_count,
                ),
            )
            if int(value) == 0:
                # A wait of nothing returns at once on a TPU and orders nothing (a
                # drain sized 0 on a device that sent nothing); jax's race detection
                # asserts a signal came first when none did (AssertionError)
                return None
            _semaphore_clocks.install(self)
            with _semaphore_clocks.waiting(self, int(value)):
                return orig(self, value, global_core_id, *args, **kwargs)
        finally:
            probes.observer.wait_finished(token)

    return wait


def _probe_signal(orig: Any, probes: Installed) -> object:
    def signal(self: Any, inc: Any, global_core_id: Any, *args: Any, **kwargs: Any) -> Any:
        _check_signal_target(self, global_core_id, kwargs.get("logging_info"), probes)
        _semaphore_clocks.install(self)
        with _semaphore_clocks.signalling(self, int(inc)):
            result = orig(self, inc, global_core_id, *args, **kwargs)
        info = kwargs.get("logging_info")
        source = getattr(info, "source_info", None)
        sender = getattr(info, "device_id", None)
        if source is not None and isinstance(sender, int):  # semaphore_signal, not a DMA
            run = InterpretRun(self.shared_memory)
            probes.observer.semaphore_signalled(
                SignalSent(
                    run=run,
                    semaphore_id=int(self.id),
                    device_id=int(global_core_id) // run.cores_per_device,
                    sender_device_id=sender,
                    location=probes.location(source),
                )
            )
        return result

    return signal


def _check_signal_target(semaphore: Any, global_core_id: Any, info: Any, probes: Installed) -> None:
    """A signal for a core outside the run: jax's interpreter would index its tables with
    it (a bare IndexError, or for -1 the last device, silently)."""
    run = InterpretRun(semaphore.shared_memory)
    sender = getattr(info, "device_id", None)
    source = getattr(info, "source_info", None)
    check_target(
        "semaphore signal" if isinstance(sender, int) else "remote copy",
        sender if isinstance(sender, int) else -1,
        int(global_core_id) // run.cores_per_device,
        run.cores // run.cores_per_device,
        probes.location(source),
    )


def _probe_dma_init(orig: Any, probes: Installed) -> object:
    def dma_init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        run = InterpretRun(self.dst_sem.shared_memory)
        check_target(
            "remote copy",
            int(self.src_device_id),
            int(self.dst_device_id),
            run.cores // run.cores_per_device,
            probes.location(self.source_info),
        )
        memory = self.dst_sem.shared_memory
        entries = getattr(memory, _copy_clock_entries.ATTRIBUTE, None)
        if isinstance(entries, _copy_clock_entries.CopyEntries):
            entries.hold(int(self.virtual_device_id), self.clock, self)
        src_sem = self.src_sem
        probes.observer.dma_started(
            DmaStart(
                run=InterpretRun(self.dst_sem.shared_memory),
                src_device_id=int(self.src_device_id),
                dst_device_id=int(self.dst_device_id),
                send_semaphore_id=None if src_sem is None else int(src_sem.id),
                recv_semaphore_id=int(self.dst_sem.id),
                location=probes.location(self.source_info),
            )
        )

    return dma_init


def _probe_exit(orig: Any, probes: Installed) -> object:
    def nonzero(self: Any, device_id: Any) -> Any:
        probes.observer.kernel_exited(InterpretRun(self), int(device_id))
        return orig(self, device_id)

    return nonzero


def _probe_clear(orig: Any, probes: Installed) -> object:
    ipc = _interpret_module(_IPC)

    def clear() -> Any:
        memory = getattr(ipc, "_shared_memory", None)
        if memory is not None:
            run = InterpretRun(memory)
            probes.observer.kernel_ended(run, run.nonzero_counts())
        return orig()

    return clear


def _probe_set_failed(orig: Any, probes: Installed) -> object:
    def set_failed(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = _args(orig, self, *args, **kwargs)
        error = bound.get("exception")
        device = bound.get("device_id")
        thread = bound.get("failed_thread")
        if device is None and isinstance(thread, tuple) and thread:
            device = cast("tuple[object, ...]", thread)[0]
        if isinstance(error, BaseException):
            probes.observer.run_failed(
                InterpretRun(self), error, None if device is None else int(cast(int, device))
            )
        return orig(self, *args, **kwargs)

    return set_failed


def _probe_virtual_device(orig: Any, probes: Installed) -> object:
    def virtual_device_id(self: Any) -> int:
        cores, size = int(self.num_cores), int(self.vector_clock_size)
        if size <= cores:
            return int(orig(self))
        entries = _copy_clock_entries.entries_of(self, cores, size - cores)
        # jax's dma_start draws the entry while building the DMA, whose clock is
        # its local ``clock``: the issuing core's clock as the copy starts.
        caller = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
        before = entries.shortages
        position = entries.assign(caller.f_locals.get("clock"))
        if entries.shortages != before:
            probes.clock_shortages += 1
            if probes.clock_short_at is None:
                probes.clock_short_at = probes.location(caller.f_locals.get("source_info"))
        return position

    return virtual_device_id


def _probe_allocate(orig: Any, probes: Installed) -> object:
    def allocate_buffer(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        parts = cast("tuple[object, ...]", key) if isinstance(key, tuple) else ()
        if len(parts) > 2:
            probes.observer.device_thread(InterpretRun(self), int(cast(int, parts[2])))
        return orig(self, key, *args, **kwargs)

    return allocate_buffer


def _probe_race_check(access: Literal["read", "write"]) -> Callable[[Any, Installed], object]:
    def make(orig: Any, probes: Installed) -> object:
        # where the accessed range is among the arguments (after ``self``): jax 0.12
        # passes (thread, clock, buffer_key, rnge, ...), 0.10.2 (device_id,
        # local_core_id, clock, buffer_key, rnge, ...)
        names = list(inspect.signature(orig).parameters)
        at = names.index("rnge") - 1 if "rnge" in names else -1

        def check(self: Any, *args: Any, **kwargs: Any) -> Any:
            rnge = args[at] if 0 <= at < len(args) else kwargs.get("rnge")
            if _empty_range(rnge):
                # A copy of zero rows (a row that stays home in a scatter, sized 0 by
                # a table) touches no memory; jax's overlap test counts [3:3] as
                # overlapping [3:4], so it is neither checked nor recorded.
                return None
            try:
                return orig(self, *args, **kwargs)
            except RuntimeError as err:
                message = str(err)
                if not message.startswith("RACE DETECTED"):
                    raise
                bound = _args(orig, self, *args, **kwargs)
                try:
                    if "thread" in bound:
                        who = tuple(int(v) for v in bound["thread"])
                    else:
                        who = (int(bound["device_id"]), int(bound["local_core_id"]))
                    accessor = (who[0], who[1] if len(who) > 1 else 0)
                    buffer = tuple(bound.get("buffer_key", ()))
                except Exception:  # only for messages
                    accessor, buffer = (-1, -1), ()
                probes.observer.race_detected(
                    RaceReport(
                        access=access,
                        accessor=accessor,
                        buffer=buffer,
                        location=user_location(bound.get("source_info")),
                        message=message,
                        other_location=_other_access_location(message),
                        device_count=_device_count(),
                    )
                )
                raise

        return check

    return make


def _empty_range(rnge: object) -> bool:
    """True for an accessed range with a zero-length slice in some dimension."""
    if not isinstance(rnge, tuple):
        return False
    for part in cast("tuple[object, ...]", rnge):
        if isinstance(part, slice):
            sliced = cast("slice[object, object, object]", part)
            start, stop, step = sliced.start, sliced.stop, sliced.step
            if isinstance(start, int) and isinstance(stop, int):
                if len(range(start, stop, step if isinstance(step, int) and step else 1)) == 0:
                    return True
    return False


def _empty_shape(rnge: tuple[object, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    """The shape an access of ``rnge`` reads from an array of shape ``full``."""
    shape: list[int] = []
    for k, size in enumerate(full):
        part = rnge[k] if k < len(rnge) else slice(0, size, 1)
        if isinstance(part, slice):
            sliced = cast("slice[int, int, int | None]", part)
            shape.append(len(range(sliced.start, sliced.stop, sliced.step or 1)))
    return tuple(shape)


def _probe_buffer_read(orig: Any, probes: Installed) -> object:
    del probes

    def getitem(self: Any, rnge: Any) -> Any:
        if _empty_range(rnge):
            # An empty window is in bounds even where it starts at the buffer's end
            # (a copy of 0 rows after the last one); jax raises "entirely out of bounds"
            shape = _empty_shape(cast("tuple[object, ...]", rnge), tuple(self.logical_shape))
            return np.empty(shape, dtype=self.content.dtype)
        return orig(self, rnge)

    return getitem


def _probe_buffer_write(orig: Any, probes: Installed) -> object:
    del probes

    def setitem(self: Any, rnge: Any, value: Any) -> Any:
        if _empty_range(rnge):
            return None  # nothing to write (see _probe_buffer_read)
        return orig(self, rnge, value)

    return setitem


def _device_count() -> int | None:
    """How many devices the kernel being interpreted runs on (only for messages)."""
    try:
        run = current_interpret_run()
        return None if run is None else run.cores // run.cores_per_device
    except Exception:
        return None


def _other_access_location(message: str) -> str | None:
    """The line of the earlier access a race report names, when it is the user's.

    jax keeps only a formatted frame (``file:line:col (function)``) for each
    recorded access and prints it at the end of the access's line
    (``write of KEY[RANGE] from THREAD, FRAME``; ``pallas_call`` stands for
    the interpreter's own copy of the outputs).  Only for messages: anything
    unexpected gives None.
    """
    accesses = [
        line.strip()
        for line in message.splitlines()
        if line.strip().startswith(("read of", "write of"))
    ]
    found = _FRAME.search(accesses[1]) if len(accesses) > 1 else None
    if found is None or _is_library_file(found.group(1)):
        return None
    return found.group(0)


#: ``path:line[:col] (function)`` at the end of a line of jax's race report.
_FRAME = re.compile(r"(\S+):\d+(?::\d+)? \([^()]*\)$")


def _race_print(*args: object, **kwargs: Any) -> None:
    text = " ".join(str(a) for a in args)
    if text.startswith("RACE DETECTED"):
        raise RuntimeError(text)
    builtins.print(*args, **kwargs)


def _probe_race_print(orig: Any, probes: Installed) -> object:
    return _race_print


def _probe_race_frames(orig: Any, probes: Installed) -> object:
    """The race detector's ``source_info_util`` module, with ``summarize`` naming the user's line.

    jax formats the frame of every recorded access when it is made (one
    ``summarize``: the first frame outside jax), and a race names the earlier
    access only by that text.  For a copy built with safedma that frame is
    safedma's ``start``, and for one started by a kernel's helper it is the
    helper's line, the same for every copy: the user's line (and the helper's
    caller) is kept instead, as for the later access.
    """

    def summarize(source_info: Any, *args: Any, **kwargs: Any) -> str:
        where = probes.location(source_info)
        if where is not None:
            return where
        return str(orig.summarize(source_info, *args, **kwargs))

    proxy = ModuleType(orig.__name__)
    proxy.__dict__.update(cast("dict[str, object]", vars(orig)))
    setattr(proxy, "summarize", summarize)
    return proxy


def _exit_print(*args: object, **kwargs: Any) -> None:
    text = " ".join(str(a) for a in args)
    if text.startswith("Semaphore ") and "at kernel exit" in text:
        return  # simulate reports every one of them itself, as an error
    builtins.print(*args, **kwargs)


def _probe_exit_print(orig: Any, probes: Installed) -> object:
    return _exit_print


class _InitGuard:
    """Stands in for the interpreter's state lock, to keep other kernels out of a simulation.

    ``_initialize_shared_memory`` takes this lock first thing in every
    interpreted kernel, on every device, before it joins or creates the one
    global simulated TPU; a kernel that is not simulate's own (another thread's
    plain interpret-mode ``pallas_call``) is refused there, before it can touch
    the simulation's state.
    """

    def __init__(self, lock: Any, probes: Installed) -> None:
        self._lock = lock
        self._probes = probes

    def __enter__(self) -> bool:
        caller = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
        if caller.f_code.co_name == "_initialize_shared_memory":
            params = caller.f_locals.get("interpret_params")
            if self._probes.stopping is not None:
                raise StopRun(self._probes.stopping)
            if params is not None and not isinstance(params, StrictInterpretParams):
                raise ConcurrentInterpretError(
                    "an interpret-mode kernel started in another thread while "
                    "safedma.testing.simulate was running; interpret mode keeps one "
                    "simulated TPU per process, so this kernel was refused to keep "
                    "both runs correct. Run it after simulate returns (or inside the "
                    "function given to simulate)."
                )
        return bool(self._lock.__enter__())

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return bool(self._lock.acquire(*args, **kwargs))

    def release(self) -> None:
        self._lock.release()


def _probe_init_lock(orig: Any, probes: Installed) -> object:
    return _InitGuard(orig, probes)


class _SemaphoreIndexOutOfRange(IndexError):
    """A semaphore array indexed outside its length (raised on the device that did it)."""


def _check_semaphore_indices(where: str | None, shape: tuple[int, ...], *values: Any) -> None:
    # values: (dimension, first index, count) triples, flattened.
    for k in range(0, len(values), 3):
        dim, first, count = (int(values[k]), int(values[k + 1]), int(values[k + 2]))
        if first < 0 or first + count > shape[dim]:
            at = f" at {where}" if where else ""
            what = f"index {first}" if count == 1 else f"slice [{first}:{first + count}]"
            raise _SemaphoreIndexOutOfRange(
                f"semaphore {what}{at} is out of range for a semaphore array of shape "
                f"{shape} (dimension {dim}); on a TPU it touches another semaphore. "
                "jax's interpreter would clamp it to the last one and run on"
            )


def _semaphore_bounds(transforms: Any, probes: Installed) -> None:
    """Add a run-time bounds check for each semaphore index the interpreter will clamp.

    Called at the interpreter's lowering, inside its loop over the kernel's
    equations, so the caller's ``eqn`` names the user's line.
    """
    import jax  # noqa: PLC0415 (jax is imported by then; kept local to this probe)

    caller = sys._getframe(2)  # pyright: ignore[reportPrivateUsage]
    eqn = caller.f_locals.get("eqn")
    where = probes.location(getattr(eqn, "source_info", None))
    for transform in transforms or ():
        indices = getattr(transform, "indices", None)
        shape = getattr(transform, "shape", None)
        if indices is None or shape is None:
            continue
        values: list[Any] = []
        for dim, index in enumerate(indices):
            if hasattr(index, "start") and hasattr(index, "size"):
                values += [dim, index.start, index.size]
            elif getattr(index, "shape", ()) == () or isinstance(index, int):
                values += [dim, index, 1]
        if values:
            jax.debug.callback(
                functools.partial(_check_semaphore_indices, where, tuple(int(d) for d in shape)),
                *values,
            )


def _probe_state_discharge(orig: Any, probes: Installed) -> object:
    """The interpreter's ``state_discharge`` module, with transform_array checking bounds.

    The interpreter indexes a kernel's array of semaphore ids with
    ``state_discharge.transform_array`` (its only use there), where jax clamps
    an out-of-range index: ``sems.at[n]`` on an array of n semaphores becomes
    the last semaphore and a wrong kernel runs clean.
    """

    def transform_array(x: Any, transforms: Any) -> Any:
        _semaphore_bounds(transforms, probes)
        return orig.transform_array(x, transforms)

    proxy = ModuleType(orig.__name__)
    proxy.__dict__.update(cast("dict[str, object]", vars(orig)))
    setattr(proxy, "transform_array", transform_array)
    return proxy


@dataclasses.dataclass(frozen=True)
class _Probe:
    """One patched name: where it lives, why it is patched, and what replaces it."""

    module: str
    owner: str | None  # a class of the module, or None for a module global
    name: str
    make: Callable[[Any, Installed], object]
    why: str
    only_if: Callable[[], bool] = lambda: True
    absent_ok: bool = False  # a module global that normally does not exist


_PROBES: tuple[_Probe, ...] = (
    _Probe(
        _SHM,
        "Semaphore",
        "wait",
        _probe_wait,
        why=(
            "who waits on which semaphore for what: interpret mode polls a wait that "
            "nothing can satisfy forever, with no hook to see it (R3, deadlock check); "
            "and which signals the wait consumes, so it is ordered after those only "
            "(_semaphore_clocks: jax orders it after every signal so far, R9)"
        ),
    ),
    _Probe(
        _SHM,
        "Semaphore",
        "signal",
        _probe_signal,
        why=(
            "which device signalled which semaphore from which line (semaphore_signal "
            "passes its source_info only to jax's optional logging): the hints of a "
            "leftover REGULAR or BARRIER count (R2); each signal's amount and clock, "
            "kept in arrival order for the waits (_semaphore_clocks); and a target core "
            "outside the run, which jax indexes its tables with (_off_mesh)"
        ),
    ),
    _Probe(
        _SHM,
        "Buffer",
        "__getitem__",
        _probe_buffer_read,
        why=(
            "a window of 0 rows starting at the end of a buffer (a copy sized 0 at "
            "the last offset, as in production MoE kernels) is in bounds on a TPU; "
            "jax's Buffer raises IndexError 'entirely out of bounds' for it"
        ),
    ),
    _Probe(
        _SHM,
        "Buffer",
        "__setitem__",
        _probe_buffer_write,
        why=("the write side of the empty window above: jax raises 'out of bounds'"),
    ),
    _Probe(
        _IPC,
        "DMA",
        "__init__",
        _probe_dma_init,
        why=(
            "which copy signals which semaphore on which device, started at which "
            "line: the hints of R2/R3 (no public record of started copies); and a "
            "target device outside the run, refused before the copy runs (_off_mesh)"
        ),
    ),
    _Probe(
        _SHM,
        "SharedMemory",
        "get_sempahores_with_nonzero_count",
        _probe_exit,
        why=(
            "(sic) called once per device by _validate when its kernel body returns: "
            "a device that exited cannot signal any more (deadlock check)"
        ),
    ),
    _Probe(
        _IPC,
        None,
        "_clear_shared_memory",
        _probe_clear,
        why=(
            "the clean-up barrier's action, run once every device has finished: the "
            "one moment every count is final. _validate reads each device as it exits "
            "(a peer may still signal it) and prints only the first leftover (R2)"
        ),
    ),
    _Probe(
        _SHM,
        "SharedMemory",
        "set_failed",
        _probe_set_failed,
        why=(
            "the first failure of a run is its root cause; the error XLA hands back "
            "is whichever device failed first in XLA, often a secondary "
            "BrokenBarrierError (jax's own TODO in SharedMemory.check_failed)"
        ),
    ),
    _Probe(
        _SHM,
        "SharedMemory",
        "get_random_virtual_device_id",
        _probe_virtual_device,
        why=(
            "the vector-clock entry of each copy: jax draws it at random, so two "
            "copies in flight together could share one and a read ordered after "
            "the wait of one counted as ordered after the other (a race missed at "
            "random); an entry is reused only once the issuing core knows its last "
            "copy completed (_copy_clock_entries), and runs are repeatable"
        ),
    ),
    _Probe(
        _SHM,
        "SharedMemory",
        "allocate_buffer",
        _probe_allocate,
        why=(
            "every device allocates its buffers on its own thread at kernel start: "
            "names the device of an error raised outside the interpreter "
            "(a jax.debug.callback), which jax does not record"
        ),
    ),
    _Probe(
        _RDS,
        "RaceDetectionState",
        "check_read",
        _probe_race_check("read"),
        why=("who raced on which buffer: jax only formats it into its message (R1)"),
    ),
    _Probe(
        _RDS,
        "RaceDetectionState",
        "check_write",
        _probe_race_check("write"),
        why=("who raced on which buffer, for a write: jax only formats it into its message (R1)"),
    ),
    _Probe(
        _RDS,
        None,
        "source_info_util",
        _probe_race_frames,
        why=(
            "the earlier access of a race is named only by the frame jax formatted "
            "when it was recorded (source_info_util.summarize, the first frame "
            "outside jax): for a copy built with safedma that is safedma's own "
            "start; it is the user's line here, as for the later access (R1)"
        ),
    ),
    _Probe(
        _RDS,
        None,
        "print",
        _probe_race_print,
        only_if=lambda: not races_raise_natively(),
        absent_ok=True,
        why=(
            "jax 0.10 only prints a race and sets a flag (no on_race parameter "
            "before 0.11); a module-level print that raises stops at the first race "
            "as 0.12 does (R1)"
        ),
    ),
    _Probe(
        _IPC,
        None,
        "print",
        _probe_exit_print,
        absent_ok=True,
        why=(
            "_validate prints the first leftover semaphore of each device to stdout; "
            "simulate raises LeftoverSemaphoreError listing all of them, so the print "
            "is only noise (module-level print shadowed, other prints pass through)"
        ),
    ),
    _Probe(
        _IPC,
        None,
        "state_discharge",
        _probe_state_discharge,
        why=(
            "the interpreter picks a semaphore out of a semaphore array with "
            "state_discharge.transform_array, which clamps an out-of-range index to "
            "the last semaphore: a kernel using sems.at[n] of n semaphores ran clean"
        ),
    ),
    _Probe(
        _IPC,
        None,
        "_shared_memory_init_lock",
        _probe_init_lock,
        why=(
            "interpret mode has one global simulated TPU (jax's TODO at "
            "_shared_memory: 'support multiple instances'); a plain interpret-mode "
            "kernel started in another thread would join or clear simulate's state "
            "(seen as AssertionError in _get_shared_memory); refused at its first step"
        ),
    ),
)

_MISSING = object()


def _target(probe: _Probe) -> tuple[object, Any, Any]:
    """The object that holds the probed name, the value to wrap, and what to put back.

    What to put back is the holder's own entry, or ``_MISSING`` when the name
    is inherited (jax 0.12 defines some SharedMemory methods on a base class)
    or normally absent, so restoring deletes the wrapper instead.
    """
    module = _interpret_module(probe.module)
    holder: object = module
    if probe.owner is not None:
        holder = getattr(module, probe.owner, None)
        if not isinstance(holder, type):
            raise moved(f"{probe.module}.{probe.owner}", "class missing")
    own = vars(holder).get(probe.name, _MISSING)
    current = own if isinstance(holder, ModuleType) else getattr(holder, probe.name, _MISSING)
    if current is _MISSING and not probe.absent_ok:
        where = f"{probe.module}.{probe.owner + '.' if probe.owner else ''}{probe.name}"
        raise moved(where, "name missing")
    return holder, current, own


def _check_signatures() -> None:
    """Parameters the probes read by name; checked once, before anything is patched."""
    shm, ipc, rds = (_interpret_module(m) for m in (_SHM, _IPC, _RDS))
    needs: list[tuple[str, object, tuple[str, ...]]] = [
        (
            f"{_SHM}.Semaphore.wait",
            getattr(shm.Semaphore, "wait", None),
            ("value", "global_core_id", "has_tasks", "logging_info"),
        ),
        (
            # the empty-window probes read a buffer's content and logical shape
            f"{_SHM}.Buffer.__init__",
            getattr(shm.Buffer, "__init__", None),
            ("content", "logical_shape"),
        ),
        (
            f"{_SHM}.SharedMemory.set_failed",
            getattr(shm.SharedMemory, "set_failed", None),
            ("exception", "top_level"),
        ),
    ]
    for where, fn, names in needs:
        try:
            have = tuple(inspect.signature(cast("Callable[..., object]", fn)).parameters)
        except (TypeError, ValueError):
            have = ()
        missing = [n for n in names if n not in have]
        if missing:
            raise moved(where, f"parameters {missing} missing; it takes {list(have)}")
    fields = ("id", "src_device_id", "dst_device_id", "src_sem", "dst_sem", "source_info")
    for field in (*fields, "virtual_device_id", "clock"):
        if field not in getattr(ipc.DMA, "__dataclass_fields__", {}):
            raise moved(f"{_IPC}.DMA.{field}", "field missing")
    # The copy-entry probe reads the new copy's clock from dma_start's locals; without
    # it every copy would count as sharing an entry (runs again, then refused).
    start: object = getattr(ipc, "dma_start", None)
    code = getattr(inspect.unwrap(start), "__code__", None) if callable(start) else None
    if code is None or not {"clock", "source_info"} <= set(code.co_varnames):
        raise moved(f"{_IPC}.dma_start", "locals clock and source_info missing")
    for method in ("check_read", "check_write"):
        params = set(inspect.signature(getattr(rds.RaceDetectionState, method)).parameters)
        if "buffer_key" not in params or not (
            {"thread"} <= params or {"device_id", "local_core_id"} <= params
        ):
            raise moved(
                f"{_RDS}.RaceDetectionState.{method}", f"unexpected parameters {sorted(params)}"
            )


_lock = threading.Lock()
_installed: Installed | None = None


@contextlib.contextmanager
def interpret_probes(observer: InterpretObserver) -> Generator[Installed, None, None]:
    """Report interpret-mode events to ``observer`` for the ``with`` block.

    One simulation at a time; the yielded handle's ``stopping`` refuses any
    kernel that starts after the watchdog began stopping the run.  Raises
    :class:`PrivateJaxApiError` if the interpreter internals moved.
    """
    global _installed
    _check_signatures()
    targets = [(p, *_target(p)) for p in _PROBES if p.only_if()]
    with _lock:
        if _installed is not None:
            raise RuntimeError(
                "safedma.testing.simulate is already running; interpret mode has one "
                "global state per process, so simulations cannot run concurrently"
            )
        installed = Installed(observer)
        _installed = installed
    done: list[tuple[_Probe, object, Any]] = []
    try:
        with deferred_interrupts():
            for probe, holder, current, own in targets:
                setattr(holder, probe.name, probe.make(current, installed))
                done.append((probe, holder, own))
        yield installed
    finally:
        with deferred_interrupts():  # half-restored jax would break every later run
            for probe, holder, original in reversed(done):
                if original is _MISSING:
                    delattr(holder, probe.name)
                else:
                    setattr(holder, probe.name, original)
            with _lock:
                _installed = None


#: The primitives a Pallas TPU kernel is bound as, each with an ``interpret``
#: parameter: ``pallas_call_p`` (every jax), and the primitive ``pl.kernel`` /
#: ``pl.core_map`` bind, which read the forced mode when *built* just as
#: ``pl.pallas_call`` does: ``core_map_p`` (jax 0.10, 0.11) and ``mpmd_map_p``
#: (jax 0.12, where ``core_map`` became an MPMD map).  Only pallas_call_p must
#: exist; a jax has one of the other two.
_KERNEL_PRIMITIVES: tuple[tuple[str, str, bool], ...] = (
    ("jax._src.pallas.pallas_call", "pallas_call_p", True),
    ("jax._src.pallas.core", "core_map_p", False),
    ("jax._src.pallas.mpmd", "mpmd_map_p", False),
)


def _kernel_primitives() -> list[Any]:
    found: list[Any] = []
    for module_name, name, required in _KERNEL_PRIMITIVES:
        try:
            module = private_module(module_name)
        except Exception:
            if required:
                raise
            continue
        primitive = getattr(module, name, None)
        if primitive is None or not callable(getattr(primitive, "bind", None)):
            if required:
                raise moved(f"{module_name}.{name}.bind", "primitive missing")
            continue
        found.append(primitive)
    return found


@contextlib.contextmanager
def force_interpret_params(params: _pltpu.InterpretParams) -> Generator[None, None, None]:
    """Trace every Pallas TPU kernel in the block with ``interpret=params``.

    Also kernels built before the block, whatever ``interpret=`` they were
    built with: ``pl.pallas_call(...)``, ``pl.kernel(...)`` and
    ``pl.core_map(...)`` read the forced mode
    (``pltpu.force_tpu_interpret_mode``) when they are *built*, so the strict
    parameters are substituted where their primitive is bound (trace time,
    before effects are computed), the one place every call passes.  A kernel
    left with its own parameters would be refused at its first step as if
    another thread had started it.
    """
    patched: list[tuple[Any, bool, Any]] = []

    def forcing(orig: Any) -> Callable[..., Any]:
        def bind(*args: Any, **kwargs: Any) -> Any:
            if "interpret" in kwargs:
                kwargs["interpret"] = params
            return orig(*args, **kwargs)

        return bind

    primitives = _kernel_primitives()
    try:
        with deferred_interrupts():
            for primitive in primitives:
                patched.append((primitive, "bind" in vars(primitive), primitive.bind))
                primitive.bind = forcing(primitive.bind)
        with _pltpu.force_tpu_interpret_mode(params):
            yield
    finally:
        with deferred_interrupts():
            for primitive, shadowed, orig in reversed(patched):
                if shadowed:
                    primitive.bind = orig
                else:
                    del primitive.bind


@contextlib.contextmanager
def unfiltered_tracebacks() -> Generator[None, None, None]:
    """Keep jax's own frames in tracebacks raised in the block.

    An error jax's interpreter raises while lowering a kernel names the
    kernel equation it was interpreting only in its own frames
    (``_interpret_jaxpr``'s ``eqn``); jax's default traceback filtering
    removes them.  ``jax._src.config.traceback_filtering`` is the context
    manager form of ``JAX_TRACEBACK_FILTERING``, private.
    """
    state = getattr(private_module("jax._src.config"), "traceback_filtering", None)
    if state is None or not callable(state):
        yield
        return
    with cast("contextlib.AbstractContextManager[object]", state("off")):
        yield


# Loggers jax reports a failing host callback on ("jax.io_callback failed",
# "jax.debug.callback failed"), with the exception attached.  Public logging,
# but the logger names are jax's module paths.
_CALLBACK_LOGGERS = ("jax._src.callback", "jax._src.debugging")


@contextlib.contextmanager
def callback_failures(observer: InterpretObserver) -> Generator[None, None, None]:
    """Tell ``observer`` about every failing host callback, at once, on its thread.

    A kernel whose ``jax.debug.callback`` raises on one device stops only that
    device; the others wait for it forever.  jax logs the failure on the
    failing thread before anything else happens, which is the earliest point
    to see it.  Records the observer claims (failures of the simulated run,
    which simulate reports itself) are dropped from the log.
    """

    class _Seen(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            error = record.exc_info[1] if record.exc_info else None
            if error is None:
                return True
            return not observer.callback_failed(error)

    seen = _Seen()
    loggers = [logging.getLogger(name) for name in _CALLBACK_LOGGERS]
    for logger in loggers:
        logger.addFilter(seen)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(seen)
