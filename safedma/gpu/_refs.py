"""The brands of a Pallas GPU kernel's refs, for its parameters' annotations.

jax leaves its refs' ``.at`` and indexing unannotated, and gives GMEM, SMEM and
barrier refs one type. These classes exist only for type checkers: annotate a kernel
body's parameters with them (the values are jax's refs; nothing is wrapped or
converted), and a GMEM ref where an SMEM buffer belongs, or raw indexing of an SMEM ref
the typed layer owns, is a type error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import jax
    from jax.experimental import pallas as pl

__all__ = ["BarrierRef", "GmemIndex", "GmemRef", "SmemRef"]

_Position: TypeAlias = "int | jax.Array | pl.Slice | slice"
GmemIndex: TypeAlias = "_Position | tuple[_Position, ...]"
"""What selects a view of a GMEM ref: positions, ``pl.ds`` slices, or a tuple of them."""


def _annotation_only(what: str) -> TypeError:
    return TypeError(
        f"safedma.gpu.{what} is a type annotation for a kernel parameter; the value is jax's ref."
    )


class _GmemAt:
    __slots__ = ()

    def __getitem__(self, index: GmemIndex, /) -> GmemRef:
        raise _annotation_only("GmemRef")


class GmemRef:
    """A ref in GPU global memory (a kernel input or output): ``.at[...]`` selects a view
    that a TMA copy reads or writes."""

    __slots__ = ()

    @property
    def at(self) -> _GmemAt:
        raise _annotation_only("GmemRef")

    @property
    def shape(self) -> tuple[int, ...]:
        raise _annotation_only("GmemRef")


class SmemRef:
    """A stacked SMEM scratch ref (``plgpu.SMEM((count, ...), dtype)``): wrap it with
    :meth:`Tma.smem <safedma.gpu.Tma.smem>`; it has no indexing of its own."""

    __slots__ = ()


class BarrierRef:
    """A ``plgpu.Barrier(num_arrivals=..., num_barriers=...)`` scratch ref: wrap it with
    :meth:`Tma.barriers <safedma.gpu.Tma.barriers>`."""

    __slots__ = ()
