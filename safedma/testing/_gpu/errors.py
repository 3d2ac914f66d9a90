"""What the GPU checker reports: the verifier's error classes, one new one, and the report.

A deadlock is a :class:`~safedma.testing.DeadlockError`, a race (a missing
``commit_smem`` included: the copy engine reads memory the threads' writes
are not yet visible in) a :class:`~safedma.testing.RaceDetectedError`, as the
TPU verifier reports them; a copy still in flight when the kernel (or the
scope of its buffer) ends is a :class:`CopyInFlightAtExitError`.
"""

from __future__ import annotations

import dataclasses

from safedma.testing._errors import SimulationError
from safedma.testing._verify.errors import (
    DeadlockError,
    VerificationUnsupportedError,
    VerifiedRaceError,
)

__all__ = [
    "CopyInFlightAtExitError",
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
