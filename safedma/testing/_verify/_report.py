"""The verifier's report and errors.

Errors subclass the simulation errors of the same class (a race is a
:class:`RaceDetectedError` whichever tool found it), so one ``pytest.raises``
serves both; the new classes cover what ``simulate`` cannot see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from safedma import _errors as _trace_errors
from safedma.testing._errors import (
    KernelFailedError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    UnsatisfiableWaitError,
)

__all__ = [
    "DeadlockError",
    "OutOfBoundsDmaError",
    "SemaphoreIndexError",
    "SignalAfterExitError",
    "UnwrittenReadError",
    "VerificationUnsupportedError",
    "VerifiedLeftoverError",
    "VerifiedRaceError",
    "VerifyReport",
    "VerifyKernelError",
]


def _init(error: SimulationError, message: str) -> None:
    # The simulate classes take interpret-mode records; ours carry text only.
    SimulationError.__init__(error, message)


class VerifiedRaceError(RaceDetectedError):
    """R1/R7/R9/R10: an access not ordered with a copy (or another access) to the same memory."""

    def __init__(self, message: str) -> None:
        _init(self, message)
        self.races = ()


class VerifiedLeftoverError(LeftoverSemaphoreError):
    """R2/R4: semaphores not back to zero when a device leaves the kernel."""

    def __init__(self, message: str) -> None:
        _init(self, message)
        self.leftovers = ()


class DeadlockError(UnsatisfiableWaitError):
    """R3: every device is blocked or done and no copy or signal in flight can release a wait."""

    def __init__(self, message: str) -> None:
        _init(self, message)
        self.waits = ()
        self.timeout_s = 0.0


class OutOfBoundsDmaError(SimulationError):
    """A copy window (or ref access) outside its buffer."""


class SemaphoreIndexError(SimulationError, _trace_errors.SemaphoreIndexError):
    """R5: a semaphore index outside its semaphore array.

    Also a ``safedma.SemaphoreIndexError``, what the trace-time check raises for a
    static index, so one ``except`` catches the mistake wherever it is found.
    """


class UnwrittenReadError(SimulationError):
    """R6: a buffer read, sent, or returned that nothing wrote."""


class SignalAfterExitError(SimulationError):
    """R8/R10: a signal or copy that may reach a device outside the kernel call it was meant for."""


class VerificationUnsupportedError(SimulationError):
    """The program does something the verifier does not model; use ``simulate`` for it."""


class VerifyKernelError(KernelFailedError):
    """The kernel program is invalid on some device (mismatched copy sizes, bad device id)."""


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` proved: counts over every device and kernel call.

    ``max_bytes_in_flight`` maps "kernel: semaphore" to the most bytes (or
    signals) pending on any one device at once.
    """

    devices: int
    kernels: tuple[str, ...]
    invocations: int
    dmas: int
    remote_dmas: int
    waits: int
    signals: int
    max_bytes_in_flight: Mapping[str, int]

    def __str__(self) -> str:
        lines = [
            f"verified: {len(self.kernels)} kernel(s) {', '.join(self.kernels)} on "
            f"{self.devices} device(s), {self.invocations} invocation(s)",
            f"  {self.dmas} DMAs ({self.remote_dmas} remote), {self.waits} waits, "
            f"{self.signals} signals",
        ]
        if self.max_bytes_in_flight:
            lines.append("  most in flight per semaphore:")
            for name, amount in sorted(self.max_bytes_in_flight.items()):
                lines.append(f"    {name}: {amount}")
        return "\n".join(lines)
