"""The argument checks the kernels share, run before tracing.

Users call the kernels from untyped code too, so each check takes ``object``
and raises ``ValueError`` naming the kernel, the argument and what it must be:
a wrong argument fails here, in the caller's terms, instead of deep inside
Mosaic or, worse, on the TPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

import safedma as sd

__all__ = [
    "LANES",
    "TILE_ROWS",
    "check_axis",
    "check_block",
    "check_collective_id",
    "check_int",
    "check_reduction",
    "check_ring_input",
    "check_tile_dtype",
]

LANES = 128
"""The lanes of a TPU tile: the last dimension of a VMEM window is a multiple of this."""

_RING_TILE_ROWS = {np.dtype(np.float32): 8, np.dtype(jnp.bfloat16): 16}
"""The dtypes the ring reductions accumulate, and their VMEM tile rows."""

TILE_ROWS = {np.dtype(np.float32): 8, np.dtype(np.int32): 8, np.dtype(jnp.bfloat16): 16}
"""The dtypes the local kernels (gather, pipeline) move, and their VMEM tile rows."""


def check_tile_dtype(
    dtype: DTypeLike, kernel: str, tiles: Mapping[np.dtype[Any], int] = TILE_ROWS
) -> tuple[np.dtype[Any], int]:
    """``dtype`` as a numpy dtype and the rows of its VMEM tile; a ValueError naming the
    supported dtypes if ``tiles`` has none for it."""
    dt = np.dtype(dtype)
    if dt not in tiles:
        supported = ", ".join(d.name for d in tiles)
        raise ValueError(f"{kernel} supports dtypes {supported}; got {dt.name}")
    return dt, tiles[dt]


def check_axis(axis: object, kernel: str) -> int:
    """The size of mesh axis ``axis``, which must be in scope (inside ``jax.shard_map``)."""
    if not isinstance(axis, str):
        raise ValueError(f"{kernel}: axis must be a mesh axis name (a str), got {axis!r}")
    try:
        return sd.axis_size(axis)
    except sd.DeviceIdError as err:
        raise ValueError(f"{kernel}: {err}") from None


def check_int(value: object, name: str, kernel: str, *, minimum: int | None = None) -> int:
    """``value`` as an int; a bool, a float or an array is rejected, as is one below ``minimum``."""
    wanted = {None: "a Python int", 0: "a non-negative Python int", 1: "a positive Python int"}
    what = wanted.get(minimum, f"a Python int >= {minimum}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{kernel}: {name} must be {what}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{kernel}: {name} must be {what}, got {value}")
    return value


def check_collective_id(collective_id: object, kernel: str, *, optional: bool) -> None:
    """A barrier semaphore id: a non-negative int (or ``None`` for no barrier of its own)."""
    if optional and collective_id is None:
        return
    what = "None or a non-negative Python int" if optional else "a non-negative Python int"
    if isinstance(collective_id, bool) or not isinstance(collective_id, int) or collective_id < 0:
        raise ValueError(
            f"{kernel}: collective_id must be {what} (the id of the kernel's barrier "
            f"semaphore), got {collective_id!r}"
        )


def check_block(x: object, kernel: str) -> None:
    """A block the TPU DMA engines move whole: at least 1-D, 8/16/32-bit int or float."""
    shape, given = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is None or given is None:
        raise ValueError(f"{kernel} takes a jax.Array block, got {type(x).__name__}")
    if len(shape) == 0:
        raise ValueError(f"{kernel}: the block must have at least one dimension, got a scalar")
    dtype = np.dtype(given)
    numeric = jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
    if not numeric or dtype.itemsize not in (1, 2, 4):
        raise ValueError(
            f"{kernel} moves 32-, 16- or 8-bit integer or floating blocks (float32, "
            f"bfloat16, int8, ...); got {dtype.name}"
        )


def check_ring_input(
    shape: Sequence[int], dtype: DTypeLike, n: int, axis: str, kernel: str
) -> None:
    """A ``(n*m, cols)`` float32 or bfloat16 array whose ``(m, cols)`` chunks tile VMEM."""
    if len(shape) != 2:
        raise ValueError(
            f"{kernel} takes a 2-D array (rows, cols) per device; got shape {tuple(shape)}"
        )
    dt, tile = check_tile_dtype(dtype, kernel, _RING_TILE_ROWS)
    rows, cols = shape
    if rows % n:
        raise ValueError(
            f"{kernel}: rows={rows} must be divisible by the {n} devices along axis {axis!r}"
        )
    if rows // n == 0 or (rows // n) % tile:
        raise ValueError(
            f"{kernel}: each device's chunk has rows // n = {rows // n} rows, which must be a "
            f"positive multiple of {tile}, the rows of a VMEM tile for {dt.name} "
            f"({tile}, {LANES})"
        )
    if cols % LANES or cols == 0:
        raise ValueError(
            f"{kernel}: cols={cols} must be a positive multiple of {LANES}, the lanes of a "
            "VMEM tile"
        )


def check_reduction(x: jax.Array, axis: str, collective_id: object, kernel: str) -> int:
    """The reduce-scatter's and all-reduce's preconditions (a known axis, a ring input, a
    collective_id); returns the ring size ``n``."""
    n = check_axis(axis, kernel)
    check_ring_input(x.shape, x.dtype, n, axis, kernel)
    check_collective_id(collective_id, kernel, optional=False)
    return n
