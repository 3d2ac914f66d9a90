"""The lockstep path's grid: Pallas's block copies around each grid step, on every device.

Why its own module: a kernel with a grid runs its body once per grid point, and
Pallas's pipeline copies each BlockSpec operand's block in before a point and an
output's block out when the next point maps it elsewhere. The per-device walk models
that in ``walk/kernels.py`` (``_steps``) and ``walk/blocks.py``; this module makes the
same accesses in the same order for every device at once, and gives up (``Bail``)
wherever the per-device rules could say anything but "clean": a block index it does
not compute (read from scalar prefetch or vector data) or that differs between
devices, a block that starts outside its array, an output block visited again after
its copy-out, an output block not written when it is copied out, an output array not
covered by the blocks copied into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.lockstep.model import Bail, DataBuf, Ints, Model
from safedma.testing._verify.lockstep.values import Ref, literal
from safedma.testing._verify.walk.kernel_desc import KernelDesc

__all__ = ["Block", "Pipeline", "Walk"]

Box = tuple[tuple[int, int], ...]  # (start, size) per dimension of the array


class Walk(Protocol):
    """What the pipeline uses of the lockstep walk (``walker.LockstepWalk``, which
    imports this module): its model, the devices, and how it evaluates a jaxpr."""

    model: Model
    devs: Ints

    def eval_jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]: ...

    def uniform(self, x: Any, what: str) -> int: ...


class Block:
    """One BlockSpec operand copied through VMEM or SMEM: the kernel's block buffer, and
    for an output the array its blocks are copied out into (``result``)."""

    def __init__(self, desc: KernelDesc, j: int, buf: DataBuf, result: DataBuf | None) -> None:
        block: dict[str, Any] = desc.blocks[j]
        kinds = tuple(str(k) for k in block["block_kinds"])
        odd = [k for k in kinds if k not in ("blocked", "squeezed")]
        if odd:
            raise Bail(f"a block dimension of kind {odd[0]}")
        self.j, self.buf, self.result = j, buf, result
        self.kinds = kinds
        self.shape: tuple[int | None, ...] = tuple(block["block_shape"])
        self.dims = tuple(int(d) for d in block["array_shape"])
        jaxpr, consts = _jax.jaxpr_of(block["index_map"])
        self.map, self.map_consts = jaxpr, [literal(c) for c in consts]
        # an aliased output keeps the input where no block is copied out, and Mosaic
        # restores a block visited again with RevisitMode.ANY (walk/blocks.check_revisit)
        self.may_revisit = result is not None and (
            desc.aliases.get(j - desc.n_in) is not None or block["revisit"] == "any"
        )
        self.visit: Box | None = None  # the output block of the visit under way
        self.done: set[Box] = set()  # output blocks already copied out


class Pipeline:
    """The block copies of one kernel call, around each grid step of the walk."""

    def __init__(self, walk: Walk, blocks: list[Block], prefetch: list[Ref]) -> None:
        self.walk = walk
        self.inputs = [b for b in blocks if b.result is None]
        self.outputs = [b for b in blocks if b.result is not None]
        self.prefetch = prefetch
        self._index: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}

    def before(self, point: tuple[int, ...]) -> None:
        """Each input block is copied in (a write of the whole block by its device, as the
        per-device walk records it at every step), and an output's visit begins."""
        m, devs = self.walk.model, self.walk.devs
        self._index = {k: v for k, v in self._index.items() if k[1] == point}
        for b in self.inputs:
            self._box(b, point)  # the block must start inside its array
            m.access(b.buf, *_whole(b.buf, devs), devs, True, m.new_record(devs), False)
        for b in self.outputs:
            if b.visit is None:
                box = self._box(b, point)
                if box in b.done and not b.may_revisit:
                    raise Bail(f"a grid step that revisits a block of {b.buf.name}")
                b.visit = box

    def after(self, point: tuple[int, ...], nxt: tuple[int, ...] | None) -> None:
        """Each output block whose next step maps elsewhere (or after the last step) is
        copied out: it must be written, the copy reads it, and the result's box is written;
        what the step wrote does not count for the next block."""
        m, devs = self.walk.model, self.walk.devs
        for b in self.outputs:
            if nxt is not None and self._index_at(b, point) == self._index_at(b, nxt):
                continue
            if not b.buf.written.all():
                raise Bail(f"an output block of {b.buf.name} not written when copied out")
            m.access(b.buf, *_whole(b.buf, devs), devs, False, m.new_record(devs), False)
            assert b.visit is not None and b.result is not None
            starts = [np.full(len(devs), lo, dtype=np.int64) for lo, _ in b.visit]
            sizes = [size for _, size in b.visit]
            if not b.result.shape:
                starts, sizes = [np.zeros(len(devs), dtype=np.int64)], [1]
            m.access(b.result, starts, sizes, devs, True, m.new_record(devs), False)
            b.done.add(b.visit)
            b.visit = None
            if nxt is not None:
                b.buf.mark_unwritten()

    def finish(self) -> None:
        """After the last step: every output array is covered by the blocks copied out."""
        for b in self.outputs:
            assert b.result is not None
            if not b.result.written.all():
                raise Bail(f"output {b.result.name} not written everywhere")

    # ------------------------------------------------------------------ blocks

    def _index_at(self, b: Block, point: tuple[int, ...]) -> tuple[int, ...]:
        """Block ``b``'s block index at ``point``: its index map run on the grid indices
        and the scalar-prefetch refs, the same on every device."""
        key = (b.j, point)
        found = self._index.get(key)
        if found is not None:
            return found
        w = self.walk
        args: list[Any] = [np.asarray(i, dtype=np.int32) for i in point]
        outs = w.eval_jaxpr(b.map, b.map_consts, [*args, *self.prefetch])
        index = tuple(w.uniform(v, "a block index") for v in outs)
        if len(index) != len(b.kinds):
            raise Bail("an index map with the wrong number of results")
        self._index[key] = index
        return index

    def _box(self, b: Block, point: tuple[int, ...]) -> Box:
        """The (start, size) per array dimension of the block at ``point`` (a partial block
        at the end is cut to the array; one that starts outside it gives up: the per-device
        walk reports it)."""
        box: list[tuple[int, int]] = []
        for i, kind, size, dim in zip(self._index_at(b, point), b.kinds, b.shape, b.dims):
            n = 1 if kind == "squeezed" or size is None else int(size)
            start = i * n if kind == "blocked" else i
            if not 0 <= start < dim:
                raise Bail(f"a block of {b.buf.name} that starts outside its array")
            box.append((start, min(start + n, dim) - start))
        return tuple(box)


def _whole(buf: DataBuf, devs: Ints) -> tuple[list[Ints], list[int]]:
    """The window of all of ``buf`` on every device."""
    dims = list(buf.shape or (1,))
    return [np.zeros(len(devs), dtype=np.int64) for _ in dims], dims
