"""Running one strict simulation: compile, run on a worker thread, watch it, stop it, report.

The simulating thread compiles the program, starts it on a worker thread and
watches the probes' record.  It stops the run as soon as the outcome is
known: a device raised (reported as itself), every device is blocked for
good (an unsatisfiable wait), ``timeout_s`` ran out while the kernel was
still running, or the caller was interrupted (``KeyboardInterrupt``, a
signal handler's exception).  Stopping fails the run on every device, waits
for the worker, and resets interpret mode, so the next simulation starts
clean and the process can exit normally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar, cast

import jax
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec
from jax.typing import ArrayLike

from safedma._arguments import check_bool, check_choice, check_number, shown
from safedma._errors import SafeDmaError
from safedma.testing import _diagnosis as diagnosis
from safedma.testing import _interpret_probes as probes
from safedma.testing import _meshes as meshes
from safedma.testing import _progress
from safedma.testing._errors import (
    ConcurrentInterpretError,
    KernelFailedError,
    RaceDetectedError,
    SimulationError,
    SimulationTimeoutError,
    SimulationUnsupportedError,
)
from safedma.testing._interrupts import deferred_interrupts
from safedma.testing._meshes import check_mesh, check_specs
from safedma.testing._kernel_names import KernelNames
from safedma.testing._recorder import Blocked, Recorder
from safedma.testing._uninterpretable import has_kernel, interpreter_limit
from safedma.testing._uninterpretable import refuse_uninterpretable

__all__ = ["SimulationConfig", "run_simulation"]

T = TypeVar("T")

#: After the run is told to stop, how long the devices get to notice (they
#: poll every 0.1 s) before the interpreter's barriers are broken, and again
#: before the runner gives up on the run.
_GRACE_S = 5.0

#: How often the simulating thread looks at the run.
_POLL_S = 0.05

#: How long every device must stay blocked, with no event in between, before
#: a wait is called unsatisfiable: longer than the 0.1 s an interpreter wait
#: sleeps between looks at its count, so a signal that just landed is seen.
_CONFIRM_S = 0.3

#: XLA options for compiling a simulation (see where it is compiled). Typed as jax's
#: CompilerOptions (``dict[str, str | bool]`` in jax 0.10.2, ``dict[str, Any]`` in 0.12):
#: a bare literal is ``dict[str, str]``, which dict's invariance keeps out of 0.10.2's.
_COMPILER_OPTIONS: dict[str, str | bool] = {"xla_disable_hlo_passes": "cse"}

# jaxlib's exception class is untyped for pyright.
# getattr into a declared variable, not cast(): pyright and basedpyright disagree on
# whether an expression passed straight to cast() is reported.
_JaxRuntimeError: type[Exception] = getattr(jax.errors, "JaxRuntimeError")


@dataclasses.dataclass(frozen=True)
class SimulationConfig:
    """Everything about one simulation except the function and its arguments."""

    mesh: Mesh | None = None
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None = None
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None = None
    timeout_s: float = 60.0
    uninitialized_memory: Literal["nan", "zero"] = "nan"
    progress: bool | None = None  # the progress line: None when stderr is a terminal

    def __post_init__(self) -> None:
        where = "safedma.testing.simulate()"
        check_mesh(self.mesh, where)
        if self.mesh is not None and not isinstance(cast(object, self.mesh), Mesh):
            raise TypeError(
                f"{where}: mesh must be a mesh of devices (safedma.testing.simulated_mesh(...) "
                f"or a jax.sharding.Mesh) or None, got {shown(self.mesh)}: a simulation runs "
                "on devices. An abstract_mesh is for verify and mosaic_text."
            )
        check_specs(self.in_specs, "in_specs", where)
        check_specs(self.out_specs, "out_specs", where)
        check_number(
            self.timeout_s, "timeout_s", where, positive=True, fix="Give seconds, such as 60."
        )
        check_choice(self.uninitialized_memory, "uninitialized_memory", where, ("nan", "zero"))
        check_bool(self.progress, "progress", where, none=True)
        if self.mesh is None and (self.in_specs is not None or self.out_specs is not None):
            raise ValueError("in_specs/out_specs need a mesh: pass mesh=simulated_mesh(...)")


class Outcome:
    """What a worker thread running a simulation produced: the outputs or the exception
    (``simulate`` and ``simulate_gpu`` both run the program off the caller's thread)."""

    def __init__(self) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.done = threading.Event()


# ---------------------------------------------------------------------------
# Refused up front


#: Where jaxlib's CPU client can hang copying callback arguments
#: (``probes.large_callback_copies_can_hang`` says why and where), runs of this
#: many devices with buffers this large are refused up front.
_LARGE_BUFFER_BYTES = 100 * 1024
_MANY_DEVICES = 8


def _device_count(devices: meshes.DeviceNames, values: Sequence[object]) -> int:
    # A program that brings its own shard_map (mesh=None) shows its devices
    # in its arguments' shardings.
    counts = [devices.count]
    for value in values:
        device_set = getattr(getattr(value, "sharding", None), "device_set", None)
        if isinstance(device_set, (set, frozenset)):
            counts.append(len(cast("set[object]", device_set)))
    return max(counts)


def _refuse_unsupported(devices: meshes.DeviceNames, values: Sequence[object]) -> None:
    count = _device_count(devices, values)
    if count < _MANY_DEVICES or not probes.large_callback_copies_can_hang():
        return
    largest = max((meshes.bytes_per_device(v) for v in values), default=0)
    if largest >= _LARGE_BUFFER_BYTES:
        raise SimulationUnsupportedError(
            f"jax {jax.__version__} cannot simulate {count} devices with "
            f"{largest // 1024} KiB per device: its io_callback copies each "
            "interpreter argument onto the first CPU device, and with 8 or more "
            "devices and a buffer of 100 KiB or more per device the devices hang in "
            "that copy, so the run never finishes. Use jax 0.11.2 or newer, fewer "
            "than 8 devices, or blocks under 100 KiB per device."
        )


# ---------------------------------------------------------------------------
# Running


_busy = threading.Lock()


def run_simulation(fn: Callable[..., T], args: Sequence[ArrayLike], config: SimulationConfig) -> T:
    """Run ``fn(*args)`` as ``config`` says; the outputs, or the error that explains the run."""
    if not _busy.acquire(blocking=False):
        raise RuntimeError(
            "simulate() is already running in this process; interpret mode keeps one "
            "global state, so simulations must run one at a time"
        )
    try:
        with _progress.Progress("safedma simulate", config.progress) as line:
            line.status("preparing interpret mode")
            with deferred_interrupts():
                probes.warm_up()
            return _run(fn, args, config, line)
    finally:
        _busy.release()


def _program(
    fn: Callable[..., T], args: Sequence[ArrayLike], config: SimulationConfig
) -> tuple[Callable[..., T], tuple[object, ...]]:
    if config.mesh is None:
        return fn, tuple(args)
    default = meshes.default_spec(config.mesh)
    ins = meshes.specs(config.in_specs, default, arguments=True)
    outs = meshes.specs(config.out_specs, default, arguments=False)
    placed = meshes.place(args, ins, config.mesh)
    program = jax.shard_map(fn, mesh=config.mesh, in_specs=ins, out_specs=outs, check_vma=False)
    return program, placed


def _outputs(lowered: object, compiled: object) -> list[object]:
    """The program's outputs, each with its global shape and the sharding it gets.

    The lowered program's output infos carry a sharding only where jax knew
    one before compiling (jax 0.10 leaves it out for a shard_map's outputs
    under a nested jit); the compiled program's output shardings are final.
    Only sizes are read from them (bytes per device, for the refusal above).
    """
    leaves: Callable[[object], list[object]] = getattr(jax.tree, "leaves")
    infos = leaves(getattr(lowered, "out_info"))
    shardings = leaves(getattr(compiled, "output_shardings", None))
    if len(shardings) != len(infos):
        return infos
    outputs: list[object] = []
    for info, sharding in zip(infos, shardings, strict=True):
        if getattr(info, "sharding", None) is None:
            info = jax.ShapeDtypeStruct(
                getattr(info, "shape"), getattr(info, "dtype"), sharding=sharding
            )
        outputs.append(info)
    return outputs


def _unjitted(program: Callable[..., T]) -> Callable[..., T]:
    """The Python function under a ``jax.jit``, so simulate's own jit does not nest it.

    jax 0.12's XLA aborts the process (``hlo_cse.cc: Check failed``) compiling a
    jit that calls a jitted function whose interpreted kernel takes a constant
    made inside it (jax's own interpret tests: ``@jax.jit def run(): return
    pl.pallas_call(...)(jnp.zeros(...))``). ``simulate(run)`` wrapped ``run`` in
    a second jit; tracing the function under it instead compiles one jit, as
    calling ``run()`` does.  Its jit options (shardings, donation) do not
    matter to a simulation, whose arguments are placed already.
    """
    inner = getattr(program, "__wrapped__", None)
    # Only jax.jit's own type: functools.wraps copies a wrapped function's
    # attributes (``lower`` among them) onto wrappers such as a shard_map's.
    if isinstance(program, _JIT_TYPE) and callable(inner):
        return cast("Callable[..., T]", inner)
    return program


#: The type of what ``jax.jit`` returns (jaxlib's PjitFunction), found without
#: naming it.
_JIT_TYPE: type = type(jax.jit(lambda: None))  # pyright: ignore[reportUnknownMemberType]


def _run(
    fn: Callable[..., T],
    args: Sequence[ArrayLike],
    config: SimulationConfig,
    line: _progress.Progress,
) -> T:
    devices = meshes.DeviceNames(config.mesh)
    program, placed = _program(fn, args, config)
    params = probes.strict_interpret_params(config.uninitialized_memory)
    recorder = Recorder(devices)
    if probes.interpret_mode_busy():
        raise ConcurrentInterpretError(
            "another thread is running an interpret-mode kernel; interpret mode "
            "keeps one simulated TPU per process, so simulate cannot start until it "
            "returns (starting now would wipe that kernel's state)"
        )
    with probes.interpret_probes(recorder) as installed, contextlib.ExitStack() as located:
        # Leftovers of an earlier failed interpret run outside simulate() would
        # make this one fail.
        pltpu.reset_tpu_interpret_mode_state()

        body = _unjitted(program)
        line.status("tracing and compiling the program for interpret mode")

        def fresh(*flat: object) -> T:
            # A new function each time: no jit cache entry traced elsewhere is reused.
            return body(*flat)

        with probes.force_interpret_params(params):
            traced = jax.jit(fresh).trace(*placed)  # pyright: ignore[reportUnknownMemberType]
            # Lines for the equations jax traced inside its own helpers (sync_copy).
            located.enter_context(probes.enclosing_lines(traced.jaxpr))
            # The kernels' parameter names, for the messages (read only if one is needed).
            names = KernelNames(traced.jaxpr)
            # Refused before lowering: jax fails inside the lowering otherwise.
            refuse_uninterpretable(traced.jaxpr)
            try:
                with probes.unfiltered_tracebacks():
                    lowered = traced.lower()
            except SafeDmaError:
                raise
            except Exception as err:
                raise interpreter_limit(err) from err
            # Without XLA's CSE pass: jax 0.12's XLA aborts the process (hlo_cse.cc
            # "Check failed") removing a duplicate NaN constant of the interpreter's
            # uninitialised memory that has control predecessors, once a user's own
            # jax.jit around a kernel is inlined into this jit. CSE only saves time.
            compiled = lowered.compile(  # pyright: ignore[reportUnknownMemberType]
                _COMPILER_OPTIONS
            )
            outputs = _outputs(lowered, compiled)
            # The jax 0.10 hang is in the interpreter's callbacks: a program
            # with no kernel (a reference computation) runs as plain XLA.
            kernels = has_kernel(traced.jaxpr)
            if kernels:
                _refuse_unsupported(devices, [*placed, *outputs])
            many = (
                kernels
                and probes.large_callback_copies_can_hang()
                and _device_count(devices, [*placed, *outputs]) >= _MANY_DEVICES
            )

        run = _Run(compiled, placed, installed, devices, config, many, names)
        entries = probes.DMA_CLOCK_ENTRIES
        while True:
            again = (
                ""
                if entries == probes.DMA_CLOCK_ENTRIES
                else f" again ({entries} clock entries for copies)"
            )
            line.status(_run_status(recorder, f"running in interpret mode{again}"))
            value, error = run.execute(recorder, entries)
            short = installed.clock_shortages
            if not short:
                break
            if entries >= probes.MAX_DMA_CLOCK_ENTRIES:
                # A race found with shared entries is real (sharing only hides races).
                if not recorder.races:
                    error = _too_many_copies(entries, installed.clock_short_at, error)
                break
            # Some copies shared a vector-clock entry with another still in flight,
            # which can hide a race between them (an earlier one than any found):
            # again, with an entry for each.
            entries = _more_entries(entries, short)
            recorder = Recorder(devices)
        if error is not None:
            raise error
    return cast(T, value)


def _run_status(recorder: Recorder, what: str) -> Callable[[], str]:
    """What the progress line says while the run goes (read at each redraw)."""
    return lambda: f"{what}: {recorder.progress()}"


def _more_entries(entries: int, short: int) -> int:
    wanted = max(2 * entries, entries + short)
    return min(1 << (wanted - 1).bit_length(), probes.MAX_DMA_CLOCK_ENTRIES)


def _too_many_copies(entries: int, where: str | None, error: BaseException | None) -> BaseException:
    if error is not None:
        return error  # found without a race: the run's own verdict stands
    at = f" (the first of them started at {where})" if where else ""
    return SimulationUnsupportedError(
        f"more than {entries} copies were in flight at once{at}: simulate's race "
        "check gives each copy in flight its own vector-clock entry, and at this many "
        "it would share them, which can hide a race between two copies. Simulate "
        "fewer copies in flight (a smaller grid or block count), or check the kernel "
        "with safedma.testing.verify, which does not simulate."
    )


class _Run:
    """Runs the compiled program once, watched, with a given number of clock entries."""

    def __init__(
        self,
        compiled: Callable[..., object],
        placed: Sequence[object],
        installed: probes.Installed,
        devices: meshes.DeviceNames,
        config: SimulationConfig,
        many: bool,
        names: KernelNames,
    ) -> None:
        self._names = names
        self._compiled = compiled
        self._placed = placed
        self._installed = installed
        self._devices = devices
        self._config = config
        self._many = many

    def execute(self, recorder: Recorder, entries: int) -> tuple[object, BaseException | None]:
        """The outputs and the error that explains the run (None if it was clean)."""
        installed, devices, config = self._installed, self._devices, self._config
        installed.observer = recorder
        installed.clock_entries = entries
        installed.clock_shortages = 0
        installed.clock_short_at = None
        outcome = Outcome()
        compiled, placed = self._compiled, self._placed

        def work() -> None:
            try:
                outcome.value = jax.block_until_ready(  # pyright: ignore[reportUnknownMemberType]
                    compiled(*placed)
                )
            except BaseException as err:  # handed to the simulating thread
                outcome.error = err
            finally:
                outcome.done.set()

        error: BaseException | None = None
        clean = False
        with probes.callback_failures(recorder):
            worker = threading.Thread(target=work, name="safedma-simulate", daemon=True)
            worker.start()
            try:
                try:
                    verdict = _watch(
                        recorder,
                        outcome,
                        installed,
                        devices,
                        config,
                        self._names,
                        many_devices_on_old_jax=self._many,
                    )
                except BaseException:
                    # Interrupted (KeyboardInterrupt, a signal handler's exception):
                    # stop the run on every device before letting it through.
                    with deferred_interrupts():  # a second Ctrl-C waits for the stop
                        _stop(recorder, outcome, installed, "simulate was interrupted")
                        worker.join(_GRACE_S)
                    raise
                if outcome.done.is_set():
                    worker.join(_GRACE_S)
                    _drain(recorder, _GRACE_S)
                error = _classify(recorder, devices, verdict, outcome, self._names)
                clean = error is None
            finally:
                if not clean:
                    with deferred_interrupts():
                        pltpu.reset_tpu_interpret_mode_state()
        return outcome.value, error


def _watch(
    recorder: Recorder,
    outcome: Outcome,
    installed: probes.Installed,
    devices: meshes.DeviceNames,
    config: SimulationConfig,
    names: KernelNames,
    *,
    many_devices_on_old_jax: bool = False,
) -> SimulationError | None:
    """Wait for the run, stopping it as soon as its outcome is known; the verdict, if any."""
    start = time.monotonic()
    deadline = start + config.timeout_s
    since: tuple[float, Blocked] | None = None
    while not outcome.done.wait(_POLL_S):
        now = time.monotonic()
        failure = recorder.failure
        if failure is not None:
            # A device raised.  Inside the interpreter, jax stops the others
            # itself; outside it (a failing jax.debug.callback), it does not
            # know, so the others are stopped here and the barriers broken.
            if not failure.inside:
                _stop(recorder, outcome, installed, "a device failed", abort_now=True)
                return None
            if now >= deadline:  # the others never noticed: stop them too
                _stop(recorder, outcome, installed, "a device failed")
                return None
            continue
        blocked = recorder.blocked()
        if blocked is None or since is None or since[1].sequence != blocked.sequence:
            since = None if blocked is None else (now, blocked)
        elif now - since[0] >= _CONFIRM_S:
            verdict: SimulationError = diagnosis.unsatisfiable_error(
                recorder, blocked.waits, devices, config.timeout_s, now - start, names
            )
            return _stopped(verdict, _stop(recorder, outcome, installed, str(verdict)))
        if now >= deadline:
            running = diagnosis.timeout_error(
                recorder, devices, config.timeout_s, stopped=True, names=names
            )
            if many_devices_on_old_jax and not recorder.waiting():
                running = SimulationTimeoutError(
                    f"{running}\n\nOn jax {jax.__version__} with 8 or more devices, a "
                    "buffer of 100 KiB or more per device (a VMEM or SMEM scratch, too) "
                    "makes interpret mode hang before the kernel starts; jax 0.11.2 "
                    "and newer do not.",
                    stopped=True,
                )
            return _stopped(running, _stop(recorder, outcome, installed, str(running)))
    return None


def _stopped(verdict: SimulationError, stopped: bool) -> SimulationError:
    if stopped:
        return verdict
    error = SimulationTimeoutError(
        f"{verdict}\n\nThe watchdog could not stop the run within {2 * _GRACE_S:g} s; "
        "its thread is left behind and interpret mode in this process is unusable.",
        stopped=False,
    )
    error.__cause__ = verdict
    return error


def _stop(
    recorder: Recorder,
    outcome: Outcome,
    installed: probes.Installed,
    reason: str,
    *,
    abort_now: bool = False,
) -> bool:
    """Fail the run on every device and wait for it to end; False if it would not."""
    installed.stopping = f"stopped by safedma.testing.simulate: {reason}"
    stop = probes.StopRun(installed.stopping)

    def runs() -> list[probes.InterpretRun]:
        found = {r.key: r for r in recorder.runs_in_flight()}
        current = probes.current_interpret_run()
        if current is not None:
            found[current.key] = current
        return list(found.values())

    for run in runs():
        run.fail(stop)
        if abort_now:
            run.abort_barriers()
    deadline = time.monotonic() + _GRACE_S
    while not outcome.done.wait(_POLL_S):
        if time.monotonic() >= deadline:
            break
        for run in runs():  # a kernel that started meanwhile is refused, but be sure
            run.fail(stop)
    else:
        return True
    for run in runs():
        run.abort_barriers()
    pltpu.reset_tpu_interpret_mode_state()
    return outcome.done.wait(_GRACE_S)


def _drain(recorder: Recorder, deadline_s: float) -> None:
    # After a failure XLA may return while device threads are still leaving
    # their waits; let them go before the state is reset.
    end = time.monotonic() + deadline_s
    while recorder.waiting() and time.monotonic() < end:
        time.sleep(0.02)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


def _classify(
    recorder: Recorder,
    devices: meshes.DeviceNames,
    verdict: SimulationError | None,
    outcome: Outcome,
    names: KernelNames,
) -> BaseException | None:
    """The error to raise for this run, root cause first, or None if it was clean."""
    if recorder.races:
        races = [dataclasses.replace(r, name=names.buffer(r)) for r in recorder.races]
        return _chain(RaceDetectedError(races), outcome.error)
    if recorder.failure is not None:
        return diagnosis.failure_error(recorder.failure, devices)
    if verdict is not None:
        return verdict if verdict.__cause__ is not None else _chain(verdict, outcome.error)
    if outcome.error is not None:
        err = outcome.error
        if isinstance(err, _JaxRuntimeError):
            return _chain(
                KernelFailedError(f"the kernel failed in interpret mode: {_last_line(str(err))}"),
                err,
            )
        return err
    return diagnosis.leftover_error(recorder, devices, names)


def _chain(error: SimulationError, cause: BaseException | None) -> SimulationError:
    error.__cause__ = cause
    return error
