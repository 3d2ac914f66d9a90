"""``safedma.testing.verify``: prove a kernel's DMA/semaphore protocol from its jaxpr.

The passes, one subpackage each, each importing only those listed before it:

* ``jax_internals``, ``errors`` and ``naming``: every jax internal verify reads (each
  with its reason), the errors every pass raises, and how messages name a kernel's
  buffers and semaphores (simulate names them the same way).
* ``model``: the TPU DMA/semaphore protocol, with no jaxpr in it: buffers and the
  regions views cover, vector clocks, what a wait guarantees, semaphores and copies in
  flight, what a leftover count is made of, and verify's time budget.
* ``program``: the program read: jaxprs compiled into closures each participant runs,
  exact scalars, the values around the kernels, and what that program reads of the
  kernels' outputs.
* ``walk``: the per-device walk: the engine (participants, buffers, scheduler) and the
  rules it adds to the program: memory and semaphore operations, ``pallas_call``
  (blocks, grids, the megacore split), ``pl.kernel`` over cores, ``run_state``.
* ``lockstep``: the path that walks an SPMD program once for every device, proving it
  clean or giving up so the per-device walk answers.
* ``face``: :func:`verify` and its :class:`VerifyReport`.
"""

from safedma.testing._verify.errors import (
    DeadlockError,
    OutOfBoundsDmaError,
    SemaphoreIndexError,
    MissingBarrierError,
    SignalAfterExitError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    VerifiedLeftoverError,
    VerifiedRaceError,
    VerifyKernelError,
)
from safedma.testing._verify.face.api import verify
from safedma.testing._verify.face.report import VerifyReport

__all__ = [
    "DeadlockError",
    "OutOfBoundsDmaError",
    "SemaphoreIndexError",
    "MissingBarrierError",
    "SignalAfterExitError",
    "UnwrittenReadError",
    "VerificationUnsupportedError",
    "VerifiedLeftoverError",
    "VerifiedRaceError",
    "VerifyKernelError",
    "VerifyReport",
    "verify",
]
