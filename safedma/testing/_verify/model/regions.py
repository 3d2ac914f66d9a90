"""Buffers and the box of a buffer that a ref view (``.at[...]``, reshape, bitcast) covers.

A region is a box, one ``[start, stop)`` per dimension of the root buffer.
Indexing and reshapes that regroup dimensions keep a view exact; a bitcast, or
a window the regrouping cannot express, makes the view a flat byte range of the
root, turned back into the smallest box that covers it (exact for whole rows;
otherwise a conservative bound).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import cast

Box = tuple[tuple[int, int], ...]


class RegionError(Exception):
    """A view outside its buffer; the caller turns it into a verification error."""

    def __init__(self, message: str, dim: int, start: int, size: int, extent: int) -> None:
        super().__init__(message)
        self.dim, self.start, self.size, self.extent = dim, start, size, extent


class UnsupportedView(Exception):
    """A transform the verifier does not model (gather indexing, transpose of a flat view)."""


@dataclasses.dataclass(eq=False)
class Buffer:
    """One memory buffer (or semaphore array) owned by one participant.

    ``values`` holds known contents of small SMEM buffers (flat, by element),
    ``None`` where unknown.
    """

    ident: int
    owner: int
    name: str
    shape: tuple[int, ...]
    itemsize: int
    space: str
    sem_kind: str | None = None
    values: list[object] | None = dataclasses.field(default=None)
    kernel_scoped: bool = True
    # why its contents are not known, when that is not simply "data": the argument of
    # the user's function given as a shape, the operation that computed it
    origin: str | None = None
    # ``values`` follow a VMEM (or HBM scratch) buffer's contents, not an SMEM table's
    followed: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def full_box(self) -> Box:
        return tuple((0, d) for d in self.shape)


class View:
    """What a ref view covers: ``box`` in the root, its own shape and element size.

    A plain slotted class with ``nbytes`` and ``empty`` computed once: every copy,
    wait and access builds or reads one, so construction is on the hot path.
    """

    __slots__ = ("buffer", "box", "shape", "itemsize", "nbytes", "empty")

    def __init__(self, buffer: Buffer, box: Box, shape: tuple[int, ...], itemsize: int) -> None:
        self.buffer, self.box, self.shape, self.itemsize = buffer, box, shape, itemsize
        size = math.prod(shape)
        self.nbytes = size * itemsize
        self.empty = size == 0 or any(hi <= lo for lo, hi in box)

    @classmethod
    def window(
        cls, buffer: Buffer, box: Box, shape: tuple[int, ...], itemsize: int, size: int
    ) -> View:
        """A view the caller knows is non-empty with ``size`` elements (no box scan)."""
        view = cls.__new__(cls)
        view.buffer, view.box, view.shape, view.itemsize = buffer, box, shape, itemsize
        view.nbytes = size * itemsize
        view.empty = False
        return view

    def __repr__(self) -> str:
        return f"View({self.buffer.name}, box={self.box}, shape={self.shape}, itemsize={self.itemsize})"


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


def flat_to_box(shape: tuple[int, ...], lo: int, hi: int) -> Box:
    """Smallest box of ``shape`` holding the row-major elements ``[lo, hi)``."""
    if hi <= lo:
        return tuple((0, 0) for _ in shape)
    box: list[tuple[int, int]] = []
    strides = _row_major_strides(shape)
    last = hi - 1
    for d, stride in enumerate(strides):
        a, b = lo // stride, last // stride
        if a != b:
            box.append((a, b + 1))
            box.extend((0, s) for s in shape[d + 1 :])
            return tuple(box)
        box.append((a, a + 1))
        lo -= a * stride
        last -= a * stride
    return tuple(box)


Part = tuple[int, int, int]  # (root dimension, stride in it, size): one mixed-radix digit


class _Mapping:
    """A view being resolved: exact, or a flat byte range of the root.

    Exact mode maps each view dimension to a few mixed-radix *parts* of the root
    (outermost first): a plain dimension has one part, a reshape that merges
    dimensions concatenates their parts and one that splits a dimension splits its
    parts, so ``ref.reshape(pages * rows, k, n).at[pl.ds(r, m), :, :c]`` keeps
    its exact box. A reshape or index that no longer fits (a window that wraps
    around a part, a strided slice of a merged dimension) falls back to the flat
    byte range.
    """

    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self.shape: list[int] = list(buf.shape)
        self.itemsize = buf.itemsize
        # exact mode: root coordinate of element 0 and the parts of each view dim
        self.origin: list[int] | None = [0] * len(buf.shape)
        self.axes: list[list[Part]] = [
            [(d, 1, n)] if n != 1 else [] for d, n in enumerate(buf.shape)
        ]
        # flat mode: byte range in the root
        self.byte_lo = 0
        self.byte_hi = buf.nbytes

    def _to_flat(self) -> None:
        if self.origin is None:
            return
        strides = _row_major_strides(self.buf.shape)
        first = sum(o * s for o, s in zip(self.origin, strides))
        last = first + sum((z - 1) * st * strides[d] for parts in self.axes for d, st, z in parts)
        if any(n == 0 for n in self.shape):
            self.byte_lo = self.byte_hi = first * self.buf.itemsize
        else:
            self.byte_lo = first * self.buf.itemsize
            self.byte_hi = (last + 1) * self.buf.itemsize
        self.origin = None

    def index(self, entries: Sequence[tuple[str, int, int, int]]) -> None:
        """Apply an NDIndexer: entries are ("slice", start, size, stride) or ("int", i, 1, 1)."""
        if len(entries) != len(self.shape):
            raise UnsupportedView(
                f"an index of {len(entries)} entries on a view of rank {len(self.shape)}"
            )
        # an empty window moves no bytes: in range wherever it starts, in every
        # dimension (kernels park zero-size copies of padding entries at index -1,
        # the page index in one dimension and the zero length in another)
        empty = any(size == 0 for _, _, size, _ in entries)
        for d, (kind, start, size, stride) in enumerate(entries):
            extent = self.shape[d]
            end = start + (size - 1) * stride + 1 if size > 0 else start
            if not empty and (start < 0 or end > extent or start >= extent):
                what = (
                    f"index {start}"
                    if kind == "int"
                    else f"window [{start}, {start + size * stride})"
                )
                raise RegionError(
                    f"{what} is outside dimension {d} of size {extent}", d, start, size, extent
                )
        if self.origin is not None and self._index_exact(entries):
            return
        self._to_flat()
        strides = _row_major_strides(self.shape)
        first = sum(e[1] * s for e, s in zip(entries, strides))
        if any(e[2] == 0 for e in entries):
            last = first - 1
        else:
            last = first + sum((e[2] - 1) * e[3] * s for e, s in zip(entries, strides))
        lo = self.byte_lo + first * self.itemsize
        self.byte_lo, self.byte_hi = lo, max(lo, self.byte_lo + (last + 1) * self.itemsize)
        self.shape = [e[2] for e in entries if e[0] == "slice"]

    def _index_exact(self, entries: Sequence[tuple[str, int, int, int]]) -> bool:
        origin = self.origin
        assert origin is not None
        new_origin = list(origin)
        new_axes: list[list[Part]] = []
        new_shape: list[int] = []
        for (kind, start, size, stride), parts in zip(entries, self.axes):
            if size == 0:
                return False  # an empty window: the flat range (empty) is exact enough
            cut = _window(parts, start, size, stride, new_origin)
            if cut is None:
                return False
            if kind == "slice":
                new_axes.append(cut)
                new_shape.append(size)
        self.origin, self.axes, self.shape = new_origin, new_axes, new_shape
        return True

    def reshape(self, shape: tuple[int, ...]) -> None:
        if math.prod(shape) != math.prod(self.shape):
            raise UnsupportedView(f"a reshape of {tuple(self.shape)} to {shape}")
        if self.origin is not None and math.prod(shape) > 0:
            parts = [p for ax in self.axes for p in ax]
            axes = _split(parts, shape)
            if axes is not None:
                self.axes, self.shape = axes, list(shape)
                return
        self._to_flat()
        self.shape = list(shape)

    def bitcast(self, itemsize: int) -> None:
        if itemsize == self.itemsize:
            return
        self._to_flat()
        if self.shape:
            # Pallas TPU bitcasts scale the second-minor dimension (packing).
            total = math.prod(self.shape) * self.itemsize
            if len(self.shape) >= 2:
                rows = self.shape[-2] * self.itemsize // itemsize
                self.shape[-2] = max(rows, 1)
            else:
                self.shape[-1] = self.shape[-1] * self.itemsize // itemsize
            if math.prod(self.shape) * itemsize != total:
                self.shape = [total // itemsize]
        self.itemsize = itemsize

    def transpose(self, perm: tuple[int, ...]) -> None:
        if self.origin is None:
            raise UnsupportedView("a transpose of a reshaped or bitcast view")
        self.axes = [self.axes[p] for p in perm]
        self.shape = [self.shape[p] for p in perm]

    def view(self) -> View:
        if self.origin is not None:
            hi = [o + 1 for o in self.origin]
            for parts in self.axes:
                for d, st, z in parts:
                    hi[d] += (z - 1) * st
            box = tuple(zip(self.origin, hi))
            if any(n == 0 for n in self.shape):
                box = tuple((o, o) for o in self.origin)
            return View(self.buf, box, tuple(self.shape), self.itemsize)
        root = self.buf.itemsize
        lo = self.byte_lo // root
        hi_ = -(-self.byte_hi // root)
        return View(
            self.buf, flat_to_box(self.buf.shape, lo, hi_), tuple(self.shape), self.itemsize
        )


def _window(
    parts: list[Part], start: int, size: int, stride: int, origin: list[int]
) -> list[Part] | None:
    """The parts of window ``[start, start + size*stride)`` of a dimension made of
    ``parts``, moving ``origin`` to its first element; None when it is not a box."""
    parts = list(parts)
    while True:
        if not parts:
            return [] if start == 0 and size == 1 else None
        d, st, _ = parts[0]
        inner = math.prod(p[2] for p in parts[1:])
        if len(parts) == 1:
            origin[d] += start * st
            return [(d, st * stride, size)] if size != 1 else []
        if stride == 1 and start % inner == 0 and size % inner == 0:
            origin[d] += (start // inner) * st
            head = size // inner
            return ([(d, st, head)] if head != 1 else []) + parts[1:]
        if start // inner == (start + (size - 1) * stride) // inner:
            origin[d] += (start // inner) * st  # within one step of the outer part
            start %= inner
            parts = parts[1:]
            continue
        return None


def _split(parts: list[Part], shape: Sequence[int]) -> list[list[Part]] | None:
    """Regroup mixed-radix ``parts`` (outermost first) into dims of ``shape``; None when a
    dimension would need a part split that does not divide it."""
    todo = [p for p in parts if p[2] != 1]
    out: list[list[Part]] = []
    for n in shape:
        dim: list[Part] = []
        need = n
        while need > 1:
            if not todo:
                return None
            d, st, z = todo[0]
            if z <= need:
                if need % z:
                    return None
                dim.append(todo.pop(0))
                need //= z
            else:
                if z % need:
                    return None
                # split the part: its outer digit goes here, the inner stays for later
                dim.append((d, st * (z // need), need))
                todo[0] = (d, st, z // need)
                need = 1
        out.append(dim)
    return out if not todo else None


def resolve(buf: Buffer, steps: Sequence[tuple[str, object]]) -> View:
    """The view of ``buf`` after ``steps`` (already concrete: ints, shapes, item sizes)."""
    m = _Mapping(buf)
    for kind, arg in steps:
        if kind == "index":
            m.index(cast("Sequence[tuple[str, int, int, int]]", arg))
        elif kind == "reshape":
            m.reshape(cast("tuple[int, ...]", arg))
        elif kind == "bitcast":
            m.bitcast(cast(int, arg))
        elif kind == "transpose":
            m.transpose(cast("tuple[int, ...]", arg))
        else:
            raise UnsupportedView(f"the ref transform {arg}")
    return m.view()


def overlaps(a: Box, b: Box) -> bool:
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return False
    return True


def contains(outer: Box, inner: Box) -> bool:
    for (olo, ohi), (ilo, ihi) in zip(outer, inner):
        if ilo < olo or ihi > ohi:
            return False
    return True


def is_empty(box: Box) -> bool:
    return any(hi <= lo for lo, hi in box)


def merge(a: Box, b: Box) -> Box | None:
    """``a`` and ``b`` as one box when they differ in at most one dimension and touch there."""
    diff = -1
    for d, (x, y) in enumerate(zip(a, b)):
        if x != y:
            if diff >= 0:
                return None
            diff = d
    if diff < 0:
        return a
    (alo, ahi), (blo, bhi) = a[diff], b[diff]
    if alo > bhi or blo > ahi:
        return None
    return a[:diff] + ((min(alo, blo), max(ahi, bhi)),) + a[diff + 1 :]


class Coverage:
    """Which parts of a buffer were ever written: a few merged boxes."""

    __slots__ = ("boxes",)

    def __init__(self) -> None:
        self.boxes: list[Box] = []

    def add(self, box: Box) -> None:
        if is_empty(box):
            return
        changed = True
        while changed:
            changed = False
            for i, b in enumerate(self.boxes):
                if contains(b, box):
                    return
                m = merge(b, box)
                if m is not None or contains(box, b):
                    box = m if m is not None else box
                    del self.boxes[i]
                    changed = True
                    break
        self.boxes.append(box)

    def remove(self, box: Box) -> None:
        """``box`` no longer holds written data (a copy of garbage landed there)."""
        if is_empty(box) or not any(overlaps(b, box) for b in self.boxes):
            return
        kept: list[Box] = []
        for b in self.boxes:
            kept.extend(subtract(b, box))
        self.boxes = []
        for b in kept:
            self.add(b)

    def parts(self, box: Box) -> list[Box] | None:
        """The written parts of ``box``: None when all of it is written, [] when none."""
        if self.covers(box):
            return None
        out: list[Box] = []
        for b in self.boxes:
            cut = tuple((max(lo, blo), min(hi, bhi)) for (lo, hi), (blo, bhi) in zip(box, b))
            if not is_empty(cut):
                out.append(cut)
        return out

    def gap(self, box: Box) -> Box | None:
        """A part of ``box`` nothing covers (the first cell of the boxes' grid), or None."""
        if is_empty(box) or any(contains(b, box) for b in self.boxes):
            return None
        cell = self._uncovered_cell(box)
        return None if cell is _TOO_FINE else cast("Box | None", cell)

    def covers(self, box: Box) -> bool:
        if is_empty(box) or any(contains(b, box) for b in self.boxes):
            return True
        # Too fine to check cheaply: assume covered (no false alarm).
        cell = self._uncovered_cell(box)
        return cell is None or cell is _TOO_FINE

    def _uncovered_cell(self, box: Box) -> Box | object | None:
        """The first cell of ``box`` no box covers, by coordinate compression over the
        boxes that touch it; None when all are covered, :data:`_TOO_FINE` when the grid
        has too many cells to look."""
        parts = [b for b in self.boxes if overlaps(b, box)]
        cuts: list[list[int]] = []
        for d, (lo, hi) in enumerate(box):
            points = {lo, hi}
            for b in parts:
                points.update(p for p in b[d] if lo < p < hi)
            cuts.append(sorted(points))
        if math.prod(len(c) - 1 for c in cuts) > _MAX_CELLS:
            return _TOO_FINE
        for cell in itertools.product(*[range(len(c) - 1) for c in cuts]):
            point = tuple(cuts[d][i] for d, i in enumerate(cell))
            if not any(all(lo <= p < hi for p, (lo, hi) in zip(point, b)) for b in parts):
                return tuple((cuts[d][i], cuts[d][i + 1]) for d, i in enumerate(cell))
        return None


def subtract(a: Box, b: Box) -> list[Box]:
    """The parts of ``a`` outside ``b``, as at most two boxes per dimension."""
    if not overlaps(a, b):
        return [a]
    out: list[Box] = []
    rest = list(a)
    for d, ((lo, hi), (blo, bhi)) in enumerate(zip(a, b)):
        if lo < blo:
            out.append(tuple(rest[:d]) + ((lo, blo),) + tuple(rest[d + 1 :]))
        if bhi < hi:
            out.append(tuple(rest[:d]) + ((bhi, hi),) + tuple(rest[d + 1 :]))
        rest[d] = (max(lo, blo), min(hi, bhi))
    return [o for o in out if not is_empty(o)]


_MAX_CELLS = 100_000
_TOO_FINE = object()
"""What ``Coverage._uncovered_cell`` returns for a grid of more than ``_MAX_CELLS`` cells."""


def carried(parts: Sequence[Box], src: Box, dst: Box) -> list[Box]:
    """Boxes ``parts`` of a copy's source box ``src``, moved to its destination box
    ``dst``: dimension by dimension when the boxes have the same extents after dropping
    unit dimensions; otherwise all of ``dst`` (a copy never makes less written)."""
    s_dims = [d for d, (lo, hi) in enumerate(src) if hi - lo != 1]
    d_dims = [d for d, (lo, hi) in enumerate(dst) if hi - lo != 1]
    if len(s_dims) != len(d_dims) or any(
        src[a][1] - src[a][0] != dst[b][1] - dst[b][0] for a, b in zip(s_dims, d_dims)
    ):
        return [dst]
    out: list[Box] = []
    for part in parts:
        box = list(dst)
        for a, b in zip(s_dims, d_dims):
            shift = dst[b][0] - src[a][0]
            box[b] = (part[a][0] + shift, part[a][1] + shift)
        out.append(tuple(box))
    return out
