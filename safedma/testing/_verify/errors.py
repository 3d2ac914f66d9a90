"""The errors verify raises, from any of its passes.

Errors subclass the simulation errors of the same class (a race is a
:class:`RaceDetectedError` whichever tool found it), so one ``pytest.raises``
serves both; the new classes cover what ``simulate`` cannot see.
"""

from __future__ import annotations

from safedma import _errors as _trace_errors
from safedma.testing._errors import (
    DeviceOutsideMeshError,
    KernelFailedError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    UnsatisfiableWaitError,
)

__all__ = [
    "DeadlockError",
    "MissingBarrierError",
    "OutOfBoundsDmaError",
    "SemaphoreIndexError",
    "SignalAfterExitError",
    "UnwrittenReadError",
    "VerificationUnsupportedError",
    "VerifiedDeviceOutsideMeshError",
    "VerifiedLeftoverError",
    "VerifiedRaceError",
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


class MissingBarrierError(SignalAfterExitError):
    """R10: a remote write or signal that may land before its target entered the kernel
    call: a barrier is missing before it (or a barrier round reused across calls).

    Derives from :class:`SignalAfterExitError`, which verify raised for it before, so
    existing ``except`` clauses keep working.
    """


class VerificationUnsupportedError(SimulationError):
    """The program does something the verifier does not model; use ``simulate`` for it."""


class VerifyKernelError(KernelFailedError):
    """The kernel program is invalid on some device (mismatched copy sizes, bad device id)."""


class VerifiedDeviceOutsideMeshError(VerifyKernelError, DeviceOutsideMeshError):
    """A device id outside the mesh on some device: also the
    :class:`~safedma.testing.DeviceOutsideMeshError` simulate and the sanitizer raise for
    it, so one ``pytest.raises`` serves all three."""
