"""Buffers, views of them, and the elements a view covers.

A kernel names memory through refs: a buffer (a kernel operand or a
``run_scoped`` allocation) and the transforms applied to it (``.at[slot]``,
``pl.ds``, untiling). A :class:`Region` is the box of elements a view covers,
in the coordinates of the buffer or of its first reshaping transform (the
*frame*). Two regions overlap for sure, surely not, or maybe (an index the
checker could not evaluate, a strided slice, a transform after an index): a
maybe is never reported as a mistake, the checker refuses instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, SupportsIndex, SupportsInt

from safedma.testing._gpu import jax_seam

__all__ = ["UNKNOWN", "Buffer", "Region", "Unknown", "is_known_int", "overlap", "region_of"]


class Unknown:
    """A value the checker does not compute (vector data, a value read from memory)."""

    _instance: ClassVar[Unknown | None] = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"


UNKNOWN = Unknown()


def is_known_int(value: object) -> bool:
    return isinstance(value, (int, bool)) or (
        hasattr(value, "dtype") and getattr(value, "shape", None) == () and value is not UNKNOWN
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Buffer:
    """One allocation: a kernel operand or a ``run_scoped`` buffer (a fresh one per entry).

    ``barrier`` is (num_arrivals, cluster barrier?) for an array of barriers.
    """

    ident: int
    name: str
    space: str
    shape: tuple[int, ...]
    dtype: Any
    barrier: tuple[int, bool] | None = None


@dataclasses.dataclass(frozen=True)
class Region:
    """The elements of ``buffer`` a view covers: ``box`` in the coordinates of ``frame``.

    ``exact`` is False when the box is only a hull of what the view covers.
    """

    buffer: Buffer
    frame: tuple[str, ...]
    box: tuple[tuple[int, int], ...]
    exact: bool

    def text(self) -> str:
        """``smem_in[1]``, ``x[0:128, :]``: the buffer's name and the part of it."""
        if not self.box:
            return self.buffer.name
        full = self.frame == () and all(
            lo == 0 and hi == d for (lo, hi), d in zip(self.box, self.buffer.shape)
        )
        if full:
            return self.buffer.name
        parts: list[str] = []
        shape = self.buffer.shape if self.frame == () else (None,) * len(self.box)
        for (lo, hi), dim in zip(self.box, shape):
            if hi == lo + 1:
                parts.append(str(lo))
            elif lo == 0 and dim is not None and hi == dim:
                parts.append(":")
            else:
                parts.append(f"{lo}:{hi}")
        while len(parts) > 1 and parts[-1] == ":":
            parts.pop()
        return f"{self.buffer.name}[{', '.join(parts)}]"


def _int(value: object) -> int | None:
    if value is UNKNOWN or value is None:
        return None
    try:
        shape = getattr(value, "shape", ())
        if shape != ():
            return None
        if not isinstance(value, (SupportsInt, SupportsIndex, str, bytes, bytearray)):
            return None  # what int() rejects with a TypeError
        return int(value)
    except (TypeError, ValueError):
        return None


def region_of(buffer: Buffer, transforms: Sequence[Any]) -> Region:
    """The region ``buffer`` viewed through ``transforms`` (values already evaluated)."""
    frame: tuple[str, ...] = ()
    shape = buffer.shape
    box = [(0, d) for d in shape]
    # per dimension of the current view: (frame dimension, offset of index 0 in it)
    dims: list[tuple[int, int | None]] = [(d, 0) for d in range(len(shape))]
    exact = True
    frozen = False  # a reshaping transform came after an index: later indices are hulls
    indexed = False
    for t in transforms:
        if jax_seam.is_shape_preserving(t):
            continue
        if not jax_seam.is_indexer(t):
            if indexed or frozen:
                frozen = True
                continue
            new_shape = jax_seam.transformed_shape(t, shape, buffer.dtype)
            if new_shape is None:
                frozen = True
                exact = False
                continue
            frame = (*frame, f"{type(t).__name__}{tuple(shape)}->{new_shape}")
            shape = new_shape
            box = [(0, d) for d in shape]
            dims = [(d, 0) for d in range(len(shape))]
            continue
        indexed = True
        if frozen:
            exact = False
            continue
        indices = tuple(getattr(t, "indices", ()))
        if len(indices) != len(dims):
            frozen, exact = True, False
            continue
        new_dims: list[tuple[int, int | None]] = []
        for (fd, off), idx in zip(dims, indices):
            if jax_seam.is_slice(idx):
                start, size, stride = jax_seam.slice_parts(idx)
                s, n, k = _int(start), _int(size), _int(stride)
                if off is None or s is None or n is None or k is None:
                    exact = False
                    new_dims.append((fd, None))
                    continue
                lo = off + s
                hi = lo + (n - 1) * k + 1 if n > 0 else lo
                if k != 1 and n > 1:
                    exact = False
                box[fd] = (max(box[fd][0], lo), min(box[fd][1], hi))
                new_dims.append((fd, lo if k == 1 else None))
            else:
                i = _int(idx)
                if off is None or i is None:
                    exact = False
                    if getattr(idx, "shape", ()) != ():
                        frozen = True  # a gather: its dimensions replace this one
                    continue
                box[fd] = (off + i, off + i + 1)
        dims = new_dims
    return Region(buffer, frame, tuple(box), exact)


def overlap(a: Region, b: Region) -> bool | None:
    """True if the regions share an element, False if not, None if the checker cannot tell."""
    if a.buffer.ident != b.buffer.ident:
        return False
    if a.frame != b.frame:
        return None
    for (alo, ahi), (blo, bhi) in zip(a.box, b.box):
        if ahi <= blo or bhi <= alo:
            return False
    return True if a.exact and b.exact else None
