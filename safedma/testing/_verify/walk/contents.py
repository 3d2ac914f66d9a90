"""Known contents of small buffers, so values the program computes from data are exact.

A buffer's ``values`` (flat, by element) hold what the verifier knows of its contents:
numbers where known, an :class:`Unknown` naming where the rest came from. SMEM buffers
and concrete arguments have them already; here small VMEM buffers (scratch and pipeline
blocks) get them too, vector loads of known elements give numpy arrays (so vector code
such as a top-k over router logits is computed by jax itself, ``concrete`` in the
compiler), vector stores and pipeline copies move them, and a kernel's result keeps
what its blocks copied out (a schedule kernel's output feeding the next kernel's scalar
prefetch). Buffers above :data:`LIMIT` elements are not tracked: their loads are data.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, cast

import numpy as np

from safedma.testing._verify.model.regions import Buffer, View
from safedma.testing._verify.program.scalars import Partial, Unknown

__all__ = [
    "LIMIT",
    "OUTPUT_LIMIT",
    "copy_box",
    "flat_indices",
    "load",
    "store",
    "track",
    "track_scoped",
]

LIMIT = 1 << 12  # elements of a VMEM buffer whose contents are followed
OUTPUT_LIMIT = 1 << 16
"""Elements of a kernel's HBM output whose contents are followed: written by DMA in
chunks rather than by vector stores, so following them costs little, and a schedule
kernel's tables (a few thousand steps per field) reach the kernel that reads them."""


def track(buf: Buffer, why: str, limit: int = LIMIT) -> None:
    """Follow the contents of a small kernel buffer (scratch, a pipeline block, whatever
    memory space its aval names) from now on, all unknown (``why``)."""
    size = math.prod(buf.shape)
    if buf.space in ("SMEM", "SEMAPHORE") or buf.sem_kind is not None or size > limit:
        return
    buf.values = list[object]([Unknown(why)] * size)
    buf.followed = True


def track_scoped(buf: Buffer, why: str) -> None:
    """A ``run_scoped`` buffer as its region starts: followed as scratch is, its
    contents unknown again on each entry (values the kernel computes and copies on
    through it, a routing table flushed to SMEM, stay exact)."""
    if buf.space == "SMEM" and buf.sem_kind is None:
        # SMEM holds the scalars the body stores or copies in (a schedule chunk)
        buf.values = list[object]([Unknown(why)] * math.prod(buf.shape))
    elif buf.values is None or buf.followed:
        track(buf, why)


def flat_indices(view: View) -> list[int] | None:
    """Row-major flat element indices of a view's box; None when the box is not in the
    buffer's own element coordinates (a reshaped or bitcast view)."""
    if len(view.box) != len(view.buffer.shape) or view.itemsize != view.buffer.itemsize:
        return None
    strides = [math.prod(view.buffer.shape[k + 1 :]) for k in range(len(view.box))]
    return [
        sum(i * s for i, s in zip(idx, strides))
        for idx in itertools.product(*[range(lo, hi) for lo, hi in view.box])
    ]


def load(view: View, aval: Any, limit: int) -> np.ndarray[Any, Any] | Unknown | None:
    """A vector load of ``view``: its elements as an array of ``aval``'s shape and dtype
    when all are known; a :class:`Partial` when only some are; the unknown elements'
    origin when none is; None when the buffer is not followed (or the view is larger
    than ``limit`` elements)."""
    values = view.buffer.values
    if values is None or math.prod(view.shape) > limit:
        return None
    idx = flat_indices(view)
    if idx is None:
        return None
    picked = [values[i] for i in idx]
    lost = next((v for v in picked if isinstance(v, Unknown)), None)
    if lost is not None and all(isinstance(v, Unknown) for v in picked):
        return lost
    known = [not isinstance(v, Unknown) for v in picked]
    try:
        array = np.asarray(
            [v if k else 0 for v, k in zip(picked, known)], dtype=aval.dtype
        ).reshape(aval.shape)
    except (TypeError, ValueError):
        return None if lost is None else lost
    if lost is None:
        return array
    return Partial(lost.why, array, np.asarray(known, dtype=bool).reshape(aval.shape))


def store(view: View, value: object, why: str) -> None:
    """A vector store of ``value`` into ``view``: its elements where it is a known array
    of the view's size (broadcast as jax would), else ``value``'s origin or ``why``."""
    values = view.buffer.values
    if values is None:
        return
    idx = flat_indices(view)
    if idx is None:
        idx = list(range(len(values)))  # a reshaped view: any element may change
        value = None
    if isinstance(value, (np.ndarray, np.generic, int, float, bool)):
        known: np.ndarray[Any, Any] = np.asarray(cast(object, value))
        flat = np.broadcast_to(known, view.shape).reshape(-1)
        if flat.size == len(idx):
            elements: list[object] = flat.tolist()
            for i, v in zip(idx, elements):
                values[i] = v
            return
    lost = value if isinstance(value, Unknown) else Unknown(why)
    for i in idx:
        values[i] = lost


def copy_box(
    src: list[object] | None,
    src_shape: tuple[int, ...],
    box: tuple[tuple[int, int], ...],
    dst: Buffer,
    why: str,
    to_src: bool = False,
) -> None:
    """A pipeline copy between the block ``box`` of an array (``src`` values over
    ``src_shape``) and block buffer ``dst`` (its squeezed dimensions dropped): into
    ``dst``, or with ``to_src`` out of it into ``src``. Unknown where not known."""
    if dst.values is None:
        return
    size = len(dst.values)
    n = math.prod(hi - lo for lo, hi in box)
    inside = len(box) == len(src_shape) and all(
        0 <= lo <= hi <= d for (lo, hi), d in zip(box, src_shape)
    )
    if src is None or n != size or not inside or len(src) != math.prod(src_shape):
        if not to_src:
            dst.values[:] = [Unknown(why)] * size
        elif src is not None and inside and len(src) == math.prod(src_shape):
            for i in flat_indices(View(_shadow(src_shape), box, (), 1)) or []:
                src[i] = Unknown(why)
        return
    idx = flat_indices(View(_shadow(src_shape), box, (), 1)) or []
    if to_src:
        for k, i in enumerate(idx):
            src[i] = dst.values[k]
    else:
        dst.values[:] = [src[i] for i in idx]


def _shadow(shape: tuple[int, ...]) -> Buffer:
    """A stand-in buffer of ``shape`` for computing flat indices of a box in it."""
    return Buffer(-1, -1, "", shape, 1, "HBM")
