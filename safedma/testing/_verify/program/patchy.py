"""Garbage in arrays of the program around the kernels, region by region.

Why: a kernel output may hold garbage rows a correct program never uses (a padded
MoE: a grouped matmul writes only the real rows, ``silu`` runs on all of them, a
second kernel reads the real rows, the program slices the padding off). Outside the
kernels an element-wise equation keeps garbage in its element, a slice, transpose or
reshape moves it; such a result is a :class:`Patchy` value that knows which parts of it
hold written data. A kernel that takes it as a data input gets those parts as written
in its input buffer and the rest as unwritten, so its own rules judge what it reads.
What the program reads of an array otherwise is judged at the kernel that returned it
(``output_reads.layout_reads`` follows the same equations backwards).
"""

from __future__ import annotations

import math
from typing import Any

from safedma.testing._verify.model.regions import Box, Coverage, View, is_empty, subtract
from safedma.testing._verify.program.output_reads import DimMap
from safedma.testing._verify.program.scalars import Unknown

__all__ = ["Patchy", "carry", "holes", "materialize"]

_MAX_RUNS = 4096  # contiguous runs of a box mapped through a reshape, one by one


class Patchy(Unknown):
    """Vector data of ``shape`` outside the kernels of which only ``written`` holds
    data some kernel wrote; the rest is garbage that ``origin`` left (a kernel's
    output), passed on first by ``prim`` at ``where``, from ``root`` (R6 messages)."""

    __slots__ = ("shape", "written", "origin", "prim", "where", "root")

    def __init__(
        self,
        shape: tuple[int, ...],
        written: list[Box],
        origin: str,
        prim: str,
        where: str,
        root: str,
    ) -> None:
        super().__init__("vector data")
        self.shape, self.written, self.root = shape, written, root
        self.origin, self.prim, self.where = origin, prim, where

    @property
    def note(self) -> str:
        return f" (garbage {self.origin}, passed on by {self.prim} at {self.where} outside the kernels)"

    def located(self, where: str) -> Patchy:
        """The same value, passed on at ``where`` (the user's call of a jax function
        whose own lines, like ``silu``'s, are not the user's)."""
        return Patchy(self.shape, self.written, self.origin, self.prim, where, self.root)


def carry(
    eqn: Any, maps: list[DimMap | None] | None, ins: list[tuple[tuple[int, ...], list[Box] | None]]
) -> list[Box] | None:
    """The written boxes of ``eqn``'s result from its array operands' (shape, written
    boxes; None: all written), by the operands' dimension maps (``dim_maps``) or as a
    layout equation (``maps`` None); None when all of the result is written."""
    out_shape = tuple(int(d) for d in eqn.outvars[0].aval.shape)
    if maps is None:
        shape, written = ins[0]
        if written is None:
            return None
        mapped: list[Box] = []
        for box in written:
            mapped.extend(_layout(eqn, shape, out_shape, box))
        return _merged(mapped)
    # a result element is written when every operand part it reads is
    whole = tuple((0, n) for n in out_shape)
    result: list[Box] = [whole]
    patchy = False
    for (shape, written), m in zip(ins, maps):
        if m is None or not m:
            continue
        patchy = patchy or written is not None
        boxes = [tuple((0, n) for n in shape)] if written is None else written
        images = [img for b in boxes if (img := _image(m, shape, out_shape, b)) is not None]
        result = [c for a in result for b in images if not is_empty(c := _cut(a, b))]
        if len(result) > _MAX_RUNS:
            return []  # too fine to follow: all of it counts as garbage
    return _merged(result) if patchy else None


def _image(m: DimMap, shape: tuple[int, ...], out_shape: tuple[int, ...], box: Box) -> Box | None:
    """The result elements whose operand part lies inside written ``box`` (None: none,
    when the box leaves out part of a dimension the equation mixes along)."""
    res = [(0, n) for n in out_shape]
    for k, (d, (lo, hi)) in enumerate(zip(m, box)):
        if hi <= lo:
            return None
        if d is None:
            if (lo, hi) != (0, shape[k]):
                return None
            continue
        o, stretched = d
        if not stretched:
            res[o] = (max(res[o][0], lo), min(res[o][1], hi))
    return tuple(res)


def holes(shape: tuple[int, ...], written: list[Box]) -> list[Box]:
    """The parts of an array of ``shape`` outside every box of ``written``."""
    left: list[Box] = [tuple((0, n) for n in shape)]
    for w in written:
        left = [p for h in left for p in subtract(h, w)]
    return [h for h in left if not is_empty(h)]


def materialize(machine: Any, buf: Any, value: Patchy) -> None:
    """Make buffer ``buf`` (all written) hold ``value``'s garbage where it has some."""
    for hole in holes(value.shape, value.written):
        view = View(buf, hole, tuple(hi - lo for lo, hi in hole), buf.itemsize)
        machine.store_garbage(view, value.note, value.root)


def _cut(a: Box, b: Box) -> Box:
    return tuple((max(lo, blo), min(hi, bhi)) for (lo, hi), (blo, bhi) in zip(a, b))


def _merged(boxes: list[Box]) -> list[Box]:
    cov = Coverage()
    for b in boxes:
        cov.add(b)
    return list(cov.boxes)


def _layout(eqn: Any, shape: tuple[int, ...], out_shape: tuple[int, ...], box: Box) -> list[Box]:
    """Where ``box`` of the operand lands in the result of a layout equation (exact;
    [] when it cannot be mapped exactly: then it counts as garbage there)."""
    p = eqn.params
    name = eqn.primitive.name
    if name == "slice":
        starts = [int(i) for i in p["start_indices"]]
        limits = [int(i) for i in p["limit_indices"]]
        strides = [int(i) for i in (p.get("strides") or [1] * len(starts))]
        res: list[tuple[int, int]] = []
        for (lo, hi), st, lim, sd, n in zip(box, starts, limits, strides, out_shape):
            lo, hi = max(lo, st), min(hi, lim)
            a, b = -(-(lo - st) // sd), -(-(hi - st) // sd)
            res.append((max(a, 0), min(b, n)))
        out = tuple(res)
        return [] if is_empty(out) else [out]
    if name == "transpose":
        return [tuple(box[int(d)] for d in p["permutation"])]
    if p.get("dimensions") is not None:
        return []
    return _reshaped(shape, out_shape, box)


def _reshaped(shape: tuple[int, ...], out_shape: tuple[int, ...], box: Box) -> list[Box]:
    """``box`` of a row-major array of ``shape`` as boxes of the same elements in
    ``out_shape``: its contiguous runs, each split into boxes."""
    # the trailing dimensions the box spans fully form one contiguous run per index
    # of the dimensions before them
    k = len(shape)
    while k > 0 and box[k - 1] == (0, shape[k - 1]):
        k -= 1
    inner = math.prod(shape[k:])
    if k == 0:
        return [tuple((0, n) for n in out_shape)]
    run = (box[k - 1][1] - box[k - 1][0]) * inner
    lead = box[: k - 1]
    if math.prod(hi - lo for lo, hi in lead) > _MAX_RUNS:
        return []
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    out: list[Box] = []
    for index in _points(lead):
        start = sum(i * s for i, s in zip(index, strides)) + box[k - 1][0] * strides[k - 1]
        out.extend(_flat_boxes(out_shape, start, start + run))
    return out


def _points(box: Box) -> list[tuple[int, ...]]:
    pts: list[tuple[int, ...]] = [()]
    for lo, hi in box:
        pts = [(*p, i) for p in pts for i in range(lo, hi)]
    return pts


def _flat_boxes(shape: tuple[int, ...], a: int, b: int) -> list[Box]:
    """The flat range [a, b) of a row-major array of ``shape`` as boxes."""
    if a >= b:
        return []
    if not shape:
        return [()]
    inner = math.prod(shape[1:])
    first, last = a // inner, (b - 1) // inner
    rest = shape[1:]
    full_rest = tuple((0, n) for n in rest)
    if first == last:
        return [
            ((first, first + 1), *sub)
            for sub in _flat_boxes(rest, a - first * inner, b - first * inner)
        ]
    out: list[Box] = []
    lo = first
    if a % inner:
        out.extend(((first, first + 1), *sub) for sub in _flat_boxes(rest, a % inner, inner))
        lo = first + 1
    hi = last + 1
    tail: list[Box] = []
    if b % inner:
        tail = [((last, last + 1), *sub) for sub in _flat_boxes(rest, 0, b % inner)]
        hi = last
    if hi > lo:
        out.append(((lo, hi), *full_rest))
    return out + tail
