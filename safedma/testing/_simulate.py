"""Strict simulation: run TPU kernels in interpret mode on CPU, where misuse fails loudly.

TPU interpret mode can simulate DMAs and semaphores over several CPU
devices, but by default a race only sets a flag (jax 0.10), a semaphore left
non-zero at kernel exit is only printed (first one per device), and a wait
that can never be satisfied hangs the process.  On a TPU those are silent
corruption, a crash and a hang.  :func:`simulate` runs a function under
interpret mode with races fatal and DMAs executed eagerly, and turns each of
those into a :class:`SimulationError` naming the device, the semaphore and
the kernel line (rows R1 to R4 of the misuse catalogue).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar, cast

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from safedma._errors import SafeDmaError
from safedma.testing import _private

__all__ = [
    "KernelFailedError",
    "LeftoverSemaphore",
    "LeftoverSemaphoreError",
    "NotEnoughDevicesError",
    "Race",
    "RaceDetectedError",
    "SimulationError",
    "SimulationTimeoutError",
    "StuckWait",
    "UnsatisfiableWaitError",
    "simulate",
    "simulated_mesh",
]

T = TypeVar("T")

# Typed handle on an unannotated JAX constructor (see _compile.py).
_partition_spec: Callable[..., PartitionSpec] = PartitionSpec
# jaxlib's exception class is untyped for pyright; the other jax functions whose
# signatures jax leaves partly unannotated are marked at each use
# (pyright: ignore[reportUnknownMemberType]). getattr, not cast(): see _compile.py.
_JaxRuntimeError: type[Exception] = getattr(jax.errors, "JaxRuntimeError")

#: After the watchdog fails a run, how long the devices get to notice (they
#: poll every 0.1 s) before the interpreter's barriers are broken, and again
#: before simulate gives up on the run.
_GRACE_S = 5.0

#: Starts the message of the failure the watchdog injects into a run.
_STOPPED = "stopped by safedma.testing.simulate"


# --------------------------------------------------------------------------
# Errors and what they carry


class SimulationError(SafeDmaError):
    """A kernel misbehaved under strict simulation; the message says where and how to fix it."""


class NotEnoughDevicesError(SimulationError):
    """The process has fewer host CPU devices than the simulated mesh needs."""


@dataclasses.dataclass(frozen=True)
class Race:
    """One race found by interpret mode's race detector.

    ``accessor`` names who made the access that found the race (a device, or
    ``DMA #n`` for a copy); ``buffer`` is interpret mode's key of the ref:
    ``(memory space, buffer id, owning device, core)``; ``report`` is
    interpret mode's own description of both accesses.
    """

    access: Literal["read", "write"]
    accessor: str
    owner: str | None
    buffer: tuple[object, ...]
    location: str | None
    report: str


class RaceDetectedError(SimulationError):
    """R1: a ref was touched while a copy that reads or writes it was in flight."""

    def __init__(self, races: Sequence[Race]) -> None:
        self.races = tuple(races)
        first = self.races[0]
        space = str(first.buffer[0]).upper() if first.buffer else ""
        # Spelled-out letters: "an HBM", "an SMEM", "a VMEM".
        article = "an" if space[:1] in tuple("AEFHILMNORSX") else "a"
        what = f"{article} {space} buffer" if space else "a buffer"
        on = f" on {first.owner}" if first.owner else ""
        if first.location:
            where = f" at {first.location}"
        else:
            where = (" while copying the kernel's outputs back after the body "
                     "returned (a copy into an output was still in flight)")
        # The vector clocks in jax's report are object reprs (0.12) or raw
        # counters (0.10): noise for a reader, so they are left out here.
        report = "\n".join(
            line for line in first.report.rstrip().splitlines()
            if not line.strip().startswith("clock:")
        )
        super().__init__(
            f"data race (R1): a {first.access} of {what}{on} by {first.accessor}"
            f"{where} is not ordered after a copy that touches the same memory. A "
            "copy's destination may be read only after its wait, and its source "
            "overwritten only after its wait (wait_send for a remote copy).\n\n"
            f"Interpret mode's report:\n{report}"
        )


@dataclasses.dataclass(frozen=True)
class LeftoverSemaphore:
    """A semaphore whose count was not zero on a device when the kernel returned.

    ``count`` is in bytes for a DMA semaphore; ``kernel`` numbers the
    interpreted kernels of the run from 0.
    """

    kernel: int
    device_id: int
    device: str
    semaphore_id: int
    kind: Literal["DMA", "REGULAR", "BARRIER"]
    count: int
    hint: str


class LeftoverSemaphoreError(SimulationError):
    """R2/R4: semaphores not back to zero at kernel exit; every one, on every device."""

    def __init__(self, leftovers: Sequence[LeftoverSemaphore]) -> None:
        self.leftovers = tuple(leftovers)
        lines: list[str] = []
        for item in self.leftovers:
            unit = " bytes" if item.kind == "DMA" else ""
            kernel = f"kernel {item.kernel}, " if item.kernel else ""
            lines.append(
                f"  {kernel}{item.device}: {item.kind} semaphore {item.semaphore_id} "
                f"holds {item.count}{unit}: {item.hint}"
            )
        n = len(self.leftovers)
        super().__init__(
            f"{n} semaphore count{'s' if n != 1 else ''} not back to zero at kernel "
            "exit (R2; on a TPU this crashes the program):\n" + "\n".join(lines)
        )


@dataclasses.dataclass(frozen=True)
class StuckWait:
    """A device that was still waiting on a semaphore when the watchdog fired.

    ``value`` (what the wait needs) and ``count`` (what the semaphore held)
    are in bytes for a DMA wait.
    """

    device_id: int
    device: str
    semaphore_id: int
    kind: Literal["DMA", "REGULAR", "BARRIER"]
    value: int
    count: int
    location: str | None
    hint: str


class UnsatisfiableWaitError(SimulationError):
    """R3: a wait that can never be satisfied; on a TPU the kernel hangs."""

    def __init__(self, waits: Sequence[StuckWait], timeout_s: float) -> None:
        self.waits = tuple(waits)
        self.timeout_s = timeout_s
        lines: list[str] = []
        for w in self.waits:
            unit = " bytes" if w.kind == "DMA" else ""
            where = f" at {w.location}" if w.location else ""
            lines.append(
                f"  {w.device} waits{where} on {w.kind} semaphore {w.semaphore_id} "
                f"for {w.value}{unit}, the count is {w.count}: {w.hint}"
            )
        super().__init__(
            f"unsatisfiable wait (R3): the kernel did not finish within "
            f"timeout_s={timeout_s:g} s and these waits can never be satisfied "
            "(on a TPU the kernel hangs):\n" + "\n".join(lines)
        )


class SimulationTimeoutError(SimulationError):
    """The run did not finish in time and no device was waiting on a semaphore.

    ``stopped`` is False when even the watchdog could not stop the run: its
    thread is left behind and the process should not run more simulations.
    """

    def __init__(self, message: str, stopped: bool) -> None:
        super().__init__(message)
        self.stopped = stopped


class KernelFailedError(SimulationError):
    """Interpret mode raised an error of its own (out-of-bounds access, bad arguments, ...)."""


# --------------------------------------------------------------------------
# Meshes


def simulated_mesh(shape: int | Sequence[int], axis_names: str | Sequence[str]) -> Mesh:
    """A mesh of host CPU devices, so multi-device kernels can be simulated on CPU.

    jax fixes the number of host devices when it initialises, from
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N``; set it before jax
    is imported.  From pytest, in a ``conftest.py`` that runs before any test
    module imports jax::

        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

    From a script, the same two lines at the top, before ``import jax``.
    Raises :class:`NotEnoughDevicesError` when there are too few devices.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if len(dims) != len(names):
        raise ValueError(f"mesh shape {dims} and axis names {names} differ in length")
    # Checked at run time too, for callers without a type checker.
    if any(not isinstance(cast(object, d), int) or isinstance(d, bool) or d < 1 for d in dims):
        raise ValueError(f"mesh shape {dims} must be positive integers")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names {names} must be distinct")
    needed = math.prod(dims)
    devices = cast("list[object]", jax.devices("cpu"))  # pyright: ignore[reportUnknownMemberType]
    if len(devices) < needed:
        raise NotEnoughDevicesError(
            f"a simulated mesh of shape {dims} needs {needed} host CPU devices but "
            f"jax has {len(devices)}. jax reads the count once, when it initialises: "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={max(needed, 8)} "
            "before jax is imported (in pytest, at the top of a conftest.py via "
            "os.environ; in a script, before `import jax`)."
        )
    return jax.make_mesh(  # pyright: ignore[reportUnknownMemberType]
        dims, names, devices=devices[:needed]
    )


class _DeviceNames:
    """Turns interpret mode's logical device ids into mesh coordinates for messages."""

    def __init__(self, mesh: Mesh | None) -> None:
        self._shape = tuple(int(s) for s in mesh.devices.shape) if mesh is not None else ()
        self._names = tuple(str(n) for n in mesh.axis_names) if mesh is not None else ()
        self.count = math.prod(self._shape) if mesh is not None else 1

    def label(self, device_id: int) -> str:
        if not self._shape or not 0 <= device_id < self.count:
            return f"device {device_id}"
        coords = np.unravel_index(device_id, self._shape)
        where = ", ".join(f"{n}={int(c)}" for n, c in zip(self._names, coords))
        return f"device {device_id} ({where})"


# --------------------------------------------------------------------------
# What the probes saw


_Kind = Literal["DMA", "REGULAR", "BARRIER"]


class _Recorder:
    """Collects probe events from the interpreter's device threads (thread-safe)."""

    def __init__(self, devices: _DeviceNames) -> None:
        self._devices = devices
        self._lock = threading.Lock()
        self._waits: dict[int, _private.WaitStart] = {}
        self._runs: dict[int, int] = {}
        self._keep: list[_private.InterpretRun] = []
        # (run, semaphore, role, device) -> {(peer device, location): count}
        self._dmas: dict[tuple[int, int, str, int], Counter[tuple[int, str | None]]] = {}
        self.leftovers: list[tuple[int, _private.LeftoverCount]] = []
        self.races: list[Race] = []

    def _run_index(self, run: _private.InterpretRun) -> int:
        if run.key not in self._runs:
            self._runs[run.key] = len(self._runs)
            self._keep.append(run)  # keeps id() keys unique for the whole run
        return self._runs[run.key]

    # InterpretObserver
    def wait_started(self, token: int, wait: _private.WaitStart) -> None:
        with self._lock:
            self._run_index(wait.run)
            self._waits[token] = wait

    def wait_finished(self, token: int) -> None:
        with self._lock:
            self._waits.pop(token, None)

    def dma_started(self, dma: _private.DmaStart) -> None:
        with self._lock:
            run = self._run_index(dma.run)
            recv = (run, dma.recv_semaphore_id, "recv", dma.dst_device_id)
            self._dmas.setdefault(recv, Counter())[(dma.src_device_id, dma.location)] += 1
            if dma.send_semaphore_id is not None:
                send = (run, dma.send_semaphore_id, "send", dma.src_device_id)
                self._dmas.setdefault(send, Counter())[(dma.dst_device_id, dma.location)] += 1

    def semaphores_at_exit(
        self, run: _private.InterpretRun, device_id: int,
        counts: Sequence[_private.LeftoverCount],
    ) -> None:
        with self._lock:
            index = self._run_index(run)
            self.leftovers.extend((index, c) for c in counts)

    def race_detected(self, race: _private.RaceReport) -> None:
        who = race.accessor[0]
        accessor = (self._devices.label(who) if 0 <= who < self._devices.count
                    else f"DMA #{who}")
        owner_id = race.buffer[2] if len(race.buffer) > 2 else None
        owner = self._devices.label(owner_id) if isinstance(owner_id, int) else None
        with self._lock:
            self.races.append(Race(race.access, accessor, owner, race.buffer,
                                   race.location, race.message))

    # Queries, from the simulating thread
    def waiting(self) -> list[_private.WaitStart]:
        with self._lock:
            return list(self._waits.values())

    def _copies(self, run: int, sem: int, role: str, device: int) -> Counter[tuple[int, str | None]]:
        with self._lock:
            return Counter(self._dmas.get((run, sem, role, device), Counter()))

    def _kind(self, run: int, sem: int, device: int, is_barrier: bool, is_dma: bool) -> _Kind:
        if is_barrier:
            return "BARRIER"
        if is_dma or self._copies(run, sem, "recv", device) or self._copies(run, sem, "send", device):
            return "DMA"
        return "REGULAR"

    def leftover_reports(self, devices: _DeviceNames) -> list[LeftoverSemaphore]:
        reports: list[LeftoverSemaphore] = []
        for run, item in sorted(self.leftovers, key=lambda r: (r[0], r[1].device_id,
                                                               r[1].semaphore_id)):
            kind = self._kind(run, item.semaphore_id, item.device_id, item.is_barrier, False)
            hint = self._leftover_hint(run, item, kind, devices)
            reports.append(LeftoverSemaphore(
                kernel=run, device_id=item.device_id, device=devices.label(item.device_id),
                semaphore_id=item.semaphore_id, kind=kind, count=item.count, hint=hint,
            ))
        return reports

    def _leftover_hint(self, run: int, item: _private.LeftoverCount, kind: _Kind,
                       devices: _DeviceNames) -> str:
        if kind == "BARRIER":
            return ("the barrier semaphore was signalled more often than waited: a "
                    "barrier signal never waited, or over-signalled")
        if kind == "REGULAR":
            return ("signalled more than waited: a semaphore_signal never waited, or "
                    "over-signalled; every signal needs a matching semaphore_wait")
        recv = self._copies(run, item.semaphore_id, "recv", item.device_id)
        send = self._copies(run, item.semaphore_id, "send", item.device_id)
        if recv:
            (peer, location), times = recv.most_common(1)[0]
            local = peer == item.device_id
            what = "a copy" if local else f"a copy from {devices.label(peer)}"
            started = f" started at {location}" if location else ""
            repeat = f" (started {times} times)" if times > 1 else ""
            fix = "wait on its handle" if local else "wait_recv (or wait) is missing"
            loop = (" If it was started in a loop, the copy of the last iteration is "
                    "left in flight: wait for it after the loop (R4)." if times > 1 else "")
            return (f"{what}{started}{repeat} was never waited on this device, or "
                    f"waited for fewer bytes than it moved: {fix} before the kernel "
                    f"returns.{loop}")
        (peer, location), times = send.most_common(1)[0]
        started = f" started at {location}" if location else ""
        return (f"the send side of a remote copy to {devices.label(peer)}{started} was "
                "never waited: call wait_send (or wait) on its handle before the "
                "kernel returns")

    def stuck_reports(self, waits: Sequence[_private.WaitStart],
                      devices: _DeviceNames) -> list[StuckWait]:
        reports: list[StuckWait] = []
        for w in sorted(waits, key=lambda w: (w.device_id, w.semaphore_id)):
            with self._lock:
                run = self._runs.get(w.run.key, 0)
            kind = self._kind(run, w.semaphore_id, w.device_id, w.is_barrier, w.is_dma)
            try:
                count = w.read_count()
            except Exception:
                count = -1
            reports.append(StuckWait(
                device_id=w.device_id, device=devices.label(w.device_id),
                semaphore_id=w.semaphore_id, kind=kind, value=w.value, count=count,
                location=w.location, hint=self._stuck_hint(run, w, kind),
            ))
        return reports

    def _stuck_hint(self, run: int, w: _private.WaitStart, kind: _Kind) -> str:
        if kind == "BARRIER":
            return ("the barrier semaphore is waited more often than it is signalled "
                    "(an over-waited barrier): each wait needs a signal from a peer")
        if kind == "REGULAR":
            return ("the semaphore_signal this wait needs never comes: fewer signals "
                    "than waits")
        recv = sum(self._copies(run, w.semaphore_id, "recv", w.device_id).values())
        send = sum(self._copies(run, w.semaphore_id, "send", w.device_id).values())
        if not recv and not send:
            return ("no copy signalling this semaphore on this device was ever started: "
                    "the send this receiver waits for never comes (is the sender's start "
                    "skipped by a condition, or aimed at another device?)")
        copies = recv + send
        return (f"more is waited than was copied ({copies} cop{'ies' if copies != 1 else 'y'} "
                "signalled it here): a handle waited twice, or a wait for a copy that "
                "was never started")


# --------------------------------------------------------------------------
# Running


_Specs = PartitionSpec | tuple[PartitionSpec, ...] | list[PartitionSpec]


def _specs(
    specs: PartitionSpec | Sequence[PartitionSpec] | None, default: PartitionSpec,
    *, arguments: bool,
) -> _Specs:
    # shard_map matches specs to pytrees: the arguments are always a tuple, the
    # outputs keep whatever sequence type the caller (and so fn) uses.
    if specs is None:
        return default
    if isinstance(specs, PartitionSpec):
        return specs
    return list(specs) if isinstance(specs, list) and not arguments else tuple(specs)


def _place(args: tuple[ArrayLike, ...], specs: _Specs, mesh: Mesh) -> tuple[object, ...]:
    if isinstance(specs, PartitionSpec):
        per_arg: Sequence[PartitionSpec] = [specs] * len(args)
    else:
        per_arg = list(specs)
        if len(per_arg) != len(args):
            raise ValueError(
                f"in_specs has {len(per_arg)} entries for {len(args)} arguments; give "
                "one PartitionSpec per argument, or a single one for all"
            )
    return tuple(
        jax.device_put(a, NamedSharding(mesh, s))  # pyright: ignore[reportUnknownMemberType]
        for a, s in zip(args, per_arg)
    )


class _Outcome:
    """What the worker thread produced: the outputs or the exception."""

    def __init__(self) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.done = threading.Event()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _drain(recorder: _Recorder, deadline_s: float) -> None:
    # After a failure XLA may return while device threads are still leaving
    # their waits; let them go before the state is reset.
    end = time.monotonic() + deadline_s
    while recorder.waiting() and time.monotonic() < end:
        time.sleep(0.02)


_simulate_lock = threading.Lock()


def simulate(
    fn: Callable[..., T],
    *args: ArrayLike,
    mesh: Mesh | None = None,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    timeout_s: float = 60.0,
    uninitialized_memory: Literal["nan", "zero"] = "nan",
) -> T:
    """Run ``fn(*args)`` in strict TPU interpret mode, so DMA misuse fails instead of passing.

    Every ``pallas_call`` traced inside ``fn`` runs in interpret mode with race
    detection on, races fatal and DMAs executed when started; this wins over
    any ``interpret=`` it was built with, even outside ``fn`` (``pl.core_map``
    kernels are forced only when built inside ``fn``).  With ``mesh``, ``fn`` is the
    per-device body: it runs as ``jax.jit(jax.shard_map(fn, mesh=mesh, ...,
    check_vma=False))`` with the arguments placed on the mesh;
    ``in_specs`` (one spec for all arguments, or one per argument) and
    ``out_specs`` default to splitting the leading dimension over all mesh
    axes.  Returns ``fn``'s outputs.  Raises :class:`RaceDetectedError` (R1),
    :class:`LeftoverSemaphoreError` (R2, R4), :class:`UnsatisfiableWaitError`
    (R3; after ``timeout_s`` of execution, compilation not counted),
    :class:`SimulationTimeoutError`, or :class:`KernelFailedError`; after any
    of them the interpreter state is reset so the next run starts clean.
    Errors raised while tracing (safedma's own checks) propagate unchanged.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if mesh is None and (in_specs is not None or out_specs is not None):
        raise ValueError("in_specs/out_specs need a mesh: pass mesh=simulated_mesh(...)")
    if not _simulate_lock.acquire(blocking=False):
        raise RuntimeError(
            "simulate() is already running in this process; interpret mode keeps one "
            "global state, so simulations must run one at a time"
        )
    try:
        return _simulate(fn, args, mesh, in_specs, out_specs, timeout_s,
                         uninitialized_memory)
    finally:
        _simulate_lock.release()


def _simulate(
    fn: Callable[..., T],
    args: tuple[ArrayLike, ...],
    mesh: Mesh | None,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None,
    timeout_s: float,
    uninitialized_memory: Literal["nan", "zero"],
) -> T:
    devices = _DeviceNames(mesh)
    program: Callable[..., T]
    placed: tuple[object, ...]
    if mesh is None:
        program, placed = fn, tuple(args)
    else:
        names = tuple(mesh.axis_names)
        default = _partition_spec(names[0] if len(names) == 1 else names)
        ins = _specs(in_specs, default, arguments=True)
        outs = _specs(out_specs, default, arguments=False)
        placed = _place(args, ins, mesh)
        program = jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=outs,
                                check_vma=False)
    params = _private.strict_interpret_params(uninitialized_memory)
    # Leftovers of an earlier failed interpret run outside simulate() would
    # make this one fail; the lock above ensures no simulation is running.
    pltpu.reset_tpu_interpret_mode_state()

    def fresh(*flat: object) -> T:
        # A new function each time: no jit cache entry traced elsewhere is reused.
        return program(*flat)

    with _private.force_interpret_params(params):
        compiled = jax.jit(  # pyright: ignore[reportUnknownMemberType]
            fresh
        ).lower(*placed).compile()

    recorder = _Recorder(devices)
    outcome = _Outcome()

    def run() -> None:
        try:
            outcome.value = jax.block_until_ready(  # pyright: ignore[reportUnknownMemberType]
                compiled(*placed)
            )
        except BaseException as err:  # handed to the simulating thread
            outcome.error = err
        finally:
            outcome.done.set()

    failed = True
    watchdog: SimulationError | None = None
    quiet = _private.quiet_callback_failures([_STOPPED, "RACE DETECTED"])
    with _private.interpret_probes(recorder), quiet:
        worker = threading.Thread(target=run, name="safedma-simulate", daemon=True)
        worker.start()
        try:
            if not outcome.done.wait(timeout_s):
                watchdog = _fire_watchdog(recorder, devices, timeout_s, outcome)
            worker.join(_GRACE_S)
            _drain(recorder, _GRACE_S)
            error = _classify(recorder, devices, watchdog, outcome)
            if error is not None:
                raise error
            failed = False
        finally:
            if failed:
                pltpu.reset_tpu_interpret_mode_state()
    return cast(T, outcome.value)


def _fire_watchdog(recorder: _Recorder, devices: _DeviceNames, timeout_s: float,
                   outcome: _Outcome) -> SimulationError | None:
    """Fail a run that outlived ``timeout_s``; escalate until it stops, or give up.

    Returns the error to report, or None if the run finished cleanly on its own
    just as the watchdog fired.
    """
    waits = recorder.waiting()
    error: SimulationError
    if waits:
        error = UnsatisfiableWaitError(recorder.stuck_reports(waits, devices), timeout_s)
        runs = {w.run.key: w.run for w in waits}
    else:
        error = SimulationTimeoutError(
            f"the kernel did not finish within timeout_s={timeout_s:g} s and no "
            "device was waiting on a semaphore: it is slow (raise timeout_s) or stuck "
            "outside a semaphore wait", stopped=True,
        )
        current = _private.current_interpret_run()
        runs = {} if current is None else {current.key: current}
    for run in runs.values():
        run.fail(RuntimeError(f"{_STOPPED}: {error}"))
    if outcome.done.wait(_GRACE_S):
        # Nothing failed by us: the run ended on its own as the watchdog fired.
        return error if runs else None
    for run in runs.values():
        run.abort_barriers()
    pltpu.reset_tpu_interpret_mode_state()
    if outcome.done.wait(_GRACE_S):
        return error
    raise SimulationTimeoutError(
        f"{error}\n\nThe watchdog could not stop the run within {2 * _GRACE_S:g} s; "
        "its thread is left behind and interpret mode in this process is unusable.",
        stopped=False,
    ) from error


def _classify(recorder: _Recorder, devices: _DeviceNames,
              watchdog: SimulationError | None, outcome: _Outcome) -> BaseException | None:
    """The error to raise for this run, root cause first, or None if it was clean."""
    if recorder.races:
        return _chain(RaceDetectedError(recorder.races), outcome.error)
    if watchdog is not None:
        return _chain(watchdog, outcome.error)
    if outcome.error is not None:
        err = outcome.error
        if isinstance(err, _JaxRuntimeError):
            return _chain(KernelFailedError(
                f"the kernel failed in interpret mode: {_last_line(str(err))}"), err)
        return err
    leftovers = recorder.leftover_reports(devices)
    if leftovers:
        return LeftoverSemaphoreError(leftovers)
    return None


def _chain(error: SimulationError, cause: BaseException | None) -> SimulationError:
    error.__cause__ = cause
    return error
