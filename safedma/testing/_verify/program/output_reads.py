"""Which parts of a kernel's outputs the program around the kernels reads.

Why: an output part nothing wrote (R6) is a mistake only where the program reads it
(a wrapper slices off padding rows, or overwrites them with ``.at[8:].set(0)``). One
backward pass over the outer jaxpr pulls each read back through layout equations
(slice, transpose, reshape), equations whose result elements each read a box of each
operand (element-wise ones; contractions, reductions and broadcasts along the
dimensions they keep: ``dim_maps``), calls (jit, custom_jvp), placement primitives and
window overwrites. A kernel's data input reads nothing here: the garbage reaches the
kernel's input buffer (``patchy.Patchy``) and the kernel's own rules judge its reads.
Any other use (the program's results, a gather, a loop, a scalar-prefetch operand)
reads all of an array. docs/verify-model.md, rule 12.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.model.regions import subtract

__all__ = [
    "CALLS",
    "ELEMENTWISE",
    "PLACEMENT",
    "DimMap",
    "OutReads",
    "Reader",
    "dim_maps",
    "kernel_inputs",
    "layout_reads",
]

# Primitives that only place or annotate an array (no read of its data by a kernel
# of XLA's own): a DMA future's destination may pass through them to its done kernel.
PLACEMENT = frozenset(
    ("sharding_constraint", "mesh_cast", "reshard", "device_put", "pvary", "optimization_barrier")
)

_Box = tuple[tuple[int, int], ...]
_LAYOUT = ("slice", "transpose", "reshape")

# Element-wise primitives: each element of the result depends on the same element of
# each operand of the result's shape only (scalar operands are read whole), so garbage
# stays in its rows; the forward side (``patchy.Patchy``) follows the same set.
ELEMENTWISE = frozenset(
    """add sub mul div rem max min neg abs sign floor ceil round is_finite exp exp2 log
    log1p expm1 tanh logistic sqrt rsqrt cbrt pow integer_pow square sin cos tan asin
    acos atan atan2 sinh cosh asinh acosh atanh erf erfc erf_inv lgamma digamma
    nextafter eq ne lt le gt ge and or not xor shift_left shift_right_logical
    shift_right_arithmetic population_count clz select_n clamp convert_element_type
    reduce_precision copy copy_p real imag conj""".split()
)

# Calls whose body the walk runs with the caller's values (``compiler._BUILDERS``):
# the parameter holding the body.
CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "remat2": "jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
}


# Per dimension of an operand: the result dimension it runs along and whether it is a
# size-1 dimension stretched over it (broadcast); None where the equation mixes along
# it (a contracted or reduced dimension: each result element reads all of it).
DimMap = tuple[tuple[int, bool] | None, ...]

_REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax "
    "argmin".split()
)


def dim_maps(eqn: Any) -> list[DimMap | None] | None:
    """How each element of a one-result equation depends on its operands, dimension by
    dimension (None per literal operand), for element-wise equations, ``dot_general``,
    reductions, ``squeeze`` and ``broadcast_in_dim``; None for any other equation. Garbage in an
    operand reaches the result elements along the mapped dimensions (``patchy``)."""
    name = eqn.primitive.name
    if len(eqn.outvars) != 1:
        return None
    out_shape = tuple(eqn.outvars[0].aval.shape)
    shapes = [None if _jax.is_literal(a) else tuple(a.aval.shape) for a in eqn.invars]
    try:
        if name in ELEMENTWISE:
            if any(sh not in (None, (), out_shape) for sh in shapes):
                return None
            same = tuple((d, False) for d in range(len(out_shape)))
            return [None if sh is None else (() if sh == () else same) for sh in shapes]
        if name in (*_REDUCTIONS, "squeeze") and len(shapes) == 1 and shapes[0] is not None:
            # a squeezed dimension has size 1: "reading all of it" is exact
            axes = {int(a) for a in eqn.params["dimensions" if name == "squeeze" else "axes"]}
            kept = iter(range(len(out_shape)))
            return [
                tuple(None if d in axes else (next(kept), False) for d in range(len(shapes[0])))
            ]
        if name == "dot_general" and len(shapes) == 2 and None not in shapes:
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            nb = len(lb)
            maps: list[DimMap | None] = []
            offset = nb
            for sh, contract, batch in ((shapes[0], lc, lb), (shapes[1], rc, rb)):
                assert sh is not None
                free = [d for d in range(len(sh)) if d not in contract and d not in batch]
                m: list[tuple[int, bool] | None] = [None] * len(sh)
                for i, d in enumerate(batch):
                    m[int(d)] = (i, False)
                for i, d in enumerate(free):
                    m[d] = (offset + i, False)
                offset += len(free)
                maps.append(tuple(m))
            return maps
        if name == "broadcast_in_dim" and shapes and shapes[0] is not None:
            dims = [int(d) for d in eqn.params["broadcast_dimensions"]]
            sh = shapes[0]
            first = tuple((o, sh[i] == 1 and out_shape[o] != 1) for i, o in enumerate(dims))
            return [first, *([None] * (len(shapes) - 1))] if len(shapes) == 1 else None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None
    return None


def kernel_inputs(eqn: Any) -> frozenset[int]:
    """The operands of a ``pallas_call`` that are its data inputs (not scalar-prefetch
    operands, grid sizes or captured refs): the kernel receives their contents,
    garbage included, in its input buffers (or in an output aliased to one)."""
    if eqn.primitive.name != "pallas_call":
        return frozenset()
    try:
        kp = _jax.kernel_params(eqn)
        jaxpr = _jax.jaxpr_of(kp["jaxpr"])[0]
        lead = int(kp["num_dynamic_grid_bounds"]) + int(kp["num_index_operands"])
        n_in = int(kp["num_inputs"])
        extra = len(eqn.invars) - lead - n_in
        consts = extra if extra > 0 and extra == len(jaxpr.constvars) else 0
        if len(eqn.invars) != consts + lead + n_in:
            return frozenset()
        return frozenset(range(consts + lead, consts + lead + n_in))
    except (KeyError, TypeError, ValueError, AttributeError):
        return frozenset()


_MAX_READ_BOXES = 8  # past this many disjoint reads of one array, their bounding box

# Per result of a jaxpr: (read at all, the boxes read or None for all of it); None: all.
OutReads = tuple[tuple[bool, tuple[_Box, ...] | None], ...] | None


# Who reads a variable: (whether it reads all of it, the equation, or None for the
# program's result), for messages.
Reader = tuple[bool, Any]


def layout_reads(
    jaxpr: Any,
    out_reads: OutReads = None,
    by: dict[Any, Reader] | None = None,
    out_by: list[Reader | None] | None = None,
) -> dict[Any, tuple[_Box, ...] | None]:
    """Per variable, the boxes of what the program reads of it (None: all of it; ():
    used, but only by kernels' data inputs, which read it themselves).

    One backward pass: a layout or element-wise equation pulls each box its output is
    read in back to its operands, a call pulls its results' reads through its body;
    any other use (an equation, a jaxpr output) reads all of it. Reads through several
    layout equations (two slices of one output) stay separate boxes, so the part
    between them is not counted as read; past ``_MAX_READ_BOXES`` they merge into
    their bounding box. A variable no equation uses is absent (its caller treats that
    as all of it). ``out_reads`` says what the caller reads of each result (a nested
    jit's results, read through the caller's own layout equations), ``out_by`` who.
    ``by`` receives, per variable, the equation whose use reads it (messages)."""
    r = _Reads(by if by is not None else {})
    for k, a in enumerate(jaxpr.outvars):
        read, boxes = (True, None) if out_reads is None else out_reads[k]
        if not read:
            continue  # the caller drops this result
        reader = out_by[k] if out_by is not None else None
        r.add(a, boxes, reader or (boxes is None, None))
    defs = {v: e for e in jaxpr.eqns for v in e.outvars}
    for eqn in reversed(jaxpr.eqns):
        if _carried(eqn, r):
            continue
        window = _overwritten(eqn, defs)
        if window is not None:
            # out.at[8:].set(0): the update's window of the operand is not read
            out = eqn.outvars[0]
            if out in r.reads:
                whole = (tuple((0, int(d)) for d in out.aval.shape),)
                got = r.reads[out]
                left = tuple(
                    p for b in (whole if got is None else got) for p in subtract(b, window)
                )
                if left:
                    r.add(eqn.invars[0], left, r.by.get(out))
                for a in eqn.invars[1:]:
                    r.add(a, None, (True, eqn))
            continue
        if eqn.primitive.name in PLACEMENT and len(eqn.invars) == len(eqn.outvars):
            # each result is its operand (Compiler.placement): read as much of it
            for a, out in zip(eqn.invars, eqn.outvars):
                if out in r.reads:
                    r.add(a, r.reads[out], r.by.get(out))
            continue
        if eqn.primitive.name in _LAYOUT and len(eqn.outvars) == 1 and len(eqn.invars) == 1:
            out = eqn.outvars[0]
            if out not in r.reads:
                continue  # the result is never used: this use reads nothing
            pulled = _pull_back_all(eqn, r.reads[out])
            r.add(eqn.invars[0], pulled, r.by.get(out) if pulled is not None else (True, eqn))
            continue
        for a in eqn.invars:
            r.add(a, None, (True, eqn))
    return r.reads


class _Reads:
    """The reads found so far (``layout_reads``) and who reads each variable."""

    def __init__(self, by: dict[Any, Reader]) -> None:
        self.reads: dict[Any, tuple[_Box, ...] | None] = {}
        self.by = by

    def add(self, a: Any, boxes: tuple[_Box, ...] | None, reader: Reader | None) -> None:
        """Count ``boxes`` of ``a`` as read (None: all of it; (): used, nothing read)
        by ``reader`` (kept when it is the first, or the first to read all of it)."""
        if _jax.is_literal(a):
            return
        reads = self.reads
        if a not in reads:
            reads[a] = boxes
        else:
            prev = reads[a]
            reads[a] = None if prev is None or boxes is None else _union(prev, boxes)
        if reader is not None and (a not in self.by or (reader[0] and not self.by[a][0])):
            self.by[a] = reader


def _carried(eqn: Any, r: _Reads) -> bool:
    """Pull the reads of an element-wise equation's result, a call's results or a
    kernel's data inputs back to their operands; False for any other equation."""
    maps = dim_maps(eqn)
    if maps is not None:
        out = eqn.outvars[0]
        if out not in r.reads:
            return True  # the result is never used: this use reads nothing
        got = r.reads[out]
        whole = tuple((0, int(d)) for d in out.aval.shape)
        for a, m in zip(eqn.invars, maps):
            if m is None:
                continue
            shape = tuple(int(d) for d in a.aval.shape)
            boxes = tuple(_pulled(m, shape, b) for b in ((whole,) if got is None else got))
            # an equation that mixes along a dimension is the one that reads it all
            mixes = any(d is None for d in m)
            r.add(a, boxes, (True, eqn) if mixes else r.by.get(out))
        return True
    key = CALLS.get(eqn.primitive.name)
    if key is not None and key in eqn.params:
        inner = _jax.jaxpr_of(eqn.params[key])[0]
        if len(inner.invars) != len(eqn.invars) or len(inner.outvars) != len(eqn.outvars):
            return False
        out_reads = tuple((o in r.reads, r.reads.get(o)) for o in eqn.outvars)
        sub_by: dict[Any, Reader] = {}
        sub = layout_reads(inner, out_reads, sub_by, [r.by.get(o) for o in eqn.outvars])
        for a, b in zip(eqn.invars, inner.invars):
            if b in sub:  # absent: the body never uses it
                r.add(a, sub[b], sub_by.get(b))
        return True
    inputs = kernel_inputs(eqn)
    if inputs:
        for k, a in enumerate(eqn.invars):
            r.add(a, () if k in inputs else None, None if k in inputs else (True, eqn))
        return True
    return False


def _pulled(m: DimMap, shape: tuple[int, ...], box: _Box) -> _Box:
    """The box of an operand that result ``box`` reads, by the operand's dimension map."""
    if any(hi <= lo for lo, hi in box):
        return tuple((0, 0) for _ in shape)
    return tuple((0, n) if d is None else ((0, 1) if d[1] else box[d[0]]) for d, n in zip(m, shape))


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
