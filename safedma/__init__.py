"""safedma: typed, checked DMA and semaphore code for Pallas TPU kernels.

Annotate kernel parameters with the brands (:data:`DataRef`, :data:`SemRef`,
:data:`SemArray`, :data:`RegularSem`, ...), describe copies with
:class:`LocalCopy` and :class:`RemoteCopy`, start them and wait through the
handles they return, and run the kernel with :func:`pallas_call` (or decorate
it with :func:`kernel`). Mistakes fail under mypy or at trace time; correct
code lowers to exactly the pltpu calls written by hand.
"""

from safedma._copies import (
    Given,
    IncomingHandle,
    LocalCopy,
    LocalHandle,
    Missing,
    RemoteCopy,
    RemoteHandle,
    wait_all_into,
)
from safedma._devices import (
    Device,
    axis_size,
    device,
    logical_device,
    mesh_coords,
    my_index,
    neighbour,
)
from safedma._dma_options import priority, select_ref
from safedma._futures import DmaFuture, checked_futures, finish_async, start_async
from safedma._pipelines import emit_pipeline, sync_copy
from safedma._regular_copies import CountedCopy, CountedHandle, wait_counted
from safedma._shared_waits import wait_bytes, wait_copies
from safedma._errors import (
    CopyDtypeMismatchError,
    CopyNeverWaitedError,
    CopyShapeMismatchError,
    DeviceIdError,
    FutureConsumedTwiceError,
    FutureDroppedError,
    FutureNotWaitedError,
    HandleWaitedTwiceError,
    IncompleteCopyError,
    InvalidAmountError,
    MissingCollectiveIdError,
    MissingSemaphoreError,
    NotARefError,
    PriorityError,
    SafeDmaError,
    SemaphoreIndexError,
    SemaphoreKindError,
    SemaphoreShapeError,
    UnsupportedDmaError,
    WrongOperationError,
)
from safedma._entry_points import checked, pallas_call
from safedma._refs import (
    BarrierSem,
    DataIndex,
    DataRef,
    Index,
    RegularSem,
    RegularSemArray,
    RegularSemArray2,
    SemArray,
    SemArray2,
    SemArray3,
    SemRef,
)
from safedma._scratch import (
    Scratch,
    dma_semaphore,
    dma_semaphores,
    regular_semaphore,
    regular_semaphores,
    run_scoped,
    smem,
    vmem,
)
from safedma._semaphores import barrier_semaphore, read, signal, wait

__version__ = "0.1.0"

__all__ = [
    "BarrierSem",
    "CopyDtypeMismatchError",
    "CopyNeverWaitedError",
    "CopyShapeMismatchError",
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
    "HandleWaitedTwiceError",
    "IncomingHandle",
    "IncompleteCopyError",
    "Index",
    "InvalidAmountError",
    "LocalCopy",
    "LocalHandle",
    "Missing",
    "MissingCollectiveIdError",
    "MissingSemaphoreError",
    "NotARefError",
    "PriorityError",
    "RegularSem",
    "RegularSemArray",
    "RegularSemArray2",
    "RemoteCopy",
    "RemoteHandle",
    "SafeDmaError",
    "Scratch",
    "SemArray",
    "SemArray2",
    "SemArray3",
    "SemRef",
    "SemaphoreIndexError",
    "SemaphoreKindError",
    "SemaphoreShapeError",
    "UnsupportedDmaError",
    "WrongOperationError",
    "axis_size",
    "barrier_semaphore",
    "checked",
    "checked_futures",
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
