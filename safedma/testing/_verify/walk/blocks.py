"""Which block of each operand a grid point maps to, and the rules on those blocks.

Pallas's pipeline copies each BlockSpec operand's block in before a grid point and
an output's block out when the next point maps elsewhere. The index maps are run
exactly; a block must start inside its array, and an output block must not be
visited again once it was copied out (docs/verify-model.md, rules 9 and 10).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any, cast

import numpy as np

from safedma.testing._verify.errors import (
    OutOfBoundsDmaError,
    VerificationUnsupportedError,
    VerifyKernelError,
)
from safedma.testing._verify.model.regions import Buffer
from safedma.testing._verify.program.compiler import run_plain
from safedma.testing._verify.program.context import Ctx, RefVal
from safedma.testing._verify.program.scalars import Unknown
from safedma.testing._verify.walk.kernel_desc import KernelDesc

__all__ = [
    "block_box",
    "block_changes",
    "block_index",
    "check_revisit",
    "fill_block",
    "grid_point_at",
    "grid_points",
    "ints",
    "known_values",
]


def grid_points(
    grid: tuple[int, ...], start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, ...]]:
    """The grid's points in row-major order, made one at a time: ``itertools.product``
    and ``np.ndindex`` first build something as large as the grid (a grid of 10**8
    points took seconds and GBs before verify's time budget could stop it). No grid
    is one point; a grid with a zero-size axis has none. ``start``/``stop``: the
    row-major positions of the first point and one past the last (a megacore part)."""
    total = math.prod(grid)
    stop = total if stop is None else min(stop, total)
    if start >= stop:
        return
    index = list(grid_point_at(grid, start))
    for _ in range(stop - start):
        yield tuple(index)
        k = len(grid) - 1
        while k >= 0:
            index[k] += 1
            if index[k] < grid[k]:
                break
            index[k] = 0
            k -= 1


def grid_point_at(grid: tuple[int, ...], position: int) -> tuple[int, ...]:
    """The grid point at row-major ``position``."""
    index: list[int] = []
    for g in reversed(grid):
        position, i = divmod(position, g)
        index.append(i)
    return tuple(reversed(index))


def ints(shape: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in cast("tuple[Any, ...]", shape))


def block_index(
    desc: KernelDesc, ctx: Ctx, j: int, point: tuple[int, ...], prefetch: list[Any]
) -> list[Any] | None:
    """Blocked operand ``j``'s block index at grid step ``point``; None when its index
    map fails. Index maps take the scalar-prefetch refs after the grid indices (a
    ragged kernel maps a logical tile to its physical block through them)."""
    try:
        return list(run_plain(desc.index_maps[j], [*point, *prefetch[: desc.n_index]], ctx))
    except Exception:
        return None


def block_changes(
    desc: KernelDesc,
    ctx: Ctx,
    j: int,
    now: tuple[int, ...],
    nxt: tuple[int, ...],
    prefetch: list[Any],
) -> bool:
    """Whether output ``j``'s block index differs at the next step (Pallas copies the
    block out only then)."""
    a = block_index(desc, ctx, j, now, prefetch)
    b = block_index(desc, ctx, j, nxt, prefetch)
    if a is None or b is None:
        return True
    if any(isinstance(v, Unknown) for v in (*a, *b)):
        return True
    return list(a) != list(b)


def block_box(
    desc: KernelDesc, ctx: Ctx, j: int, point: tuple[int, ...], prefetch: list[Any]
) -> tuple[tuple[int, int], ...] | None:
    """The part of blocked operand ``j``'s array that grid step ``point``'s block covers
    (the part a copy-out writes); None (all of it) when the index map's answer is not
    known or the block is not made of plain blocked/squeezed dimensions.

    A block that starts outside the array is an error (a partial block at the end is
    not: Pallas pads it); jax's interpret mode raises "Out-of-bounds block index".
    """
    block: dict[str, Any] = desc.blocks[j]
    kinds: tuple[str, ...] = tuple(block.get("block_kinds", ()))
    if any(k not in ("blocked", "squeezed") for k in kinds):
        return None
    index = block_index(desc, ctx, j, point, prefetch)
    if index is None or len(index) != len(kinds) or not all(isinstance(i, int) for i in index):
        return None
    box: list[tuple[int, int]] = []
    dims = ints(block["array_shape"])
    for (start, n), dim in zip(_windows(block, index), dims):
        if not 0 <= start < dim:
            raise _outside(ctx, desc, j, point, tuple(index), start, n, dims)
        box.append((start, min(start + n, dim)))
    return tuple(box)


def _windows(block: dict[str, Any], index: list[Any]) -> list[tuple[int, int]]:
    """(start, size) along each dimension of the block that block indices ``index``
    name: a blocked dimension's index counts blocks, a squeezed one's elements."""
    out: list[tuple[int, int]] = []
    shape: tuple[int | None, ...] = block["block_shape"]
    for i, kind, bs in zip(index, block["block_kinds"], shape):
        n = 1 if kind == "squeezed" or bs is None else int(bs)
        out.append((int(i) * n if kind == "blocked" else int(i), n))
    return out


def _outside(
    ctx: Ctx,
    desc: KernelDesc,
    j: int,
    point: tuple[int, ...],
    index: tuple[int, ...],
    start: int,
    size: int,
    dims: tuple[int, ...],
) -> OutOfBoundsDmaError:
    role = "output" if j >= desc.n_in else "input"
    name = desc.param_names[desc.n_index + j]
    on = "" if len(ctx.engine.labels) == 1 else f" on {ctx.engine.labels[ctx.p]}"
    return OutOfBoundsDmaError(
        f"kernel {desc.name} at {desc.where}{on}: at grid point {point} the index map "
        f"of {role} {name} gives block index {index}, whose block starts at {start} "
        f"(size {size}) outside its array of shape {dims}: the pipeline would copy "
        f"{'from' if role == 'input' else 'into'} memory that is not the array's (a "
        "partial block at the end is fine; one that starts past it is not). Fix: "
        "clamp the index map (e.g. jnp.minimum(i, num_blocks - 1)) or shrink the grid."
    )


def check_revisit(
    ctx: Ctx,
    desc: KernelDesc,
    visits: dict[int, dict[tuple[tuple[int, int], ...], tuple[Any, Any]]],
    j: int,
    box: tuple[tuple[int, int], ...] | None,
    point: tuple[int, ...],
) -> None:
    """Grid ``point`` starts a visit of an output block the pipeline already copied out.

    Pallas keeps an output block in VMEM only while consecutive grid steps map to
    it; a later visit starts from undefined contents and its copy-out replaces what
    the earlier visits wrote (jax's ``RevisitMode`` docs; its interpret mode raises
    "Revisited block"). Exempt, as there: outputs aliased to an input, and blocks
    whose ``pipeline_mode`` asks for ``RevisitMode.ANY`` (Mosaic restores them).
    """
    if box is None or j not in visits:
        return
    before = visits[j].get(box)
    if before is None:
        return
    if desc.aliases.get(j - desc.n_in) is not None or desc.blocks[j]["revisit"] == "any":
        return
    name = desc.param_names[desc.n_index + j]
    on = "" if len(ctx.engine.labels) == 1 else f" on {ctx.engine.labels[ctx.p]}"
    raise VerifyKernelError(
        f"kernel {desc.name} at {desc.where}{on}: grid point {point} revisits block "
        f"{_fmt_block(box)} of output {name}, which the pipeline already copied out after "
        f"grid points {before[0]} through {before[1]}. Pallas keeps an output block only "
        "while consecutive grid points map to it: the later visit starts from undefined "
        "contents and its copy-out overwrites the earlier result. Fix: make the grid "
        "points of each output block consecutive (put the dimensions the output's index "
        "map ignores last, as 'arbitrary'), or pass pipeline_mode=pl.Buffered(1, "
        "revisit=pl.RevisitMode.ANY) to its BlockSpec."
    )


def _fmt_block(box: tuple[tuple[int, int], ...]) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def known_values(src: Any, shape: Any) -> list[object] | None:
    """The values of operand ``src`` (row-major over ``shape``) when the verifier has them."""
    values: Any = src.buffer.values if isinstance(src, RefVal) else None
    if isinstance(src, (np.ndarray, np.generic, int, float, bool)):
        flat: Any = np.asarray(cast(object, src)).reshape(-1)
        values = cast("list[object]", flat.tolist())  # computed outside the kernels
    if values is None or len(values) != math.prod(ints(shape)):
        return None
    return cast("list[object]", values)


def fill_block(
    desc: KernelDesc,
    ctx: Ctx,
    j: int,
    buf: Buffer,
    values: list[object] | None,
    point: tuple[int, ...],
    prefetch: list[Any],
    origin: str | None = None,
) -> None:
    """Load the values of grid step ``point``'s block of operand ``j`` into ``buf`` (an
    SMEM block, or a small VMEM one whose contents are followed: walk/contents.py);
    ``origin``: why the operand's contents are not known, when they are not.

    Pallas copies the block the index map names into SMEM before the step; the
    kernel then reads page tables, indices and lengths from it as scalars. Parts
    outside the operand (a partial last block), blocks the index map picks from
    unknown data, and windows other than plain blocks hold unknown values.
    """
    block: dict[str, Any] = desc.blocks[j]
    name = desc.param_names[desc.n_index + j]
    size = len(buf.values) if buf.values is not None else 0
    unknown: object = Unknown(origin or f"the contents of operand {name}")
    kinds: tuple[str, ...] = tuple(block.get("block_kinds", ()))
    if values is None or any(k not in ("blocked", "squeezed") for k in kinds):
        buf.values = list[object]([unknown] * size)
        return
    index: list[Any]
    try:
        index = run_plain(desc.index_maps[j], [*point, *prefetch[: desc.n_index]], ctx)
    except VerificationUnsupportedError:
        index = [unknown]
    if len(index) != len(kinds) or not all(isinstance(i, int) for i in index):
        why = next((i for i in index if isinstance(i, Unknown)), unknown)
        buf.values = list[object]([why] * size)
        return
    dims = ints(block["array_shape"])
    ranges = [range(start, start + n) for start, n in _windows(block, index)]
    strides = [math.prod(dims[k + 1 :]) for k in range(len(dims))]
    pad: object = Unknown(f"padding past the end of operand {name} (a partial block)")
    filled: list[object] = []
    for coords in itertools.product(*ranges):
        inside = all(0 <= c < d for c, d in zip(coords, dims))
        flat = sum(c * st for c, st in zip(coords, strides))
        filled.append(values[flat] if inside else pad)
    if len(filled) == size:
        buf.values = filled
    else:
        buf.values = list[object]([unknown] * size)
