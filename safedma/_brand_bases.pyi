"""Type-checker view of the private classes behind safedma's brands (see refs.py)."""

from typing import Any, overload

import jax
import numpy as np
from jax.experimental import pallas as pl

from safedma._refs import (
    DataIndex,
    DataRef,
    RegularSem,
    RegularSemArray,
    SemArray,
    SemRef,
)

class _DmaSemaphore:
    """One DMA semaphore. Deliberately has no ``.at`` and no ``[...]``."""

    __slots__ = ()

class _DmaSemaphoreArrayAt:
    @overload
    def __getitem__(self, index: int | jax.Array, /) -> SemRef: ...
    @overload
    def __getitem__(self, index: slice | pl.Slice, /) -> SemArray: ...

class _DmaSemaphoreArray:
    """An array of DMA semaphores: select one with ``.at[i]``."""

    __slots__ = ()

    @property
    def at(self) -> _DmaSemaphoreArrayAt: ...
    @property
    def shape(self) -> tuple[int, ...]: ...

class _RegularSemaphore:
    """One REGULAR semaphore: signalled and waited by value."""

    __slots__ = ()

class _RegularSemaphoreArrayAt:
    @overload
    def __getitem__(self, index: int | jax.Array, /) -> RegularSem: ...
    @overload
    def __getitem__(self, index: slice | pl.Slice, /) -> RegularSemArray: ...

class _RegularSemaphoreArray:
    """An array of REGULAR semaphores: select one with ``.at[i]``."""

    __slots__ = ()

    @property
    def at(self) -> _RegularSemaphoreArrayAt: ...
    @property
    def shape(self) -> tuple[int, ...]: ...

class _BarrierSemaphore:
    """The kernel's cross-device barrier semaphore."""

    __slots__ = ()

class _DataRefAt:
    def __getitem__(self, index: DataIndex, /) -> DataRef: ...

class _DataRef:
    """A ref to data in HBM, VMEM or SMEM; never a semaphore."""

    __slots__ = ()

    @property
    def at(self) -> _DataRefAt: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def ndim(self) -> int: ...
    def __getitem__(self, index: DataIndex, /) -> jax.Array: ...
    def __setitem__(self, index: DataIndex, value: jax.Array | float | int, /) -> None: ...
