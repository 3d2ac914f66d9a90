"""The errors the typed GPU layer raises at trace time.

Each names the user's line (the first frame outside ``safedma.gpu``), what is wrong
and the fix. All derive from :class:`~safedma.SafeDmaError`.
"""

from __future__ import annotations

from safedma._errors import HandleWaitedTwiceError, SafeDmaError

__all__ = [
    "BarrierPhaseError",
    "BufferBusyError",
    "HandleDroppedError",
    "HandleWaitedTwiceError",
    "LoopCarryError",
    "MissingCommitError",
]


class BufferBusyError(SafeDmaError, RuntimeError):
    """An SMEM buffer used while a TMA copy owns it: read or written while a load lands in
    it, or overwritten while a store may still read it."""


class MissingCommitError(SafeDmaError, RuntimeError):
    """SMEM written by the kernel handed to a TMA store without ``commit_smem`` first."""


class BarrierPhaseError(SafeDmaError, RuntimeError):
    """A barrier wait that would hang: its phase cannot get its arrivals, or a further
    arrival would complete the next phase before this one is waited."""


class LoopCarryError(SafeDmaError, RuntimeError):
    """A ``Tma.fori_loop`` whose step does not end as it began, one step on: a handle in
    flight not carried, or the carry returned for other buffers than it came in for."""


class HandleDroppedError(SafeDmaError, RuntimeError):
    """A load or store handle never waited when the kernel body's ``with gpu.Tma()``
    block ends: the copy may still write or read SMEM after the kernel exits."""


# The classes defined here print as safedma.gpu.X, the path users import them by.
for _error in (
    BufferBusyError,
    MissingCommitError,
    BarrierPhaseError,
    LoopCarryError,
    HandleDroppedError,
):
    _error.__module__ = "safedma.gpu"
