# pyright: basic
"""safedma's strict stub for ``jax.experimental.pallas.tpu`` (jax 0.10.2 to 0.12.x).

The DMA and semaphore functions take safedma's brands (``safedma.DataRef``,
``SemRef``, ``RegularSem``, ``BarrierSem``) instead of jax's ``Any``, so raw
pltpu kernels whose parameters are annotated with the brands get the static
checks of safedma's mistake catalogue (rows S1-S8, docs/catalogue.md). A stub replaces the whole module, so every other public
name is re-exported from the jax module that defines it and keeps jax's type.

One file serves both jax versions (no ``sys.version_info``): a name or
parameter that exists in only one version is declared, unless accepting it
would let a catalogue mistake through; each such difference is listed with its reason in
``stubs/stubtest/`` (allowlist-*.txt, names-*.txt). Names deprecated in 0.10.2 and removed in
0.12 (``pltpu.semaphore_signal`` and friends, ``pltpu.HOST``) are left out,
so code still using them is flagged before the upgrade breaks it.
"""

import enum
from collections.abc import Hashable
from typing import Literal, Never, type_check_only

import jax
from jax._src import core as _jax_core
from jax._src.basearray import _IndexUpdateRef

# What pl.select_ref and ref views are typed as by jax: a ref like jax.Ref, with no brand.
from jax._src.state.types import TransformedRef as _TransformedRef
from jax._src.pallas import core as _pallas_core
from jax._src.pallas.einshape import einshape as einshape
from jax._src.pallas.mosaic import core as core
from jax._src.pallas.mosaic.core import CompilerParams as CompilerParams
from jax._src.pallas.mosaic.core import CoreType as CoreType
from jax._src.pallas.mosaic.core import GridDimensionSemantics as GridDimensionSemantics
from jax._src.pallas.mosaic.core import MemoryRef as _MosaicMemoryRef
from jax._src.pallas.mosaic.core import MemorySpace as MemorySpace
from jax._src.pallas.mosaic.core import PrefetchScalarGridSpec as PrefetchScalarGridSpec
from jax._src.pallas.mosaic.core import SideEffectType as SideEffectType
from jax._src.pallas.mosaic.core import TensorCoreMesh as TensorCoreMesh
from jax._src.pallas.mosaic.core import create_tensorcore_mesh as create_tensorcore_mesh
from jax._src.pallas.mosaic.core import dma_semaphore as dma_semaphore
from jax._src.pallas.mosaic.helpers import run_on_first_core as run_on_first_core
from jax._src.pallas.mosaic.helpers import sync_copy as sync_copy
from jax._src.pallas.mosaic.interpret.interpret_pallas_call import (
    force_tpu_interpret_mode as force_tpu_interpret_mode,
)
from jax._src.pallas.mosaic.interpret.interpret_pallas_call import (
    reset_tpu_interpret_mode_state as reset_tpu_interpret_mode_state,
)
from jax._src.pallas.mosaic.interpret.interpret_pallas_call import (
    set_tpu_interpret_mode as set_tpu_interpret_mode,
)
from jax._src.pallas.mosaic.interpret.params import InterpretParams as InterpretParams
from jax._src.pallas.mosaic.lowering import LoweringException as LoweringException
from jax._src.pallas.mosaic.pipeline import BufferedRef as BufferedRef
from jax._src.pallas.mosaic.pipeline import BufferedRefBase as BufferedRefBase
from jax._src.pallas.mosaic.pipeline import BufferType as BufferType
from jax._src.pallas.mosaic.pipeline import emit_pipeline as emit_pipeline
from jax._src.pallas.mosaic.pipeline import (
    emit_pipeline_with_allocations as emit_pipeline_with_allocations,
)
from jax._src.pallas.mosaic.primitives import AsyncCopyDescriptor as _AsyncCopyDescriptor
from jax._src.pallas.mosaic.primitives import bitcast as bitcast
from jax._src.pallas.mosaic.primitives import load as load
from jax._src.pallas.mosaic.primitives import matmul_acc_lhs as matmul_acc_lhs
from jax._src.pallas.mosaic.primitives import matmul_pop as matmul_pop
from jax._src.pallas.mosaic.primitives import matmul_push_rhs as matmul_push_rhs
from jax._src.pallas.mosaic.primitives import pack_elementwise as pack_elementwise
from jax._src.pallas.mosaic.primitives import prng_random_bits as prng_random_bits
from jax._src.pallas.mosaic.primitives import prng_seed as prng_seed
from jax._src.pallas.mosaic.primitives import roll as roll
from jax._src.pallas.mosaic.primitives import stochastic_round as stochastic_round
from jax._src.pallas.mosaic.primitives import store as store
from jax._src.pallas.mosaic.primitives import touch as touch
from jax._src.pallas.mosaic.primitives import trace_value as trace_value
from jax._src.pallas.mosaic.primitives import unpack_elementwise as unpack_elementwise
from jax._src.pallas.mosaic.primitives import (
    with_memory_space_constraint as with_memory_space_constraint,
)
from jax._src.pallas.mosaic.random import sample_block as sample_block
from jax._src.pallas.mosaic.random import stateful_bernoulli as stateful_bernoulli
from jax._src.pallas.mosaic.random import stateful_bits as stateful_bits
from jax._src.pallas.mosaic.random import stateful_normal as stateful_normal
from jax._src.pallas.mosaic.random import stateful_uniform as stateful_uniform
from jax._src.pallas.mosaic.random import to_pallas_key as to_pallas_key
from jax._src.pallas.mosaic.tpu_info import ChipVersion as ChipVersion
from jax._src.pallas.mosaic.tpu_info import Tiling as Tiling
from jax._src.pallas.mosaic.tpu_info import TpuInfo as TpuInfo
from jax._src.pallas.mosaic.tpu_info import get_tpu_info as get_tpu_info
from jax._src.pallas.mosaic.tpu_info import get_tpu_info_for_chip as get_tpu_info_for_chip
from jax._src.pallas.mosaic.tpu_info import is_tpu_device as is_tpu_device
from jax._src.pallas.primitives import DeviceIdType as _DeviceIdType
from jax._src.pallas.primitives import reciprocal as reciprocal
from jax._src.state.types import AbstractRef as _AbstractRef

# Public in jax 0.12 only (jax 0.10.2 lacks them; there they are Any and fail
# at run time with AttributeError). The ignores are for 0.10.2; unused-ignore
# keeps them quiet on 0.12.
from jax._src.pallas.mosaic.core import AccMemorySpace as _AccMemorySpace  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.helpers import join_bits as join_bits  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.helpers import pack_fp6 as pack_fp6  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.helpers import split_bits as split_bits  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.helpers import unpack_fp6 as unpack_fp6  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.pipeline import PipelineStep as PipelineStep  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.prefetch import (  # type: ignore[import-not-found, unused-ignore]
    emit_pipeline_with_async_prefetch as emit_pipeline_with_async_prefetch,
)
from jax._src.pallas.mosaic.primitives import annotate as annotate  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.primitives import conv as conv  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.primitives import has_memory_space as has_memory_space  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.primitives import matmul_lhs_fifo as matmul_lhs_fifo  # type: ignore[attr-defined, unused-ignore]
from jax._src.pallas.mosaic.primitives import matmul_pop_fifo as matmul_pop_fifo  # type: ignore[attr-defined, unused-ignore]
from safedma._devices import RawDeviceId as _DeviceId
from safedma._refs import BarrierSem, DataRef, RegularSem, SemRef

# One home for the device-id types: safedma._devices (imported, not redefined).
# Data refs and DMA semaphores are spelled out in each signature (an alias would stand in
# pyright's messages under its own name). A data ref: a ``DataRef``, or a ref its kernel
# annotates with jax's own types (``x_ref: jax.Array`` or ``jax.Ref``; ``.at[...]`` of a
# ``jax.Array`` is an ``_IndexUpdateRef``), never a semaphore brand (S6). A DMA semaphore:
# a ``SemRef``, or a ``jax.Ref`` or ``sems.at[i]`` of an array annotated ``jax.Array``;
# a bare ``jax.Array`` stays an error, as it is what a value read from a semaphore is (S1).

PARALLEL = GridDimensionSemantics.PARALLEL
CORE_PARALLEL = GridDimensionSemantics.CORE_PARALLEL
SUBCORE_PARALLEL = GridDimensionSemantics.SUBCORE_PARALLEL
ARBITRARY = GridDimensionSemantics.ARBITRARY

ACC = _AccMemorySpace
CMEM = MemorySpace.CMEM
SMEM = MemorySpace.SMEM
VMEM = MemorySpace.VMEM
VMEM_SHARED = MemorySpace.VMEM_SHARED
HBM = MemorySpace.HBM
SEMAPHORE = MemorySpace.SEMAPHORE

class SemaphoreType(enum.Enum):
    """Semaphore kinds for ``scratch_shapes``: ``SemaphoreType.DMA((2,))`` and so on."""

    REGULAR = "regular"
    DMA = "dma"
    BARRIER = "barrier"

    @property
    def dtype(self) -> _pallas_core.AbstractSemaphoreTy: ...
    def __call__(self, shape: tuple[int, ...]) -> _MosaicMemoryRef: ...
    def __matmul__(self, other: _pallas_core.Mesh, /) -> _pallas_core.MemoryRef: ...
    def get_array_aval(self) -> _jax_core.ShapedArray: ...
    def get_ref_aval(self) -> _AbstractRef: ...

@type_check_only
class CopyDescriptor(_AsyncCopyDescriptor):
    """What every copy descriptor offers: start it, wait for all of it.

    At run time both kinds are jax's ``AsyncCopyDescriptor``, and for the
    checker they are subclasses of it, so code that annotates jax's class (a
    helper returning one, a ``list[AsyncCopyDescriptor]``) accepts them. The
    checker tells the kinds apart so that a local copy cannot be waited on a
    side it lacks: a method a kind must not offer takes a keyword argument no
    value can fill (``Never``), whose name says the mistake.
    """

    def start(self, priority: int = 0, *, add: Literal[False] = False) -> None:  # type: ignore[override]
        """Start the DMA. ``add=True`` is for local copies only (T5).

        ``priority`` is an ``int``: a type cannot accept an ``int`` variable (``def
        fetch(i, priority=0)``, which pyright types ``int``) and still reject the literal
        ``2``. A priority other than 0 and 1, and a non-zero one on a remote copy, fail
        when the kernel is lowered for a TPU (T4); a negative one at trace time."""

    def wait(self) -> None: ...
    def wait_read(self, *, jax_0_12_only_use_wait_send: Never) -> None: ...  # type: ignore[override, unused-ignore]
    def wait_write(self, *, jax_0_12_only_use_wait_recv: Never) -> None: ...  # type: ignore[override, unused-ignore]

@type_check_only
class LocalCopyDescriptor(CopyDescriptor):
    """A copy on this device: one semaphore, waited with ``wait()`` only."""

    def start(self, priority: int = 0, *, add: bool = False) -> None:
        """Start the DMA; local copies take priority 0 or 1 (T4, checked when lowered).

        ``add=True`` (DMA accumulate) is a SparseCore scatter-add or gather-add, legal
        there on 0.10.2 and 0.12; on a TensorCore it fails lowering, which the stubs
        cannot tell apart (safedma's ``LocalCopy`` checks it at trace time, T5)."""

    # jax 0.12 only: SparseCore push streams (VMEM to HBM, say) track the source read on
    # ``src_sem``; ``wait_read()`` waits it, ``wait_write()`` fences the writes.
    def wait_read(self) -> None: ...  # type: ignore[override]
    def wait_write(self) -> None: ...  # type: ignore[override]
    def wait_send(self, *, local_copy_has_no_send_side_use_wait: Never) -> None: ...  # type: ignore[override]
    def wait_recv(self, *, local_copy_has_no_recv_side_use_wait: Never) -> None: ...  # type: ignore[override]

# A subclass of the local kind, for mypy only: mypy gives a variable the type of its first
# assignment, so a kernel that loops ``for copy in local_copies`` and later ``for copy in
# remote_copies`` (one name, as jax's types allow) would be told the remote descriptors are
# not local ones. A subclass is accepted there, and inside the second loop mypy narrows the
# name to the remote kind, so its methods are checked as a remote copy's. The other order
# (remote first) is still reported by mypy (docs/stubs.md, Limits). The local methods a
# remote copy must not offer are overridden to refuse every call, as in ``CopyDescriptor``.
@type_check_only
class RemoteCopyDescriptor(LocalCopyDescriptor):
    """A copy to another device: ``wait_send()`` on the sender, ``wait_recv()`` on the receiver."""

    def start(self, priority: int = 0, *, add: Literal[False] = False) -> None:  # type: ignore[override]
        """Start the DMA (no ``add=True``: that is for local copies only, T5)."""

    def wait_read(self, *, jax_0_12_only_use_wait_send: Never) -> None: ...  # type: ignore[override]
    def wait_write(self, *, jax_0_12_only_use_wait_recv: Never) -> None: ...  # type: ignore[override]
    def wait_send(self) -> None: ...  # type: ignore[override]
    def wait_recv(self) -> None: ...  # type: ignore[override]

# ``sem=None`` and ``src_sem`` are jax 0.12's, for SparseCore push streams (a local copy
# from VMEM to HBM, VMEM_SHARED or SMEM, or VMEM_SHARED to SMEM), whose destination
# semaphore the hardware ignores: jax warns unless ``sem=None``. A TensorCore copy needs
# ``sem`` and no ``src_sem`` (T6, S4); only the memory spaces tell the two apart, and they
# are not in the types, so those mistakes are left to lowering and safedma's trace checks.
def make_async_copy(
    src_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    dst_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef | None = None,
    *,
    src_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef | None = None,
) -> LocalCopyDescriptor:
    """Describe a copy on this device, tracked by ``sem`` (one DMA semaphore)."""

def async_copy(
    src_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    dst_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef | None = None,
    *,
    src_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef | None = None,
    priority: int = 0,
    add: bool = False,
) -> LocalCopyDescriptor:
    """Describe and start a copy on this device (``add=True``: SparseCore only)."""

def make_async_remote_copy(
    src_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    dst_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    send_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef,
    recv_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef,
    device_id: _DeviceId,
    device_id_type: _DeviceIdType | None = ...,
) -> RemoteCopyDescriptor:
    """Describe a copy to ``device_id``; both semaphores and the device are required."""

def async_remote_copy(
    src_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    dst_ref: DataRef | jax.Array | jax.Ref | _TransformedRef | _IndexUpdateRef,
    send_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef,
    recv_sem: SemRef | jax.Ref | _TransformedRef | _IndexUpdateRef,
    device_id: _DeviceId,
    device_id_type: _DeviceIdType | None = ...,
) -> RemoteCopyDescriptor:
    """Describe and start a copy to ``device_id``."""

def get_barrier_semaphore(tag: Hashable | None = ...) -> BarrierSem:
    """The kernel's barrier semaphore (``tag`` is jax 0.12 only)."""

def core_barrier(
    sem: RegularSem | BarrierSem | jax.Ref | _TransformedRef | _IndexUpdateRef,
    *,
    core_axis_name: str,
) -> None:
    """Synchronise the cores along ``core_axis_name`` with a REGULAR or BARRIER semaphore."""
