"""Typed scratch declarations for ``scratch_shapes`` and ``run_scoped``.

Each function returns the plain pltpu declaration, typed as ``Scratch[T]``
where ``T`` is the brand the kernel receives for it, so that
:func:`run_scoped` passes a correctly branded ref to its body.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import numpy as np
from jax.typing import DTypeLike
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._compat import ArrayAval, RefAval
from safedma._refs import DataRef, RegularSem, RegularSemArray, SemArray, SemRef

__all__ = [
    "Scratch",
    "dma_semaphore",
    "dma_semaphores",
    "regular_semaphore",
    "regular_semaphores",
    "vmem",
    "smem",
    "run_scoped",
]

T = TypeVar("T")
T2 = TypeVar("T2")
R = TypeVar("R")


class Scratch(Generic[T]):
    """A pltpu scratch declaration whose ref, inside the kernel, is a ``T``.

    Only a type: values are the pltpu declarations themselves.
    """

    __slots__ = ()

    if TYPE_CHECKING:
        # What jax's ScratchShape protocol asks for, which every pltpu declaration
        # has: grid specs typed with it (pltpu.PrefetchScalarGridSpec(scratch_shapes=...))
        # then accept a Scratch under mypy and pyright.
        def get_array_aval(self) -> ArrayAval:
            raise NotImplementedError

        def get_ref_aval(self) -> RefAval:
            raise NotImplementedError


def _count(n: int) -> int:
    given = cast(object, n)  # checked at run time too, for unchecked callers
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise ValueError(f"a semaphore array needs a positive int length, got {n!r}.")
    return n


def dma_semaphore() -> Scratch[SemRef]:
    """One DMA semaphore."""
    return cast(Scratch[SemRef], pltpu.SemaphoreType.DMA(()))


def dma_semaphores(n: int) -> Scratch[SemArray]:
    """``n`` DMA semaphores; select one with ``sems.at[i]``."""
    return cast(Scratch[SemArray], pltpu.SemaphoreType.DMA((_count(n),)))


def regular_semaphore() -> Scratch[RegularSem]:
    """One REGULAR semaphore."""
    return cast(Scratch[RegularSem], pltpu.SemaphoreType.REGULAR(()))


def regular_semaphores(n: int) -> Scratch[RegularSemArray]:
    """``n`` REGULAR semaphores; select one with ``sems.at[i]``."""
    return cast(Scratch[RegularSemArray], pltpu.SemaphoreType.REGULAR((_count(n),)))


def vmem(shape: Sequence[int], dtype: DTypeLike) -> Scratch[DataRef]:
    """A VMEM buffer."""
    return cast(Scratch[DataRef], pltpu.VMEM(tuple(shape), np.dtype(dtype)))


def smem(shape: Sequence[int], dtype: DTypeLike) -> Scratch[DataRef]:
    """An SMEM buffer (scalars)."""
    return cast(Scratch[DataRef], pltpu.SMEM(tuple(shape), np.dtype(dtype)))


@overload
def run_scoped(body: Callable[[T], R], scratch: Scratch[T], /) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2], R], scratch: Scratch[T], scratch2: Scratch[T2], /
) -> R: ...
def run_scoped(body: Callable[..., R], *scratch: Scratch[Any]) -> R:
    """``pl.run_scoped`` with typed scratch: allocate, call ``body``, free."""
    result: R = pl.run_scoped(body, *scratch)
    return result
