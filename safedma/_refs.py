"""Branded refs: the types a kernel author annotates kernel parameters with.

Each brand is a ``typing.NewType`` over a private class that exists only for
the type checker. At run time a brand is the identity function and a branded
value *is* the plain Pallas ref, so branding costs nothing. For the checker,
the private classes are nominal and unrelated, which makes these mistakes
type errors:

* a value read from a semaphore (a ``jax.Array``) where a semaphore ref belongs;
* a semaphore array where one semaphore belongs (``.at[i]`` forgotten), and
  indexing a single semaphore again (it has no ``.at`` and no ``[...]``);
* a REGULAR or BARRIER semaphore where a DMA semaphore belongs, and back;
* a semaphore used as data, and data used as a semaphore.

``SemArray.at[i]`` (``i`` an ``int`` or a traced index) is a :data:`SemRef`;
``SemArray.at[pl.ds(...)]`` or ``.at[a:b]`` is again a :data:`SemArray`.
The same holds for :data:`RegularSemArray` and :data:`RegularSem`.

N-D arrays have one brand per rank (:data:`SemArray2`, :data:`SemArray3`,
:data:`RegularSemArray2`): ``.at`` with as many positions as the rank is one
semaphore, fewer positions (or a range) give the brand of the remaining rank,
and more positions than the rank are a type error. A brand per rank is the
encoding both mypy and pyright check without a plugin (a rank type parameter
on one brand cannot be counted against a tuple index's length).

:data:`DataRef` views -- ``.at[...]``, ``.reshape(*shape)``, ``.bitcast(dtype)``
-- are again :data:`DataRef`; the copy checks read the view's own shape and dtype.
"""

from __future__ import annotations

from types import EllipsisType
from typing import NewType, TypeAlias

import jax
from jax.experimental import pallas as pl

__all__ = [
    "SemRef",
    "SemArray",
    "RegularSem",
    "RegularSemArray",
    "SemArray2",
    "SemArray3",
    "SemArray4",
    "RegularSemArray2",
    "BarrierSem",
    "DataRef",
    "Index",
    "DataIndex",
]

Index: TypeAlias = int | jax.Array
"""A single position: a Python int or a traced integer scalar."""

_DataIndexItem: TypeAlias = int | jax.Array | slice | pl.Slice | EllipsisType | None
DataIndex: TypeAlias = _DataIndexItem | tuple[_DataIndexItem, ...]
"""What ``DataRef.at[...]`` and ``DataRef[...]`` accept (as for a numpy array)."""

# This module is where the private brand bases become public brands; for pyright,
# importing underscore names from another module is otherwise an error.
# pyright: reportPrivateUsage=false
from safedma._brand_bases import (
    _BarrierSemaphore,
    _DataRef,
    _DmaSemaphore,
    _DmaSemaphoreArray,
    _DmaSemaphoreArray2,
    _DmaSemaphoreArray3,
    _DmaSemaphoreArray4,
    _RegularSemaphore,
    _RegularSemaphoreArray,
    _RegularSemaphoreArray2,
)

SemRef = NewType("SemRef", _DmaSemaphore)
"""One DMA semaphore: what a copy signals when its bytes have landed."""

SemArray = NewType("SemArray", _DmaSemaphoreArray)
"""An array of DMA semaphores; ``.at[i]`` selects a :data:`SemRef`."""

SemArray2 = NewType("SemArray2", _DmaSemaphoreArray2)
"""A 2-D array of DMA semaphores; ``.at[i, j]`` selects a :data:`SemRef`, ``.at[i]`` a row."""

SemArray3 = NewType("SemArray3", _DmaSemaphoreArray3)
"""A 3-D array of DMA semaphores; ``.at[i, j, k]`` selects a :data:`SemRef`."""

SemArray4 = NewType("SemArray4", _DmaSemaphoreArray4)
"""A 4-D array of DMA semaphores; ``.at[i, j, k, l]`` selects a :data:`SemRef`."""

RegularSem = NewType("RegularSem", _RegularSemaphore)
"""One REGULAR semaphore, for :func:`safedma.signal` / :func:`safedma.wait`."""

RegularSemArray = NewType("RegularSemArray", _RegularSemaphoreArray)
"""An array of REGULAR semaphores; ``.at[i]`` selects a :data:`RegularSem`."""

RegularSemArray2 = NewType("RegularSemArray2", _RegularSemaphoreArray2)
"""A 2-D array of REGULAR semaphores; ``.at[i, j]`` selects a :data:`RegularSem`."""

BarrierSem = NewType("BarrierSem", _BarrierSemaphore)
"""The cross-device barrier semaphore, from :func:`safedma.barrier_semaphore`."""

DataRef = NewType("DataRef", _DataRef)
"""A data ref (kernel input, output or scratch buffer); never a semaphore."""
