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
from typing import TYPE_CHECKING

from safedma._version import __version__ as __version__

if TYPE_CHECKING:
    from safedma._copies import (
        Given as Given,
        IncomingHandle as IncomingHandle,
        LocalCopy as LocalCopy,
        LocalHandle as LocalHandle,
        Missing as Missing,
        RemoteCopy as RemoteCopy,
        RemoteHandle as RemoteHandle,
        wait_all_into as wait_all_into,
    )
    from safedma._devices import (
        Device as Device,
        axis_size as axis_size,
        device as device,
        mesh_coords as mesh_coords,
        my_index as my_index,
        neighbour as neighbour,
    )
    from safedma._errors import (
        CopyDtypeMismatchError as CopyDtypeMismatchError,
        CopyNeverWaitedError as CopyNeverWaitedError,
        CopyShapeMismatchError as CopyShapeMismatchError,
        DeviceIdError as DeviceIdError,
        HandleWaitedTwiceError as HandleWaitedTwiceError,
        IncompleteCopyError as IncompleteCopyError,
        InvalidAmountError as InvalidAmountError,
        MissingCollectiveIdError as MissingCollectiveIdError,
        MissingSemaphoreError as MissingSemaphoreError,
        NotARefError as NotARefError,
        PriorityError as PriorityError,
        SafeDmaError as SafeDmaError,
        SemaphoreKindError as SemaphoreKindError,
        SemaphoreShapeError as SemaphoreShapeError,
        UnsupportedDmaError as UnsupportedDmaError,
        WrongOperationError as WrongOperationError,
    )
    from safedma._entry_points import (
        checked as checked,
        pallas_call as pallas_call,
    )
    from safedma._refs import (
        BarrierSem as BarrierSem,
        DataIndex as DataIndex,
        DataRef as DataRef,
        Index as Index,
        RegularSem as RegularSem,
        RegularSemArray as RegularSemArray,
        SemArray as SemArray,
        SemRef as SemRef,
    )
    from safedma._scratch import (
        Scratch as Scratch,
        dma_semaphore as dma_semaphore,
        dma_semaphores as dma_semaphores,
        regular_semaphore as regular_semaphore,
        regular_semaphores as regular_semaphores,
        run_scoped as run_scoped,
        smem as smem,
        vmem as vmem,
    )
    from safedma._semaphores import (
        barrier_semaphore as barrier_semaphore,
        read as read,
        signal as signal,
        wait as wait,
    )

# Each public name -> the private module that defines it.
_HOMES: dict[str, str] = {
    "Given": "safedma._copies",
    "IncomingHandle": "safedma._copies",
    "LocalCopy": "safedma._copies",
    "LocalHandle": "safedma._copies",
    "Missing": "safedma._copies",
    "RemoteCopy": "safedma._copies",
    "RemoteHandle": "safedma._copies",
    "wait_all_into": "safedma._copies",
    "Device": "safedma._devices",
    "axis_size": "safedma._devices",
    "device": "safedma._devices",
    "mesh_coords": "safedma._devices",
    "my_index": "safedma._devices",
    "neighbour": "safedma._devices",
    "CopyDtypeMismatchError": "safedma._errors",
    "CopyNeverWaitedError": "safedma._errors",
    "CopyShapeMismatchError": "safedma._errors",
    "DeviceIdError": "safedma._errors",
    "HandleWaitedTwiceError": "safedma._errors",
    "IncompleteCopyError": "safedma._errors",
    "InvalidAmountError": "safedma._errors",
    "MissingCollectiveIdError": "safedma._errors",
    "MissingSemaphoreError": "safedma._errors",
    "NotARefError": "safedma._errors",
    "PriorityError": "safedma._errors",
    "SafeDmaError": "safedma._errors",
    "SemaphoreKindError": "safedma._errors",
    "SemaphoreShapeError": "safedma._errors",
    "UnsupportedDmaError": "safedma._errors",
    "WrongOperationError": "safedma._errors",
    "checked": "safedma._entry_points",
    "pallas_call": "safedma._entry_points",
    "BarrierSem": "safedma._refs",
    "DataIndex": "safedma._refs",
    "DataRef": "safedma._refs",
    "Index": "safedma._refs",
    "RegularSem": "safedma._refs",
    "RegularSemArray": "safedma._refs",
    "SemArray": "safedma._refs",
    "SemRef": "safedma._refs",
    "Scratch": "safedma._scratch",
    "dma_semaphore": "safedma._scratch",
    "dma_semaphores": "safedma._scratch",
    "regular_semaphore": "safedma._scratch",
    "regular_semaphores": "safedma._scratch",
    "run_scoped": "safedma._scratch",
    "smem": "safedma._scratch",
    "vmem": "safedma._scratch",
    "barrier_semaphore": "safedma._semaphores",
    "read": "safedma._semaphores",
    "signal": "safedma._semaphores",
    "wait": "safedma._semaphores",
}

__all__ = [
    "BarrierSem",
    "CopyDtypeMismatchError",
    "CopyNeverWaitedError",
    "CopyShapeMismatchError",
    "DataIndex",
    "DataRef",
    "Device",
    "DeviceIdError",
    "Given",
    "HandleWaitedTwiceError",
    "IncomingHandle",
    "IncompleteCopyError",
    "InvalidAmountError",
    "Index",
    "LocalCopy",
    "LocalHandle",
    "Missing",
    "MissingCollectiveIdError",
    "MissingSemaphoreError",
    "NotARefError",
    "PriorityError",
    "RegularSem",
    "RegularSemArray",
    "RemoteCopy",
    "RemoteHandle",
    "SafeDmaError",
    "Scratch",
    "SemArray",
    "SemRef",
    "SemaphoreKindError",
    "SemaphoreShapeError",
    "UnsupportedDmaError",
    "WrongOperationError",
    "axis_size",
    "barrier_semaphore",
    "device",
    "dma_semaphore",
    "dma_semaphores",
    "checked",
    "mesh_coords",
    "my_index",
    "neighbour",
    "pallas_call",
    "read",
    "regular_semaphore",
    "regular_semaphores",
    "run_scoped",
    "signal",
    "smem",
    "vmem",
    "wait",
    "wait_all_into",
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
    return sorted(set(globals()) | set(__all__))
