"""What the GPU checker reports: the verifier's error classes, one new one, and the report.

A deadlock is a :class:`~safedma.testing.DeadlockError`, a race (a missing
``commit_smem`` included: the copy engine reads memory the threads' writes
are not yet visible in) a :class:`~safedma.testing.RaceDetectedError`, as the
TPU verifier reports them; a copy still in flight when the kernel (or the
scope of its buffer) ends is a :class:`CopyInFlightAtExitError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from safedma.testing._errors import SimulationError, UnsatisfiableWaitError
from safedma.testing._verify.errors import (
    DeadlockError,
    VerificationUnsupportedError,
    VerifiedRaceError,
)

__all__ = [
    "BarrierNeverCompletesError",
    "CopyInFlightAtExitError",
    "StuckBarrierWait",
    "DeadlockError",
    "GpuVerifyReport",
    "VerificationUnsupportedError",
    "VerifiedRaceError",
]


class CopyInFlightAtExitError(SimulationError):
    """A TMA copy still in flight when the kernel, or the scope of its shared memory, ends.

    The shared memory is released while the copy engine still reads or writes it.
    """


@dataclasses.dataclass(frozen=True)
class StuckBarrierWait:
    """A thread blocked in ``plgpu.barrier_wait`` on a phase nothing can complete.

    ``phase`` counts the barrier's completions from 0; ``arrivals`` of
    ``num_arrivals`` have landed in it; ``location`` is the wait's line.
    """

    thread: str
    location: str | None
    phase: int
    arrivals: int
    num_arrivals: int

    @property
    def hint(self) -> str:
        """What most likely went wrong, from the counts alone."""
        if self.arrivals == 0 and self.phase > 0:
            return (
                "no arrival at all in this phase: a second wait on one completion (wait "
                "each copy's phase once), or the copy for this phase was never issued"
            )
        if self.arrivals == 0:
            return "no copy or barrier_arrive ever lands on this barrier"
        return (
            f"{self.num_arrivals - self.arrivals} arrival(s) short: the barrier was made "
            f"with num_arrivals={self.num_arrivals} but fewer copies arrive on it per phase"
        )


class BarrierNeverCompletesError(UnsatisfiableWaitError):
    """A ``barrier_wait`` that nothing left can complete: on a GPU the kernel hangs.

    Reported as soon as the waiting thread is the only one of its block (each
    copy lands when issued in the interpreter, so nothing else can arrive), or
    at ``timeout_s`` for kernels with several warpgroups. ``barrier_waits``
    holds each stuck wait; ``waits`` (semaphore waits, a TPU notion) is empty.
    """

    def __init__(
        self,
        waits: Sequence[StuckBarrierWait],
        timeout_s: float,
        found_after_s: float | None = None,
    ) -> None:
        self.barrier_waits = tuple(waits)
        self.waits = ()
        self.timeout_s = timeout_s
        self.found_after_s = found_after_s
        lines = [
            f"  {w.thread} waits at {w.location or 'an unknown line'} for phase {w.phase} "
            f"of a barrier expecting {w.num_arrivals} arrival(s) per phase; "
            f"{w.arrivals} arrived: {w.hint}"
            for w in self.barrier_waits
        ]
        after = (
            f"found after {found_after_s:.1f} s of timeout_s={timeout_s:g} s"
            if found_after_s is not None
            else f"timeout_s={timeout_s:g} s"
        )
        SimulationError.__init__(
            self,
            "barrier wait that can never complete: nothing left running can arrive on "
            f"the barrier, so the kernel never finishes ({after}; on a GPU it hangs):\n"
            + "\n".join(lines)
            + "\nMake as many copies (copy_gmem_to_smem(..., barrier)) or barrier_arrive "
            "calls land on the barrier per phase as its num_arrivals, and wait each phase "
            "once.",
        )


@dataclasses.dataclass(frozen=True)
class GpuVerifyReport:
    """What :func:`~safedma.testing.verify_gpu` proved.

    ``kernels``: Pallas GPU kernel calls checked; ``programs``: kernel programs
    walked (one per point of each kernel's grid); ``copies_in`` / ``copies_out``:
    GMEM->SMEM and SMEM->GMEM copies issued over all programs; ``barrier_waits``:
    barrier waits passed.
    """

    kernels: int
    programs: int
    copies_in: int
    copies_out: int
    barrier_waits: int
