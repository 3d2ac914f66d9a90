"""The exceptions safedma raises at trace time.

Every error is raised while the kernel body is being traced, before any
lowering, so the traceback points at the kernel line that made the mistake.
Each message says what was wrong, on which refs, and how to fix it. All derive
from :class:`SafeDmaError`; those that replace a jax ``ValueError`` or
``TypeError`` also derive from it, so existing ``except`` clauses keep working.
The codes in the docstrings (S1, T7, ...) are the anchors of the mistakes in
docs/catalogue.md.
"""

from __future__ import annotations

from safedma._public import publish

__all__ = [
    "SafeDmaError",
    "NotARefError",
    "SemaphoreKindError",
    "ScratchOrderError",
    "SemaphoreShapeError",
    "SemaphoreIndexError",
    "CopyShapeMismatchError",
    "CopyDtypeMismatchError",
    "DeviceIdError",
    "PriorityError",
    "UnsupportedDmaError",
    "MissingSemaphoreError",
    "IncompleteCopyError",
    "CopyNeverWaitedError",
    "HandleWaitedTwiceError",
    "WaitNeverSignalledError",
    "WaitExceedsCopiesError",
    "HandleEscapedError",
    "BranchReturnedRefError",
    "UnsupportedByJaxError",
    "MissingCollectiveIdError",
    "InvalidAmountError",
    "WrongOperationError",
    "FutureDroppedError",
    "FutureConsumedTwiceError",
    "FutureNotWaitedError",
    "PrivateJaxApiError",
]


class SafeDmaError(Exception):
    """Base class of every error safedma raises."""


class NotARefError(SafeDmaError, TypeError):
    """A value (an array, a number, a semaphore count) where a ref belongs (S1, S6)."""


class SemaphoreKindError(SafeDmaError, TypeError):
    """A semaphore of the wrong kind, or data where a semaphore belongs (S3, S6)."""


class ScratchOrderError(SemaphoreKindError, ValueError):
    """``scratch_shapes`` in another order than the kernel's scratch parameters: a
    semaphore handed to a parameter meant for a buffer, or the reverse.

    Also a ``SemaphoreKindError`` and a ``ValueError``, what the first copy raised for it
    before (safedma's and jax's own), so existing ``except`` clauses keep working.
    """


class SemaphoreShapeError(SafeDmaError, ValueError):
    """A semaphore array where one semaphore belongs: ``.at[i]`` is missing (S2)."""


class SemaphoreIndexError(SafeDmaError, IndexError):
    """A static index outside a semaphore array: jax does not check it, the TPU signals
    whatever lies there."""


class CopyShapeMismatchError(SafeDmaError, ValueError):
    """Source and destination of a copy have different shapes (T1)."""


class CopyDtypeMismatchError(SafeDmaError, TypeError):
    """Source and destination of a copy have different dtypes (T2)."""


class DeviceIdError(SafeDmaError, ValueError):
    """A device id that does not fit the mesh in scope (T3, S7)."""


class PriorityError(SafeDmaError, ValueError):
    """A DMA priority outside {0, 1}, or a non-zero priority on a remote copy (T4)."""


class UnsupportedDmaError(SafeDmaError, NotImplementedError):
    """A DMA feature the TPU lowering does not implement, such as ``add=True`` (T5)."""


class MissingSemaphoreError(SafeDmaError, ValueError):
    """A copy without the semaphore it needs (T6)."""


class IncompleteCopyError(SafeDmaError, TypeError):
    """A half-configured :class:`~safedma.RemoteCopy` was started or waited (S4)."""


class CopyNeverWaitedError(SafeDmaError, RuntimeError):
    """A copy was started and not waited before the kernel body returned (T7)."""


class HandleWaitedTwiceError(SafeDmaError, RuntimeError):
    """A handle waited twice in one straight-line block: the kernel would hang (T8)."""


class WaitNeverSignalledError(HandleWaitedTwiceError):
    """A wait on a semaphore slot that no copy or signal in the kernel adds to: it hangs on
    every path (T8).

    Derives from :class:`HandleWaitedTwiceError`, which safedma raised for it before, so
    existing ``except`` clauses keep working.
    """


class WaitExceedsCopiesError(HandleWaitedTwiceError):
    """Waits on a semaphore slot that take more than the copies started on it add: the last
    of them hangs on every path (T8).

    Derives from :class:`HandleWaitedTwiceError`, which safedma raised for it before, so
    existing ``except`` clauses keep working.
    """


class HandleEscapedError(SafeDmaError, ValueError):
    """A handle waited outside the loop iteration or branch that started it.

    Derives from ``ValueError``, which jax raises for the same code ("captures
    constants"), so existing ``except`` clauses keep working.
    """


class BranchReturnedRefError(SafeDmaError, ValueError):
    """A ``pl.when`` / ``lax.cond`` branch returned a ref, typically the buffer a wait gave back.

    Derives from ``ValueError``, which jax raises for the same code ("Cannot
    return `Ref`s from `cond`"), so existing ``except`` clauses keep working.
    """


class UnsupportedByJaxError(SafeDmaError, NotImplementedError):
    """A feature the installed jax version does not have (the message names the version)."""


class MissingCollectiveIdError(SafeDmaError, ValueError):
    """The barrier semaphore was used in a kernel compiled without ``collective_id`` (T9)."""

    @classmethod
    def in_raw_kernel(
        cls, where: str | None, entry: str = "pallas_call"
    ) -> MissingCollectiveIdError:
        """T9 found in a kernel's program (``simulate`` and ``verify``): ``where`` is the
        user's line that takes the barrier, when known; ``entry`` the jax call that
        launched the kernel (``pallas_call`` or ``pl.kernel``), named in the fix."""
        at = f" at {where}" if where else ""
        return cls(
            f"the kernel takes the barrier semaphore{at} (get_barrier_semaphore), but its "
            f"{entry} has no collective_id: pass "
            "compiler_params=pltpu.CompilerParams(collective_id=0) (any int, unique among "
            f"the collectives running at once) to the {entry} (T9)."
        )


class InvalidAmountError(SafeDmaError, TypeError):
    """A semaphore increment or wait value that is not an integer scalar."""


class WrongOperationError(SafeDmaError, AttributeError):
    """An operation the object does not have, such as waiting an unstarted copy (S5, S9).

    Type checkers report these statically; this is the run-time message for
    unchecked code.
    """


class FutureDroppedError(SafeDmaError, RuntimeError):
    """A DMA future was started and never finished: its copy is never waited, and XLA
    may drop the start kernel altogether."""


class FutureConsumedTwiceError(SafeDmaError, RuntimeError):
    """A DMA future was finished twice: the second wait can never be satisfied."""


class FutureNotWaitedError(SafeDmaError, RuntimeError):
    """A future's start kernel started nothing on its semaphore, or its done kernel
    never waited it."""


class PrivateJaxApiError(SafeDmaError, RuntimeError, AttributeError):
    """A jax internal that safedma reads (it has no public spelling) is missing from the
    installed jax: raised where the name is first needed, not at ``import safedma``, and
    instead of the bare ``AttributeError`` or ``ImportError`` deep inside a check. The
    message names the internal, the installed jax and the jax versions safedma is tested
    with. It is an ``AttributeError`` too, so a feature probe (``getattr(module, name,
    None)``, ``hasattr``) still reads a missing name as an absent feature."""


publish(globals(), __name__)  # public classes print as safedma.X
