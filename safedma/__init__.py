"""safedma: typed, checked DMA and semaphore code for Pallas TPU kernels.

Annotate kernel parameters with the brands (:data:`DataRef`, :data:`SemRef`,
:data:`SemArray`, :data:`RegularSem`, ...), describe copies with
:class:`LocalCopy` and :class:`RemoteCopy`, start them and wait through the
handles they return, and run the kernel with :func:`pallas_call` (or decorate
it with :func:`checked`). Mistakes fail under mypy or at trace time; correct
code lowers to exactly the pltpu calls written by hand.

The names load on first use (PEP 562): ``import safedma`` and its typing-only parts
(``safedma.mypy_plugin``, ``safedma.stubs``) do not import jax; ``safedma.X`` or
``from safedma import X`` imports the private module that defines ``X``. The
``TYPE_CHECKING`` imports below show every name to type checkers.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from safedma._version import __version__ as __version__

if TYPE_CHECKING:
    from safedma._copies import (
        Given as Given,
        Handle as Handle,
        IncomingHandle as IncomingHandle,
        LocalCopy as LocalCopy,
        LocalHandle as LocalHandle,
        Missing as Missing,
        RemoteCopy as RemoteCopy,
        RemoteHandle as RemoteHandle,
        wait_all_into as wait_all_into,
    )
    from safedma._devices import (
        axis_size as axis_size,
        Device as Device,
        device as device,
        logical_device as logical_device,
        mesh_coords as mesh_coords,
        my_index as my_index,
        neighbour as neighbour,
    )
    from safedma._dma_options import (
        priority as priority,
        select_ref as select_ref,
    )
    from safedma._entry_points import (
        checked as checked,
        core_kernel as core_kernel,
        CoreKernelOptions as CoreKernelOptions,
        KernelCall as KernelCall,
        pallas_call as pallas_call,
        PallasCallOptions as PallasCallOptions,
    )
    from safedma._errors import (
        CopyDtypeMismatchError as CopyDtypeMismatchError,
        CopyNeverWaitedError as CopyNeverWaitedError,
        CopyShapeMismatchError as CopyShapeMismatchError,
        DeviceIdError as DeviceIdError,
        FutureConsumedTwiceError as FutureConsumedTwiceError,
        FutureDroppedError as FutureDroppedError,
        FutureNotWaitedError as FutureNotWaitedError,
        HandleEscapedError as HandleEscapedError,
        BranchReturnedRefError as BranchReturnedRefError,
        HandleWaitedTwiceError as HandleWaitedTwiceError,
        WaitExceedsCopiesError as WaitExceedsCopiesError,
        WaitNeverSignalledError as WaitNeverSignalledError,
        IncompleteCopyError as IncompleteCopyError,
        InvalidAmountError as InvalidAmountError,
        MissingCollectiveIdError as MissingCollectiveIdError,
        MissingSemaphoreError as MissingSemaphoreError,
        NotARefError as NotARefError,
        PriorityError as PriorityError,
        PrivateJaxApiError as PrivateJaxApiError,
        SafeDmaError as SafeDmaError,
        SemaphoreIndexError as SemaphoreIndexError,
        ScratchOrderError as ScratchOrderError,
        SemaphoreKindError as SemaphoreKindError,
        SemaphoreShapeError as SemaphoreShapeError,
        UnsupportedByJaxError as UnsupportedByJaxError,
        UnsupportedDmaError as UnsupportedDmaError,
        WrongOperationError as WrongOperationError,
    )
    from safedma._futures import (
        checked_futures as checked_futures,
        DmaFuture as DmaFuture,
        finish_async as finish_async,
        start_async as start_async,
    )
    from safedma._pipelines import (
        emit_pipeline as emit_pipeline,
        sync_copy as sync_copy,
    )
    from safedma._refs import (
        BarrierSem as BarrierSem,
        DataIndex as DataIndex,
        DataRef as DataRef,
        Index as Index,
        RegularSem as RegularSem,
        RegularSemArray as RegularSemArray,
        RegularSemArray2 as RegularSemArray2,
        SemArray as SemArray,
        SemArray2 as SemArray2,
        SemArray3 as SemArray3,
        SemArray4 as SemArray4,
        SemRef as SemRef,
    )
    from safedma._regular_copies import (
        CountedCopy as CountedCopy,
        CountedHandle as CountedHandle,
        wait_counted as wait_counted,
    )
    from safedma._sanitize._errors import (
        SanitizerUnsupportedError as SanitizerUnsupportedError,
    )
    from safedma._sanitize._options import (
        SanitizeOptions as SanitizeOptions,
    )
    from safedma._sanitize._report import (
        sanitizer_errors as sanitizer_errors,
    )
    from safedma._scratch import (
        dma_semaphore as dma_semaphore,
        dma_semaphores as dma_semaphores,
        regular_semaphore as regular_semaphore,
        regular_semaphores as regular_semaphores,
        run_scoped as run_scoped,
        Scratch as Scratch,
        smem as smem,
        vmem as vmem,
    )
    from safedma._semaphores import (
        barrier_semaphore as barrier_semaphore,
        read as read,
        signal as signal,
        wait as wait,
    )
    from safedma._shared_waits import (
        wait_bytes as wait_bytes,
        wait_copies as wait_copies,
    )

# Each public name -> the private module that defines it.
_HOMES: dict[str, str] = {
    "BarrierSem": "safedma._refs",
    "CopyDtypeMismatchError": "safedma._errors",
    "CopyNeverWaitedError": "safedma._errors",
    "CopyShapeMismatchError": "safedma._errors",
    "CoreKernelOptions": "safedma._entry_points",
    "CountedCopy": "safedma._regular_copies",
    "CountedHandle": "safedma._regular_copies",
    "DataIndex": "safedma._refs",
    "DataRef": "safedma._refs",
    "Device": "safedma._devices",
    "DeviceIdError": "safedma._errors",
    "DmaFuture": "safedma._futures",
    "FutureConsumedTwiceError": "safedma._errors",
    "FutureDroppedError": "safedma._errors",
    "FutureNotWaitedError": "safedma._errors",
    "Given": "safedma._copies",
    "Handle": "safedma._copies",
    "HandleEscapedError": "safedma._errors",
    "BranchReturnedRefError": "safedma._errors",
    "HandleWaitedTwiceError": "safedma._errors",
    "ScratchOrderError": "safedma._errors",
    "WaitExceedsCopiesError": "safedma._errors",
    "WaitNeverSignalledError": "safedma._errors",
    "IncomingHandle": "safedma._copies",
    "IncompleteCopyError": "safedma._errors",
    "Index": "safedma._refs",
    "InvalidAmountError": "safedma._errors",
    "KernelCall": "safedma._entry_points",
    "LocalCopy": "safedma._copies",
    "LocalHandle": "safedma._copies",
    "Missing": "safedma._copies",
    "MissingCollectiveIdError": "safedma._errors",
    "MissingSemaphoreError": "safedma._errors",
    "NotARefError": "safedma._errors",
    "PallasCallOptions": "safedma._entry_points",
    "PriorityError": "safedma._errors",
    "PrivateJaxApiError": "safedma._errors",
    "RegularSem": "safedma._refs",
    "RegularSemArray": "safedma._refs",
    "RegularSemArray2": "safedma._refs",
    "RemoteCopy": "safedma._copies",
    "RemoteHandle": "safedma._copies",
    "SafeDmaError": "safedma._errors",
    "SanitizeOptions": "safedma._sanitize._options",
    "SanitizerUnsupportedError": "safedma._sanitize._errors",
    "Scratch": "safedma._scratch",
    "SemArray": "safedma._refs",
    "SemArray2": "safedma._refs",
    "SemArray3": "safedma._refs",
    "SemArray4": "safedma._refs",
    "SemRef": "safedma._refs",
    "SemaphoreIndexError": "safedma._errors",
    "SemaphoreKindError": "safedma._errors",
    "SemaphoreShapeError": "safedma._errors",
    "UnsupportedByJaxError": "safedma._errors",
    "UnsupportedDmaError": "safedma._errors",
    "WrongOperationError": "safedma._errors",
    "axis_size": "safedma._devices",
    "barrier_semaphore": "safedma._semaphores",
    "checked": "safedma._entry_points",
    "checked_futures": "safedma._futures",
    "core_kernel": "safedma._entry_points",
    "device": "safedma._devices",
    "dma_semaphore": "safedma._scratch",
    "dma_semaphores": "safedma._scratch",
    "emit_pipeline": "safedma._pipelines",
    "finish_async": "safedma._futures",
    "logical_device": "safedma._devices",
    "mesh_coords": "safedma._devices",
    "my_index": "safedma._devices",
    "neighbour": "safedma._devices",
    "pallas_call": "safedma._entry_points",
    "priority": "safedma._dma_options",
    "read": "safedma._semaphores",
    "regular_semaphore": "safedma._scratch",
    "regular_semaphores": "safedma._scratch",
    "run_scoped": "safedma._scratch",
    "sanitizer_errors": "safedma._sanitize._report",
    "select_ref": "safedma._dma_options",
    "signal": "safedma._semaphores",
    "smem": "safedma._scratch",
    "start_async": "safedma._futures",
    "sync_copy": "safedma._pipelines",
    "vmem": "safedma._scratch",
    "wait": "safedma._semaphores",
    "wait_all_into": "safedma._copies",
    "wait_bytes": "safedma._shared_waits",
    "wait_copies": "safedma._shared_waits",
    "wait_counted": "safedma._regular_copies",
}

__all__ = [
    "BarrierSem",
    "CopyDtypeMismatchError",
    "CopyNeverWaitedError",
    "CopyShapeMismatchError",
    "CoreKernelOptions",
    "CountedCopy",
    "CountedHandle",
    "DataIndex",
    "DataRef",
    "Device",
    "DeviceIdError",
    "DmaFuture",
    "FutureConsumedTwiceError",
    "FutureDroppedError",
    "FutureNotWaitedError",
    "Given",
    "Handle",
    "HandleEscapedError",
    "BranchReturnedRefError",
    "HandleWaitedTwiceError",
    "ScratchOrderError",
    "WaitExceedsCopiesError",
    "WaitNeverSignalledError",
    "IncomingHandle",
    "IncompleteCopyError",
    "Index",
    "InvalidAmountError",
    "KernelCall",
    "LocalCopy",
    "LocalHandle",
    "Missing",
    "MissingCollectiveIdError",
    "MissingSemaphoreError",
    "NotARefError",
    "PallasCallOptions",
    "PriorityError",
    "PrivateJaxApiError",
    "RegularSem",
    "RegularSemArray",
    "RegularSemArray2",
    "RemoteCopy",
    "RemoteHandle",
    "SafeDmaError",
    "SanitizeOptions",
    "SanitizerUnsupportedError",
    "Scratch",
    "SemArray",
    "SemArray2",
    "SemArray3",
    "SemArray4",
    "SemRef",
    "SemaphoreIndexError",
    "SemaphoreKindError",
    "SemaphoreShapeError",
    "UnsupportedByJaxError",
    "UnsupportedDmaError",
    "WrongOperationError",
    "axis_size",
    "barrier_semaphore",
    "checked",
    "checked_futures",
    "core_kernel",
    "device",
    "dma_semaphore",
    "dma_semaphores",
    "emit_pipeline",
    "finish_async",
    "logical_device",
    "mesh_coords",
    "my_index",
    "neighbour",
    "pallas_call",
    "priority",
    "read",
    "regular_semaphore",
    "regular_semaphores",
    "run_scoped",
    "sanitizer_errors",
    "select_ref",
    "signal",
    "smem",
    "start_async",
    "sync_copy",
    "vmem",
    "wait",
    "wait_all_into",
    "wait_bytes",
    "wait_copies",
    "wait_counted",
]

if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'safedma' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later look-ups skip this function
        return value


def __dir__() -> list[str]:
    """The public names, and the public subpackages already imported (``safedma.testing``):
    not the helpers this module imports for itself (``importlib``, ``TYPE_CHECKING``)."""
    loaded = [
        name
        for name, value in globals().items()
        if isinstance(value, ModuleType)
        and not name.startswith("_")
        and value.__name__ == f"{__name__}.{name}"
    ]
    return sorted({*__all__, "__version__", *loaded})
