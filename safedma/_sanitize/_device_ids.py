"""The device ids of remote copies and signals, as coordinates to check against the mesh.

A ring neighbour computed as ``lax.axis_index(axis) + 1`` without ``% size`` addresses a
device outside the mesh: on a TPU the copy or signal reaches another device's memory or
none, and jax's TPU interpreter fails with a bare ``KeyError`` or ``IndexError``. The
sanitizer checks each coordinate before the operation, records the first one outside its
axis, and skips the operation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import jax

__all__ = ["Coordinate", "coordinates"]


@dataclasses.dataclass(frozen=True)
class Coordinate:
    """One coordinate of a device id: ``value`` (static or traced) must lie in
    ``0:size``; ``axis`` names it in messages (None: a logical id over the whole mesh)."""

    value: Any
    axis: str | None
    size: int


def coordinates(
    device_id: object, id_type: object, axes: Sequence[tuple[str, int]]
) -> list[Coordinate]:
    """The coordinates of ``device_id`` (as the user gave it: a dict by axis, a tuple in
    mesh order, or a logical id) that can be checked against the mesh ``axes``; forms that
    do not match the mesh are left to jax's and safedma's own checks."""
    if device_id is None or not axes:
        return []
    sizes = dict(axes)
    if isinstance(device_id, Mapping):
        found: list[Coordinate] = []
        for key, value in cast("Mapping[object, object]", device_id).items():
            names = (
                tuple(str(k) for k in cast("tuple[object, ...]", key))
                if isinstance(key, tuple)
                else (str(key),)
            )
            if all(name in sizes for name in names):
                span = math.prod(sizes[name] for name in names)
                found.append(Coordinate(value, "*".join(names), span))
        return found
    leaves: list[Any] = jax.tree_util.tree_leaves(device_id)
    if "LOGICAL" in str(id_type):
        if len(leaves) != 1:
            return []
        return [Coordinate(leaves[0], None, math.prod(sizes.values()))]
    if len(leaves) != len(axes):
        return []
    return [Coordinate(v, name, size) for v, (name, size) in zip(leaves, axes)]
