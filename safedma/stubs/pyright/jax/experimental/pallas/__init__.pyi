# pyright: basic
"""safedma's strict stub for ``jax.experimental.pallas`` (jax 0.10.2 to 0.12.x).

Only the semaphore functions are retyped, with safedma's brands: a value read
from a semaphore is a ``jax.Array`` and never a semaphore (S1), DMA semaphores
cannot be signalled or waited by value (S3), arrays of semaphores need
``.at[i]`` (S2), and device ids have the pltpu forms only (S7, S8). Every
other public name is re-exported from the jax module that defines it, so it
keeps jax's own type. ``pl.dot`` and ``pl.debug_checks_enabled`` (deprecated
in 0.10.2, removed in 0.12) are left out.
"""

from typing import TypeAlias

import jax
from jax._src import core as _jax_core
from jax._src.basearray import _IndexUpdateRef

# What pl.select_ref and ref views are typed as by jax: a ref like jax.Ref, with no brand.
from jax._src.state.types import TransformedRef as _TransformedRef
from jax._src.pallas.core import BlockDim as BlockDim
from jax._src.pallas.core import Blocked as Blocked
from jax._src.pallas.core import BlockSpec as BlockSpec
from jax._src.pallas.core import BoundedSlice as BoundedSlice
from jax._src.pallas.core import Buffered as Buffered
from jax._src.pallas.core import CompilerParams as CompilerParams
from jax._src.pallas.core import CostEstimate as CostEstimate
from jax._src.pallas.core import Element as Element
from jax._src.pallas.core import GridSpec as GridSpec
from jax._src.pallas.core import Indirect as Indirect
from jax._src.pallas.core import MemoryRef as MemoryRef
from jax._src.pallas.core import MemorySpace as MemorySpace
from jax._src.pallas.core import RevisitMode as RevisitMode
from jax._src.pallas.core import Squeezed as Squeezed
from jax._src.pallas.core import core_map as core_map
from jax._src.pallas.core import debug_check as debug_check
from jax._src.pallas.core import enable_debug_checks as enable_debug_checks
from jax._src.pallas.core import enable_poison_buffers as enable_poison_buffers
from jax._src.pallas.core import lower_as_mlir as lower_as_mlir
from jax._src.pallas.core import no_block_spec as no_block_spec
from jax._src.pallas.core import pallas_export_experimental as pallas_export_experimental
from jax._src.pallas.core import semaphore as semaphore
from jax._src.pallas.core import squeezed as squeezed
from jax._src.pallas.cost_estimate import estimate_cost as estimate_cost
from jax._src.pallas.helpers import empty as empty
from jax._src.pallas.helpers import empty_like as empty_like
from jax._src.pallas.helpers import empty_ref_like as empty_ref_like
from jax._src.pallas.helpers import kernel as kernel
from jax._src.pallas.helpers import loop as loop
from jax._src.pallas.helpers import select_ref as select_ref
from jax._src.pallas.helpers import when as when
from jax._src.pallas.helpers import with_scoped as with_scoped
from jax._src.pallas.pallas_call import pallas_call as pallas_call
from jax._src.pallas.pallas_call import pallas_call_p as pallas_call_p
from jax._src.pallas.primitives import DeviceIdType as DeviceIdType
from jax._src.pallas.primitives import debug_print as debug_print
from jax._src.pallas.primitives import delay as delay
from jax._src.pallas.primitives import get_global as get_global
from jax._src.pallas.primitives import multiple_of as multiple_of
from jax._src.pallas.primitives import num_programs as num_programs
from jax._src.pallas.primitives import program_id as program_id
from jax._src.pallas.primitives import reciprocal as reciprocal
from jax._src.pallas.primitives import run_scoped as run_scoped
from jax._src.pallas.utils import align_to as align_to
from jax._src.pallas.utils import cdiv as cdiv
from jax._src.pallas.utils import next_power_of_2 as next_power_of_2
from jax._src.pallas.utils import strides_from_shape as strides_from_shape
from jax._src.state.discharge import run_state as run_state
from jax._src.indexing import Slice as Slice
from jax._src.indexing import ds as ds
from jax._src.indexing import dslice as dslice
from jax._src.state.primitives import broadcast_to as broadcast_to
from safedma._devices import RawDeviceId as _DeviceId
from safedma._refs import BarrierSem, RegularSem, SemRef

_Index: TypeAlias = int | jax.Array
# One home for the device-id types: safedma._devices (imported, not redefined).
# A semaphore may also be one its kernel annotates with jax's own types (spelled out in
# each signature, so that pyright's messages show it): a ``jax.Ref``, or ``sems.at[i]``
# of an array annotated ``jax.Array`` (an ``_IndexUpdateRef``). A bare ``jax.Array``
# stays an error: it is what a value read from a semaphore is (S1). ``semaphore_signal`` and
# ``semaphore_wait`` also take ``None``: pyright types an unannotated ``ring_sem=None``
# parameter ``Unknown | None``, and kernels pass such a parameter where their own flags
# guarantee it was given; a ``None`` that does arrive fails at trace time ("Cannot wait on
# a non-semaphore Ref: None"). ``semaphore_read(None)`` traces, so it stays an error.

ANY = MemorySpace.ANY
HOST: MemorySpace | _jax_core.MemorySpace
"""``pl.HOST``: a pallas ``MemorySpace`` member in jax 0.10.2, jax's core ``MemorySpace.Host`` in 0.12."""

def semaphore_read(
    sem_or_view: SemRef | RegularSem | BarrierSem | jax.Ref | _TransformedRef | _IndexUpdateRef,
) -> jax.Array:
    """The current value of one semaphore: a ``jax.Array``, never a semaphore."""

def semaphore_signal(
    sem_or_view: RegularSem | BarrierSem | jax.Ref | _TransformedRef | _IndexUpdateRef | None,
    inc: _Index = 1,
    *,
    device_id: _DeviceId | None = None,
    device_id_type: DeviceIdType | None = ...,
    core_index: _Index | None = None,
) -> None:
    """Add ``inc`` to a REGULAR or BARRIER semaphore, here or on ``device_id``."""

def semaphore_wait(
    sem_or_view: RegularSem | BarrierSem | jax.Ref | _TransformedRef | _IndexUpdateRef | None,
    value: _Index = 1,
    *,
    decrement: bool = True,
) -> None:
    """Block until a REGULAR or BARRIER semaphore reaches ``value``."""
