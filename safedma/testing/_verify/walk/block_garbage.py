"""Garbage in the blocks Pallas copies between an array and a kernel's block buffers.

Why: a kernel output may hold garbage rows a correct program never uses (docs/verify-model.md
rule 12). A later kernel that reads that array in blocks gets each block's garbage as
unwritten parts of its block buffer, so its own rules judge what it does with them; an
output block the program never reads is copied out with its garbage rather than
reported; an output aliased to an input starts as that input, garbage included.
"""

from __future__ import annotations

from typing import Any

from safedma.testing._verify.model.regions import Box, Buffer, View, overlaps
from safedma.testing._verify.walk.kernel_desc import KernelDesc

__all__ = ["copy_in", "copy_out", "keep_input", "kept_dims", "never_read"]


def _full(buf: Buffer) -> View:
    return View(buf, buf.full_box(), buf.shape, buf.itemsize)


def copy_in(
    m: Any,
    p: int,
    desc: KernelDesc,
    j: int,
    src: Buffer,
    box: Box | None,
    buf: Buffer,
) -> None:
    """Pallas copies block ``box`` of ``src`` into input block ``buf``: the parts of it
    nothing wrote (garbage an earlier kernel left, docs/verify-model.md rule 12) stay
    unwritten. A block whose place is not known reads all of ``src``."""
    kept = kept_dims(desc, j, buf)
    if box is None or kept is None:
        m.check_written(
            p,
            _full(src),
            "the pipeline copies a block in from",
            desc.where,
            "Write every part of an array a later kernel reads in blocks.",
        )
        return
    history = m.histories.get(src.ident)
    written: list[Box] | None = [] if history is None else history.coverage.parts(box)
    if written is None:
        return  # all of it written (the block was marked written by the copy)
    m.store_garbage(_full(buf), m.partly_from.get(src.ident, ""), m.root_of(src))
    # the padding of a partial block past the array's end stays unwritten (Pallas
    # leaves it unspecified): a block whose rows are all garbage is all garbage
    for part in written:
        m.mark_written(buf, tuple((part[d][0] - box[d][0], part[d][1] - box[d][0]) for d in kept))


def kept_dims(desc: KernelDesc, j: int, buf: Buffer) -> list[int] | None:
    """The dimensions of blocked operand ``j``'s array its block buffer ``buf`` keeps
    (the squeezed ones dropped), or None when they do not match the buffer."""
    kinds = tuple(desc.blocks[j].get("block_kinds", ()))
    kept = [d for d, k in enumerate(kinds) if k != "squeezed"]
    return kept if len(kept) == len(buf.shape) and kinds else None


def keep_input(m: Any, src: Buffer, res: Buffer) -> None:
    """An output aliased to input ``src`` starts as ``src``: what nothing wrote in it
    (garbage an earlier kernel left) stays unwritten where no block is copied out."""
    m.mark_written(res)
    history = m.histories.get(src.ident)
    full = src.full_box()
    written: list[Box] | None = [] if history is None else history.coverage.parts(full)
    if written is None or full != res.full_box():
        return
    m.store_garbage(_full(res), m.partly_from.get(src.ident, ""), m.root_of(src))
    for part in written:
        m.mark_written(res, part)


def never_read(desc: KernelDesc, j: int, box: Box | None) -> bool:
    """Whether the program reads no part of blocked output ``j``'s block ``box`` (None:
    the block's place is not known, so it counts as read)."""
    k = j - desc.n_in
    if box is None:
        return False
    if k < len(desc.out_dropped) and desc.out_dropped[k]:
        return True
    read = desc.out_read[k] if k < len(desc.out_read) else None
    if read is None or any(len(r) != len(box) for r in read):
        return False
    return not any(overlaps(box, r) for r in read)


def copy_out(
    m: Any,
    desc: KernelDesc,
    j: int,
    buf: Buffer,
    box: Box,
    res: Buffer,
) -> None:
    """Copy output block ``buf`` out to ``box`` of ``res``, garbage included (the
    padding of a partial block at the array's end is dropped)."""
    history = m.histories.get(buf.ident)
    written: list[Box] | None = [] if history is None else history.coverage.parts(buf.full_box())
    kept = kept_dims(desc, j, buf)
    if written is None or kept is None:
        m.mark_written(res, box)
        return
    m.store_garbage(
        View(res, box, tuple(hi - lo for lo, hi in box), res.itemsize),
        m.partly_from.get(buf.ident, ""),
        m.root_of(buf),
    )
    for part in written:
        out = list(box)
        for i, d in enumerate(kept):
            lo, hi = part[i][0] + box[d][0], part[i][1] + box[d][0]
            out[d] = (max(lo, box[d][0]), min(hi, box[d][1]))
        if all(hi > lo for lo, hi in out):
            m.mark_written(res, tuple(out))
