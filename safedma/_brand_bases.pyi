"""Type-checker view of the private classes behind safedma's brands (see refs.py)."""

from typing import Any, TypeAlias, overload

import jax
import numpy as np
from jax.experimental import pallas as pl
from jax.typing import DTypeLike

from safedma._refs import (
    DataIndex,
    DataRef,
    RegularSem,
    RegularSemArray,
    RegularSemArray2,
    SemArray,
    SemArray2,
    SemArray3,
    SemArray4,
    SemRef,
)

# One position, and a range of positions, in a semaphore array.
_I: TypeAlias = int | jax.Array
_S: TypeAlias = slice | pl.Slice

class _DmaSemaphore:
    """One DMA semaphore. Deliberately has no ``.at`` and no ``[...]``."""

    __slots__ = ()

class _DmaSemaphoreArrayAt:
    @overload
    def __getitem__(self, index: _I, /) -> SemRef: ...
    @overload
    def __getitem__(self, index: _S, /) -> SemArray: ...

class _DmaSemaphoreArray:
    """An array of DMA semaphores: select one with ``.at[i]``."""

    __slots__ = ()

    @property
    def at(self) -> _DmaSemaphoreArrayAt: ...
    @property
    def shape(self) -> tuple[int, ...]: ...

# Rank 2 to 4: as many positions as the rank give one semaphore; fewer, or a
# range in some dimension, give the array brand of the remaining rank. More
# positions than the rank match no overload (a type error).

class _DmaSemaphoreArray2At:
    @overload
    def __getitem__(self, index: tuple[_I, _I], /) -> SemRef: ...
    @overload
    def __getitem__(self, index: _I | tuple[_I, _S] | tuple[_S, _I], /) -> SemArray: ...
    @overload
    def __getitem__(self, index: _S | tuple[_S, _S], /) -> SemArray2: ...

class _DmaSemaphoreArray2:
    """A 2-D array of DMA semaphores: select one with ``.at[i, j]``."""

    __slots__ = ()

    @property
    def at(self) -> _DmaSemaphoreArray2At: ...
    @property
    def shape(self) -> tuple[int, int]: ...

class _DmaSemaphoreArray3At:
    @overload
    def __getitem__(self, index: tuple[_I, _I, _I], /) -> SemRef: ...
    @overload
    def __getitem__(
        self, index: tuple[_I, _I] | tuple[_I, _I, _S] | tuple[_I, _S, _I] | tuple[_S, _I, _I], /
    ) -> SemArray: ...
    @overload
    def __getitem__(
        self,
        index: _I
        | tuple[_I, _S]
        | tuple[_S, _I]
        | tuple[_I, _S, _S]
        | tuple[_S, _I, _S]
        | tuple[_S, _S, _I],
        /,
    ) -> SemArray2: ...
    @overload
    def __getitem__(self, index: _S | tuple[_S, _S] | tuple[_S, _S, _S], /) -> SemArray3: ...

class _DmaSemaphoreArray3:
    """A 3-D array of DMA semaphores: select one with ``.at[i, j, k]``."""

    __slots__ = ()

    @property
    def at(self) -> _DmaSemaphoreArray3At: ...
    @property
    def shape(self) -> tuple[int, int, int]: ...

# Rank 4 (vLLM's hierarchical reduce-scatter indexes send and receive semaphores by
# slot, step, chunk group and dimension): the same rule, result rank = 4 - positions.

class _DmaSemaphoreArray4At:
    @overload
    def __getitem__(self, index: tuple[_I, _I, _I, _I], /) -> SemRef: ...
    @overload
    def __getitem__(
        self,
        index: tuple[_I, _I, _I]
        | tuple[_I, _I, _I, _S]
        | tuple[_I, _I, _S, _I]
        | tuple[_I, _S, _I, _I]
        | tuple[_S, _I, _I, _I],
        /,
    ) -> SemArray: ...
    @overload
    def __getitem__(
        self,
        index: tuple[_I, _I]
        | tuple[_I, _I, _S]
        | tuple[_I, _S, _I]
        | tuple[_S, _I, _I]
        | tuple[_I, _I, _S, _S]
        | tuple[_I, _S, _I, _S]
        | tuple[_I, _S, _S, _I]
        | tuple[_S, _I, _I, _S]
        | tuple[_S, _I, _S, _I]
        | tuple[_S, _S, _I, _I],
        /,
    ) -> SemArray2: ...
    @overload
    def __getitem__(
        self,
        index: _I
        | tuple[_I, _S]
        | tuple[_S, _I]
        | tuple[_I, _S, _S]
        | tuple[_S, _I, _S]
        | tuple[_S, _S, _I]
        | tuple[_I, _S, _S, _S]
        | tuple[_S, _I, _S, _S]
        | tuple[_S, _S, _I, _S]
        | tuple[_S, _S, _S, _I],
        /,
    ) -> SemArray3: ...
    @overload
    def __getitem__(
        self,
        index: _S | tuple[_S, _S] | tuple[_S, _S, _S] | tuple[_S, _S, _S, _S],
        /,
    ) -> SemArray4: ...

class _DmaSemaphoreArray4:
    """A 4-D array of DMA semaphores: select one with ``.at[i, j, k, l]``."""

    __slots__ = ()

    @property
    def at(self) -> _DmaSemaphoreArray4At: ...
    @property
    def shape(self) -> tuple[int, int, int, int]: ...

class _RegularSemaphore:
    """One REGULAR semaphore: signalled and waited by value."""

    __slots__ = ()

class _RegularSemaphoreArrayAt:
    @overload
    def __getitem__(self, index: _I, /) -> RegularSem: ...
    @overload
    def __getitem__(self, index: _S, /) -> RegularSemArray: ...

class _RegularSemaphoreArray:
    """An array of REGULAR semaphores: select one with ``.at[i]``."""

    __slots__ = ()

    @property
    def at(self) -> _RegularSemaphoreArrayAt: ...
    @property
    def shape(self) -> tuple[int, ...]: ...

class _RegularSemaphoreArray2At:
    @overload
    def __getitem__(self, index: tuple[_I, _I], /) -> RegularSem: ...
    @overload
    def __getitem__(self, index: _I | tuple[_I, _S] | tuple[_S, _I], /) -> RegularSemArray: ...
    @overload
    def __getitem__(self, index: _S | tuple[_S, _S], /) -> RegularSemArray2: ...

class _RegularSemaphoreArray2:
    """A 2-D array of REGULAR semaphores: select one with ``.at[i, j]``."""

    __slots__ = ()

    @property
    def at(self) -> _RegularSemaphoreArray2At: ...
    @property
    def shape(self) -> tuple[int, int]: ...

class _BarrierSemaphore:
    """The kernel's cross-device barrier semaphore."""

    __slots__ = ()

class _DataRefAt:
    def __getitem__(self, index: DataIndex | DataRef, /) -> DataRef:
        """A view; a ref of row indices (``shared.at[indices]``) picks rows for a SparseCore
        gather or scatter DMA."""

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
    @overload
    def reshape(self, shape: tuple[int, ...], /) -> DataRef: ...
    @overload
    def reshape(self, *shape: int) -> DataRef:
        """The same bytes seen with another shape (a view, no copy); jax takes a tuple too."""
    def bitcast(self, dtype: DTypeLike, /) -> DataRef:
        """The same bytes seen as another dtype (a view, no copy)."""
    def __getitem__(self, index: DataIndex, /) -> jax.Array: ...
    def __setitem__(self, index: DataIndex, value: jax.Array | float | int, /) -> None: ...
