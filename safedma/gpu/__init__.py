"""safedma.gpu: typed TMA copies, SMEM buffers and barriers for Pallas Mosaic GPU kernels.

A layer over ``jax.experimental.pallas.mosaic_gpu`` (plgpu, jax 0.12 or later): a
:class:`Tma` opened around each kernel body (``with gpu.Tma() as tma:``, whose end
refuses a handle never waited) wraps its SMEM scratch (:class:`SmemArray`, buffers
:class:`SmemBuffer` / :class:`WrittenSmem`) and its barriers (:class:`Barriers`,
:class:`Barrier`, arrivals per phase known at trace time).
:func:`copy_gmem_to_smem` returns a :class:`LoadHandle` whose ``wait()`` emits the
``barrier_wait`` and gives the buffer back; :func:`commit_smem` makes written buffers
storable; :func:`copy_smem_to_gmem` returns a :class:`StoreHandle` whose ``wait()`` emits
``wait_smem_to_gmem(n)`` with ``n`` counted at trace time. Correct code emits exactly
the plgpu calls a hand-written kernel makes.

The names load on first use (PEP 562), like ``safedma``'s: importing this package
imports neither jax nor plgpu.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from safedma.gpu._errors import (
        BarrierPhaseError as BarrierPhaseError,
        BufferBusyError as BufferBusyError,
        HandleDroppedError as HandleDroppedError,
        HandleWaitedTwiceError as HandleWaitedTwiceError,
        LoopCarryError as LoopCarryError,
        MissingCommitError as MissingCommitError,
    )
    from safedma.gpu._jax_seam import available as available
    from safedma.gpu._refs import (
        BarrierRef as BarrierRef,
        GmemIndex as GmemIndex,
        GmemRef as GmemRef,
        SmemRef as SmemRef,
    )
    from safedma.gpu._tma import (
        Barrier as Barrier,
        Barriers as Barriers,
        LoadHandle as LoadHandle,
        Slot as Slot,
        SmemArray as SmemArray,
        SmemBuffer as SmemBuffer,
        Step as Step,
        StoreHandle as StoreHandle,
        Tma as Tma,
        WrittenSmem as WrittenSmem,
        commit_smem as commit_smem,
        copy_gmem_to_smem as copy_gmem_to_smem,
        copy_smem_to_gmem as copy_smem_to_gmem,
    )

# Each public name -> the private module that defines it.
_HOMES: dict[str, str] = {
    "Barrier": "safedma.gpu._tma",
    "BarrierPhaseError": "safedma.gpu._errors",
    "BarrierRef": "safedma.gpu._refs",
    "Barriers": "safedma.gpu._tma",
    "BufferBusyError": "safedma.gpu._errors",
    "GmemIndex": "safedma.gpu._refs",
    "GmemRef": "safedma.gpu._refs",
    "HandleDroppedError": "safedma.gpu._errors",
    "HandleWaitedTwiceError": "safedma.gpu._errors",
    "LoadHandle": "safedma.gpu._tma",
    "LoopCarryError": "safedma.gpu._errors",
    "MissingCommitError": "safedma.gpu._errors",
    "Slot": "safedma.gpu._tma",
    "SmemArray": "safedma.gpu._tma",
    "SmemBuffer": "safedma.gpu._tma",
    "SmemRef": "safedma.gpu._refs",
    "Step": "safedma.gpu._tma",
    "StoreHandle": "safedma.gpu._tma",
    "Tma": "safedma.gpu._tma",
    "WrittenSmem": "safedma.gpu._tma",
    "available": "safedma.gpu._jax_seam",
    "commit_smem": "safedma.gpu._tma",
    "copy_gmem_to_smem": "safedma.gpu._tma",
    "copy_smem_to_gmem": "safedma.gpu._tma",
}

__all__ = [
    "Barrier",
    "BarrierPhaseError",
    "BarrierRef",
    "Barriers",
    "BufferBusyError",
    "GmemIndex",
    "GmemRef",
    "HandleDroppedError",
    "HandleWaitedTwiceError",
    "LoadHandle",
    "LoopCarryError",
    "MissingCommitError",
    "Slot",
    "SmemArray",
    "SmemBuffer",
    "SmemRef",
    "Step",
    "StoreHandle",
    "Tma",
    "WrittenSmem",
    "available",
    "commit_smem",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
]

if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'safedma.gpu' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # later look-ups skip this function
        return value


def __dir__() -> list[str]:
    return sorted(__all__)
