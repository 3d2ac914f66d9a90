"""Which parts of a kernel's outputs the program around the kernels reads.

Why: an output part nothing wrote (R6) is a mistake only where the program reads it
(a wrapper slices off padding rows, or overwrites them with ``.at[8:].set(0)``). One
backward pass over the outer jaxpr pulls each read back through layout equations
(slice, transpose, reshape), placement primitives and window overwrites; any other
use reads all of an array.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from safedma.testing._verify import _jax
from safedma.testing._verify._regions import subtract

__all__ = ["PLACEMENT", "OutReads", "layout_reads"]

# Primitives that only place or annotate an array (no read of its data by a kernel
# of XLA's own): a DMA future's destination may pass through them to its done kernel.
PLACEMENT = frozenset(
    ("sharding_constraint", "mesh_cast", "reshard", "device_put", "pvary", "optimization_barrier")
)

_Box = tuple[tuple[int, int], ...]
_LAYOUT = ("slice", "transpose", "reshape")


_MAX_READ_BOXES = 8  # past this many disjoint reads of one array, their bounding box

# Per result of a jaxpr: (read at all, the boxes read or None for all of it); None: all.
OutReads = tuple[tuple[bool, tuple[_Box, ...] | None], ...] | None


def layout_reads(jaxpr: Any, out_reads: OutReads = None) -> dict[Any, tuple[_Box, ...] | None]:
    """Per variable, the boxes of what the program reads of it (None: all of it).

    One backward pass: a layout equation pulls each box its output is read in back to
    its operand; any other use (an equation, a jaxpr output) reads all of it. Reads
    through several layout equations (two slices of one output) stay separate boxes,
    so the part between them is not counted as read; past ``_MAX_READ_BOXES`` they
    merge into their bounding box. A variable no equation uses is absent (its caller
    treats that as all of it). ``out_reads`` says what the caller reads of each result
    (a nested jit's results, read through the caller's own layout equations)."""
    reads: dict[Any, tuple[_Box, ...] | None] = {}
    for k, a in enumerate(jaxpr.outvars):
        if _jax.is_literal(a):
            continue
        read, boxes = (True, None) if out_reads is None else out_reads[k]
        if not read:
            continue  # the caller drops this result
        if a not in reads:
            reads[a] = boxes
        else:
            prev = reads[a]
            reads[a] = None if prev is None or boxes is None else _union(prev, boxes)
    defs = {v: e for e in jaxpr.eqns for v in e.outvars}
    for eqn in reversed(jaxpr.eqns):
        window = _overwritten(eqn, defs)
        if window is not None:
            # out.at[8:].set(0): the update's window of the operand is not read
            out = eqn.outvars[0]
            if out in reads:
                whole = (tuple((0, int(d)) for d in out.aval.shape),)
                left = tuple(p for b in (reads[out] or whole) for p in subtract(b, window))
                a = eqn.invars[0]
                if left and not _jax.is_literal(a):
                    prev = reads.get(a, ())
                    reads[a] = None if prev is None else _union(prev, left)
                for a in eqn.invars[1:]:
                    if not _jax.is_literal(a):
                        reads[a] = None
            continue
        if eqn.primitive.name in PLACEMENT and len(eqn.invars) == len(eqn.outvars):
            # each result is its operand (Compiler.placement): read as much of it
            for a, out in zip(eqn.invars, eqn.outvars):
                if _jax.is_literal(a) or out not in reads:
                    continue
                got = reads[out]
                if a not in reads:
                    reads[a] = got
                else:
                    prev = reads[a]
                    reads[a] = None if got is None or prev is None else _union(prev, got)
            continue
        pulled: tuple[_Box, ...] | None = None
        skip = False
        if eqn.primitive.name in _LAYOUT and len(eqn.outvars) == 1 and len(eqn.invars) == 1:
            out = eqn.outvars[0]
            if out not in reads:
                skip = True  # the result is never used: this use reads nothing
            else:
                pulled = _pull_back_all(eqn, reads[out])
        for a in eqn.invars:
            if skip or _jax.is_literal(a):
                continue
            if pulled is None:
                reads[a] = None
            elif a not in reads:
                reads[a] = pulled
            else:
                old = reads[a]
                if old is not None:
                    reads[a] = _union(old, pulled)
    return reads


def _overwritten(eqn: Any, defs: dict[Any, Any]) -> _Box | None:
    """The window of its operand that a ``dynamic_update_slice`` or a one-window
    ``scatter`` (``x.at[8:].set(u)``) overwrites, when its starts are constants and
    the window lies inside the operand; else None."""
    name = eqn.primitive.name
    try:
        shape = tuple(int(d) for d in eqn.invars[0].aval.shape)
        if name == "dynamic_update_slice":
            size = tuple(int(d) for d in eqn.invars[1].aval.shape)
            starts = [_constant(a, defs) for a in eqn.invars[2:]]
            if any(st is None for st in starts):
                return None
            first = [int(st) for st in starts]
        elif name == "scatter" and len(eqn.invars) == 3:
            dn = eqn.params["dimension_numbers"]
            size = tuple(int(d) for d in eqn.invars[2].aval.shape)
            idx = _constant(eqn.invars[1], defs)
            if (
                idx is None
                or dn.inserted_window_dims
                or getattr(dn, "operand_batching_dims", ())
                or tuple(dn.update_window_dims) != tuple(range(len(shape)))
                or len(size) != len(shape)
                or np.shape(idx) != (len(dn.scatter_dims_to_operand_dims),)
            ):
                return None
            first = [0] * len(shape)
            for d, st in zip(dn.scatter_dims_to_operand_dims, np.asarray(idx).tolist()):
                first[int(d)] = int(st)
        else:
            return None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None
    if len(first) != len(shape) or any(
        st < 0 or st + z > n for st, z, n in zip(first, size, shape)
    ):
        return None  # clamped or dropped by XLA: not worth modelling
    return tuple((st, st + z) for st, z in zip(first, size))


def _constant(a: Any, defs: dict[Any, Any]) -> Any:
    """The value of a literal, or of a ``broadcast_in_dim`` of one (jnp's static
    indices), as a numpy value; None otherwise."""
    if _jax.is_literal(a):
        return np.asarray(_jax.literal_value(a))
    e = defs.get(a)
    if e is not None and e.primitive.name == "broadcast_in_dim" and _jax.is_literal(e.invars[0]):
        shape = tuple(int(d) for d in e.outvars[0].aval.shape)
        return np.broadcast_to(np.asarray(_jax.literal_value(e.invars[0])), shape)
    return None


def _pull_back_all(eqn: Any, boxes: tuple[_Box, ...] | None) -> tuple[_Box, ...] | None:
    """Each box pulled back through ``eqn``; None if any is unknown."""
    if boxes is None:
        one = _pull_back(eqn, None)
        return None if one is None else (one,)
    pulled: list[_Box] = []
    for box in boxes:
        one = _pull_back(eqn, box)
        if one is None:
            return None
        pulled.append(one)
    return tuple(pulled)


def _union(a: tuple[_Box, ...], b: tuple[_Box, ...]) -> tuple[_Box, ...]:
    """The boxes of ``a`` and ``b`` (each once); their bounding box when too many."""
    boxes = tuple(dict.fromkeys((*a, *b)))
    if len(boxes) <= _MAX_READ_BOXES:
        return boxes
    return (tuple((min(d), max(e)) for d, e in (zip(*dim) for dim in zip(*boxes))),)


def _pull_back(eqn: Any, box: _Box | None) -> _Box | None:
    """The bounding box of the operand of layout equation ``eqn`` that ``box`` of its
    result comes from (``box`` None: all of the result); None when unknown."""
    try:
        in_shape = tuple(int(d) for d in eqn.invars[0].aval.shape)
        out_shape = tuple(int(d) for d in eqn.outvars[0].aval.shape)
        params = eqn.params
        name = eqn.primitive.name
        if box is None:
            box = tuple((0, d) for d in out_shape)
        if any(hi <= lo for lo, hi in box):
            return tuple((0, 0) for _ in in_shape)
        if name == "slice":
            starts = [int(i) for i in params["start_indices"]]
            strides = [int(i) for i in (params.get("strides") or [1] * len(starts))]
            return tuple(
                (st + lo * sd, st + (hi - 1) * sd + 1)
                for (lo, hi), st, sd in zip(box, starts, strides)
            )
        if name == "transpose":
            perm = [int(i) for i in params["permutation"]]
            res: list[tuple[int, int]] = [(0, 0)] * len(perm)
            for i, d in enumerate(perm):
                res[d] = box[i]
            return tuple(res)
        if params.get("dimensions") is None:
            return _pull_reshape(in_shape, out_shape, box)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError):
        pass
    return None


def _pull_reshape(in_shape: tuple[int, ...], out_shape: tuple[int, ...], box: _Box) -> _Box:
    """Bounding box in ``in_shape`` of ``box`` in the row-major reshape ``out_shape``:
    per group of dimensions with equal products, the flat range of the box's corners."""
    res: list[tuple[int, int]] = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        gi, gj = [i], [j]
        pi = in_shape[i] if i < len(in_shape) else 1
        pj = out_shape[j] if j < len(out_shape) else 1
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            else:
                gj.append(j)
                pj *= out_shape[j]
                j += 1
        gi = [d for d in gi if d < len(in_shape)]
        gj = [d for d in gj if d < len(out_shape)]
        lo = hi = 0
        for d in gj:
            lo = lo * out_shape[d] + box[d][0]
            hi = hi * out_shape[d] + box[d][1] - 1
        hi += 1
        part: list[tuple[int, int]] = []
        for k in range(len(gi)):
            inner = math.prod(in_shape[e] for e in gi[k + 1 :])
            a, b = lo // inner, (hi - 1) // inner + 1
            if b - a > 1 or k == len(gi) - 1:
                part.append((a, b))
                part.extend((0, in_shape[e]) for e in gi[k + 1 :])
                break
            part.append((a, b))  # one index here: the rest of the range lies inside it
            lo, hi = lo - a * inner, hi - a * inner
        res.extend(part)
    return tuple(res)
