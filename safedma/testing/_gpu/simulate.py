"""``simulate_gpu``: run Pallas GPU kernels in jax's GPU interpreter, where misuse fails loudly.

jax's GPU interpreter runs a plgpu kernel on a CPU, but a barrier wait nothing
completes blocks its thread forever, a race is seen only with race detection on,
and a failure surfaces as a host-callback traceback. Here races are on and fatal,
a hang becomes :class:`BarrierNeverCompletesError` naming the wait's line, the
phase and the arrivals, and each failure is a safedma error naming the mistake
and the fix. Every private name is read through :mod:`.jax_seam`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Literal, TypeVar, cast

import jax
from jax.typing import ArrayLike

from safedma._arguments import check_bool, check_callable, check_choice, check_number
from safedma.testing import _kernel_lines
from safedma.testing._errors import (
    ConcurrentInterpretError,
    KernelFailedError,
    Race,
    RaceDetectedError,
    SimulationError,
    SimulationTimeoutError,
    SimulationUnsupportedError,
)
from safedma.testing._gpu import jax_seam
from safedma.testing._runner import Outcome
from safedma.testing._gpu.errors import (
    BarrierNeverCompletesError,
    CopyInFlightAtExitError,
    StuckBarrierWait,
)

__all__ = ["GpuRaceDetectedError", "simulate_gpu"]

T = TypeVar("T")

_POLL_S = 0.05
# A wait must be seen blocked, with nothing changed, on this many polls in a row.
_CONFIRM_POLLS = 3
# How long a stopped run may take to unwind.
_GRACE_S = 10.0

_running = threading.Lock()

# Typed once: jax leaves jit's result and block_until_ready partly unannotated.
_jit = cast("Callable[[Callable[..., Any]], Callable[..., Any]]", getattr(jax, "jit"))
_block_until_ready = cast("Callable[[object], object]", getattr(jax, "block_until_ready"))


def simulate_gpu(
    fn: Callable[..., T],
    *args: ArrayLike,
    timeout_s: float = 60.0,
    detect_races: bool = True,
    uninitialized_memory: Literal["nan", "zero"] = "nan",
) -> T:
    """Run ``fn(*args)`` with every Pallas GPU kernel in jax's GPU interpreter, strictly.

    Why: on a GPU a barrier waited once too often hangs, and a read before the copy
    landed, a store of uncommitted SMEM or SMEM overwritten under its store gives
    wrong numbers now and then. The interpreter runs the kernel on a CPU; here its
    race detector is on and a race raises, and a hang is stopped and explained.

    Raises :class:`BarrierNeverCompletesError` for a ``barrier_wait`` nothing can
    complete (at once when its warpgroup is alone in its block, else at
    ``timeout_s``), naming the thread, the line, the phase and the arrivals;
    :class:`RaceDetectedError` for a race (both lines);
    :class:`CopyInFlightAtExitError` for a store never waited;
    :class:`KernelFailedError` for any other failure in the kernel (its message);
    :class:`SimulationTimeoutError` when still running at ``timeout_s`` (tracing and
    compiling count); :class:`SimulationUnsupportedError` on a jax without the GPU
    interpreter; :class:`ConcurrentInterpretError` if another ``simulate_gpu`` runs.
    Errors raised while tracing propagate unchanged. Returns ``fn``'s outputs.
    """
    check_callable(
        fn, "fn", "safedma.testing.simulate_gpu()", "Pass the function to run, then its arguments."
    )
    _check_options(timeout_s, detect_races, uninitialized_memory)
    if not jax_seam.interpret_available():
        raise SimulationUnsupportedError(
            f"jax {jax.__version__} has no Pallas GPU interpreter safedma can drive "
            "(plgpu.InterpretGPUParams and force_gpu_interpret_mode); use jax 0.12 or newer, "
            "or check the kernel with safedma.testing.verify_gpu."
        )
    if not _running.acquire(blocking=False):
        raise ConcurrentInterpretError(
            "another simulate_gpu is running in this process: jax's GPU interpreter keeps "
            "one simulated GPU per process. Run one at a time."
        )
    try:
        return cast("T", _run(fn, args, timeout_s, detect_races, uninitialized_memory))
    finally:
        _running.release()


def _check_options(timeout_s: object, detect_races: object, uninitialized_memory: object) -> None:
    where = "safedma.testing.simulate_gpu()"
    check_number(timeout_s, "timeout_s", where, positive=True, fix="Give seconds, such as 60.")
    check_bool(detect_races, "detect_races", where)
    check_choice(uninitialized_memory, "uninitialized_memory", where, ("nan", "zero"))


def _run(
    fn: Callable[..., object],
    args: tuple[ArrayLike, ...],
    timeout_s: float,
    detect_races: bool,
    uninitialized_memory: Literal["nan", "zero"],
) -> object:
    outcome = Outcome()

    def work() -> None:
        try:
            with jax_seam.interpret_mode(
                detect_races=detect_races, uninitialized_memory=uninitialized_memory
            ):
                outcome.value = _block_until_ready(_jit(fn)(*args))
        except BaseException as err:  # handed to the caller's thread
            outcome.error = err
        finally:
            outcome.done.set()

    failures: list[BaseException] = []
    jax_seam.reset_interpreter()
    verdict: SimulationError | None = None
    try:
        with _callback_failures(failures):
            worker = threading.Thread(target=work, name="safedma-simulate-gpu", daemon=True)
            worker.start()
            try:
                verdict = _watch(outcome, timeout_s)
            except BaseException:
                _stop(worker, "simulate_gpu was interrupted")
                raise
            if verdict is not None:
                if not _stop(worker, str(verdict)):
                    verdict = _not_stopped(verdict)
            else:
                worker.join()
    finally:
        jax_seam.reset_interpreter()
    if verdict is not None:
        raise verdict
    if outcome.error is not None:
        root = _root_failure(failures)
        if root is None:
            raise outcome.error  # raised while tracing, or not by the kernel
        raise _classify(root) from outcome.error
    return outcome.value


def _watch(outcome: Outcome, timeout_s: float) -> SimulationError | None:
    """Wait for the run; the verdict that stops it early, if any."""
    start = time.monotonic()
    deadline = start + timeout_s
    seen: dict[tuple[str, int, int, int], int] = {}
    while not outcome.done.wait(_POLL_S):
        now = time.monotonic()
        waits = jax_seam.blocked_barrier_waits()
        alone = [w for w in waits if w.alone]
        seen = {
            key: seen.get(key, 0) + 1
            for key in ((w.thread, w.barrier, w.phase, w.arrivals) for w in alone)
        }
        stuck = [
            w for w in alone if seen[(w.thread, w.barrier, w.phase, w.arrivals)] >= _CONFIRM_POLLS
        ]
        if stuck:
            return BarrierNeverCompletesError(
                [_stuck(w) for w in stuck], timeout_s, found_after_s=now - start
            )
        if now >= deadline:
            if waits:
                return BarrierNeverCompletesError([_stuck(w) for w in waits], timeout_s)
            return SimulationTimeoutError(
                f"simulate_gpu: still running after timeout_s={timeout_s:g} s (tracing and "
                "compiling count), with no thread blocked on a barrier: the kernel is slow "
                "in the interpreter (race detection compares every access with the earlier "
                "ones). Give timeout_s more room, or simulate smaller shapes.",
                stopped=True,
            )
    return None


def _stuck(wait: jax_seam.BlockedBarrierWait) -> StuckBarrierWait:
    return StuckBarrierWait(
        thread=wait.thread,
        location=_kernel_lines.user_location(wait.source_info),
        phase=wait.phase,
        arrivals=wait.arrivals,
        num_arrivals=wait.num_arrivals,
    )


def _stop(worker: threading.Thread, reason: str) -> bool:
    """Fail the interpreted run so its blocked threads raise; False if it will not end."""
    try:
        jax_seam.stop_interpreter(
            RuntimeError(f"stopped by safedma.testing.simulate_gpu: {reason}")
        )
    except Exception:  # the run may have ended meanwhile
        pass
    worker.join(_GRACE_S)
    return not worker.is_alive()


def _not_stopped(verdict: SimulationError) -> SimulationError:
    error = SimulationTimeoutError(
        f"{verdict}\n\nThe run could not be stopped within {_GRACE_S:g} s; its thread is "
        "left behind and GPU interpret mode in this process is unusable.",
        stopped=False,
    )
    error.__cause__ = verdict
    return error


@contextlib.contextmanager
def _callback_failures(failures: list[BaseException]) -> Generator[None, None, None]:
    """Collect each exception a host callback of the run raised, and keep it out of the log.

    Why: the interpreter's checks raise inside host callbacks; jax logs each with its
    exception attached and then raises a runtime error whose text is a traceback.
    The logged exception is the mistake itself.
    """

    class _Collect(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            error = record.exc_info[1] if record.exc_info else None
            if error is None:
                return True
            failures.append(error)
            return False

    collect = _Collect()
    loggers = [logging.getLogger(name) for name in jax_seam.CALLBACK_LOGGERS]
    for logger in loggers:
        logger.addFilter(collect)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(collect)


# The interpreter re-raises the first failure in every other thread with this prefix.
_SECONDARY = "Computation failed"


def _root_failure(failures: list[BaseException]) -> BaseException | None:
    for failure in failures:
        if not str(failure).startswith(_SECONDARY):
            return failure
    return failures[0] if failures else None


# One access of the race detector's report: "{read|write} of {buffer}[{range}] from
# {thread}, {file:line:column (function)}".
_ACCESS = re.compile(r"^\s*(read|write) of (.*?)\[(.*)\] from (\w+\([^)]*\)), (.*)$")


def _classify(failure: BaseException) -> SimulationError:
    """The safedma error for the interpreter's first failure.

    Why text: the interpreter raises plain ``RuntimeError`` / ``ValueError`` with
    its finding in the message; a message this does not recognise is still shown
    whole, as a :class:`KernelFailedError`.
    """
    text = str(failure)
    if text.startswith("RACE DETECTED"):
        return _race(text)
    if "copy_smem_to_gmem" in text and "before kernel finished" in text:
        return CopyInFlightAtExitError(
            f"a copy_smem_to_gmem was still in flight when the kernel ended (the interpreter: "
            f"{text.strip()}). On a GPU the kernel exits while the TMA unit still reads "
            "shared memory. Wait for it with plgpu.wait_smem_to_gmem(0) before the kernel "
            "returns."
        )
    if isinstance(failure, NotImplementedError) or text.startswith("Cannot lower"):
        unsupported = SimulationUnsupportedError(
            f"jax {jax.__version__}'s GPU interpreter cannot run this kernel "
            f"({type(failure).__name__}: {_first_line(text)}). Check its protocol with "
            "safedma.testing.verify_gpu where it applies, or on a GPU."
        )
        unsupported.__cause__ = failure
        return unsupported
    hint = ""
    if "phase" in text and ("observ" in text or "awaiting" in text):
        hint = (
            "\nA barrier completed a phase no thread waited for: more copies arrive on it "
            "per phase than its num_arrivals, or a phase's barrier_wait is missing. Make "
            "the arrivals per phase equal num_arrivals and wait every phase once."
        )
    error = KernelFailedError(
        f"the kernel failed in jax's GPU interpreter: {type(failure).__name__}: "
        f"{text.strip()}{hint}"
    )
    error.__cause__ = failure
    return error


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _race(report: str) -> RaceDetectedError:
    accesses = [m for m in (_ACCESS.match(line) for line in report.splitlines()) if m]
    if not accesses:
        return GpuRaceDetectedError([Race("write", "a thread", None, (), None, report)], report)
    first = accesses[0]
    other = accesses[1].group(5) if len(accesses) > 1 else None
    race = Race(
        access=cast("Literal['read', 'write']", first.group(1)),
        accessor=first.group(4),
        owner=None,
        buffer=(first.group(2),),
        location=first.group(5),
        report=report,
        other_location=other,
    )
    return GpuRaceDetectedError([race], report)


class GpuRaceDetectedError(RaceDetectedError):
    """A race in a Pallas GPU kernel: a :class:`RaceDetectedError` whose fix speaks of
    barriers, ``commit_smem`` and ``wait_smem_to_gmem``."""

    def __init__(self, races: list[Race], report: str) -> None:
        self.races = tuple(races)
        first = self.races[0]
        where = f" at {first.location}" if first.location else ""
        other = f" with the access at {first.other_location}" if first.other_location else ""
        text = "\n".join(
            line for line in report.rstrip().splitlines() if not line.strip().startswith("clock:")
        )
        SimulationError.__init__(
            self,
            f"data race: a {first.access} of shared memory by {first.accessor}{where} is not "
            f"ordered{other}. A TMA load's destination may be read only after barrier_wait "
            "on its barrier; SMEM a copy_smem_to_gmem reads may be overwritten only after "
            "wait_smem_to_gmem; SMEM written by the threads must be committed with "
            "commit_smem() before a copy_smem_to_gmem reads it.\n\n"
            f"The interpreter's report:\n{text}",
        )
