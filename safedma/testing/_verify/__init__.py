"""``safedma.testing.verify``: prove a kernel's DMA/semaphore protocol from its jaxpr.

Modules, one job each: ``_jax`` (every jax internal used), ``_program``
(jaxprs compiled to closures, scalars exact), ``_scalars`` (scalar rules),
``_regions`` (buffer boxes of ref views), ``_clocks`` (vector clocks),
``_semantics`` (the TPU DMA/semaphore model), ``_ops`` (memory and
semaphore primitives), ``_kernels`` (one ``pallas_call`` per device, or per
TensorCore of a megacore split), ``_blocks`` (the block each BlockSpec operand's
index map names at a grid point: bounds, revisits, SMEM block values),
``_megacore`` (which chips split which grid dimensions, and how), ``_engine``
(participants, buffers, scheduler), ``_termination`` (loops that cannot end, the
time budget), ``_report`` (report and errors), ``_api`` (:func:`verify`).
"""

from safedma.testing._verify._api import verify
from safedma.testing._verify._report import (
    DeadlockError,
    OutOfBoundsDmaError,
    SemaphoreIndexError,
    SignalAfterExitError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    VerifiedLeftoverError,
    VerifiedRaceError,
    VerifyKernelError,
    VerifyReport,
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
    "VerifyKernelError",
    "VerifyReport",
    "verify",
]
