"""Typed device ids for remote copies and remote signals.

pltpu takes a device id as a tuple of mesh coordinates or a dict
``{axis: index}``, untyped; a float is truncated in interpret mode and rejected
by the Mosaic verifier, a wrong arity or an out-of-range index fails late or
not at all. A :class:`Device` can only be built from integers or integer
arrays, and is checked when it is built against the mesh axes in scope (the
``jax.shard_map`` around the ``pallas_call``): number of coordinates, axis
names, and static indices in range.
"""

from __future__ import annotations

from collections.abc import ItemsView, Mapping
from typing import Protocol, TypeAlias, TypeVar, cast, final

import jax
import jax.numpy as jnp

from safedma import _compat
from safedma._describe import describe_value
from safedma._errors import DeviceIdError
from safedma._refs import Index
from safedma._public import publish

__all__ = [
    "Device",
    "device",
    "mesh_coords",
    "neighbour",
    "my_index",
    "axis_size",
    "logical_device",
]

Axes: TypeAlias = "str | tuple[str, ...]"
"""One mesh axis, or several taken jointly (jax's ``axis_index(("x", "y"))``: the index
counts the devices of those axes in row-major order of the names given)."""

_PltpuDeviceId: TypeAlias = "tuple[Index, ...] | dict[Axes, Index]"


def _mesh_axes(purpose: str) -> Mapping[str, int]:
    axes = _compat.axes_in_scope()
    if not axes:
        raise DeviceIdError(
            f"{purpose} needs the mesh axes in scope, but none are: call the pallas_call "
            "inside jax.shard_map(..., mesh=mesh) so the kernel knows which devices exist."
        )
    return axes


def _check_index_kind(value: object, axis: str) -> Index:
    """A device index is an int or a jax array (checked before the mesh is looked up)."""
    if isinstance(value, bool) or not isinstance(value, (int, jax.Array)):
        raise DeviceIdError(
            f"device index for axis {axis!r} must be an int or an integer jax array, got "
            f"{type(value).__name__} {value!r}. Use jax.lax.axis_index({axis!r}) arithmetic "
            "or a Python int."
        )
    return value


def _axis_name_tuple(axes: object) -> tuple[object, ...]:
    """``axes`` as a tuple of names: itself if a tuple, else the one name."""
    return cast("tuple[object, ...]", axes) if isinstance(axes, tuple) else (axes,)


def _check_axis_names(axes: object, purpose: str) -> None:
    """``axes`` is one mesh axis name or a tuple of them (checked before the mesh is looked up)."""
    names = _axis_name_tuple(axes)
    if not all(isinstance(name, str) for name in names):
        raise DeviceIdError(
            f"{purpose}: axis must be a mesh axis name (a str) or a tuple of them, got "
            f"{type(axes).__name__} {axes!r}. Name the axis as the enclosing jax.shard_map's "
            "mesh does, such as 'x'."
        )


def _check_index(given: object, axis: str, size: int) -> Index:
    value = _check_index_kind(given, axis)
    if isinstance(value, int):
        if not 0 <= value < size:
            raise DeviceIdError(
                f"device index {value} is outside mesh axis {axis!r} of size {size} "
                f"(valid: 0 to {size - 1}). Wrap it with % {size}, or use "
                "safedma.neighbour(axis, shift)."
            )
        return value
    if value.shape != () or not jnp.issubdtype(value.dtype, jnp.integer):
        raise DeviceIdError(
            f"device index for axis {axis!r} must be an integer scalar, got an array of "
            f"shape {value.shape} and dtype {value.dtype}. A float index is silently "
            "truncated in interpret mode and rejected on TPU: compute it in integers."
        )
    return value


@final
class Device:
    """A target device, in a form checked against the mesh in scope.

    Build one with :func:`device` (``{axis: index}``), :func:`mesh_coords`
    (one coordinate per mesh axis) or :func:`neighbour`.
    """

    __slots__ = ("_id",)

    def __init__(self, _pltpu_id: _PltpuDeviceId, /) -> None:
        self._id = _pltpu_id

    @property
    def pltpu_device_id(self) -> tuple[Index, ...] | dict[Axes, Index]:
        """The value passed as ``device_id`` to pltpu (a logical id is passed with
        ``device_id_type=LOGICAL``)."""
        return self._id

    def __repr__(self) -> str:
        if isinstance(self._id, _compat.LogicalId):
            return f"logical_device({describe_value(self._id.index)})"
        if isinstance(self._id, dict):
            if all(isinstance(axis, str) for axis in self._id):
                inner = ", ".join(f"{axis}={describe_value(i)}" for axis, i in self._id.items())
                return f"device({inner})"
            inner = ", ".join(f"{axis!r}: {describe_value(i)}" for axis, i in self._id.items())
            return f"device({{{inner}}})"
        return f"mesh_coords({', '.join(describe_value(i) for i in self._id)})"


def _joint_size(axes: Axes, mesh: Mapping[str, int], wanted: object) -> int:
    """The number of devices along ``axes`` (one axis, or a tuple taken jointly)."""
    given = cast(object, axes)  # checked at run time too, for unchecked callers
    if not isinstance(given, (str, tuple)) or not all(
        isinstance(n, str)
        for n in cast("tuple[object, ...]", (given,) if isinstance(given, str) else given)
    ):
        raise DeviceIdError(
            f"device id key {given!r} in {wanted!r} is not a mesh axis name: use an axis name "
            "(a str) or a tuple of axis names taken jointly."
        )
    names = (axes,) if isinstance(axes, str) else axes
    if not names:
        raise DeviceIdError(f"an empty tuple of axes in device id {wanted!r} names no axis.")
    size = 1
    for name in names:
        if name not in mesh:
            raise DeviceIdError(
                f"unknown mesh axis {name!r} in device id {wanted!r}; axes in scope: "
                f"{list(mesh)} (from the enclosing jax.shard_map)."
            )
        size *= mesh[name]
    return size


K_co = TypeVar("K_co", covariant=True)
V_co = TypeVar("V_co", covariant=True)


class AxisItems(Protocol[K_co, V_co]):
    """A mapping read for its items: ``{axis: index}``. Not ``Mapping``, whose key type is
    invariant: a dict held in a variable (``dict[str, jax.Array]``,
    ``dict[tuple[str, str], int]``) would match only one key type, and mypy cannot infer a
    dict literal against a union of mappings."""

    def items(self) -> ItemsView[K_co, V_co]: ...


RawDeviceId: TypeAlias = "Index | tuple[Index, ...] | AxisItems[Axes, Index]"
"""A raw pltpu ``device_id``: a flat id, mesh coordinates, or ``{axis: index}``; never a
float, str or list. The one home of the type the stubs give ``device_id`` (both
``jax.experimental.pallas`` and ``jax.experimental.pallas.tpu`` import it from here)."""


def device(axes: AxisItems[Axes, Index] | None = None, /, **more_axes: Index) -> Device:
    """The device at ``{axis: index}``; axes left out are this device's own coordinates.

    ``device({"x": 0})`` or ``device(x=0)``. Axis names must be mesh axes in scope.
    A key may be a tuple of axes taken jointly, as in jax: ``device({("x", "y"): i})``
    with ``i`` counting the devices of ``x`` and ``y`` in row-major order
    (``safedma.my_index(("x", "y"))``).
    """
    given = cast(object, axes)  # checked at run time too, for unchecked callers
    if given is not None and not callable(getattr(given, "items", None)):
        raise DeviceIdError(
            f"safedma.device() takes a dict {{axis: index}} or keywords axis=index, got "
            f"{type(given).__name__} {given!r}. Write device(x=0) or device({{'x': 0}})."
        )
    wanted: dict[Axes, Index] = dict(axes.items()) if axes is not None else {}
    wanted.update(more_axes)
    if not _compat.axes_in_scope():  # no mesh to check against: the kinds at least
        for axis, index in wanted.items():
            _check_axis_names(axis, "safedma.device()")
            _check_index_kind(index, str(axis))
    mesh = _mesh_axes("safedma.device()")
    if not wanted:
        raise DeviceIdError(
            "safedma.device() needs at least one axis, e.g. device(x=0); "
            f"mesh axes in scope: {dict(mesh)}."
        )
    checked: dict[Axes, Index] = {}
    for axis, index in wanted.items():
        size = _joint_size(axis, mesh, wanted)
        checked[axis] = _check_index(index, str(axis), size)
    return Device(checked)


def mesh_coords(*coords: Index) -> Device:
    """The device at these mesh coordinates, one per mesh axis in mesh order."""
    if not _compat.axes_in_scope():  # no mesh to check against: the kinds at least
        for position, coord in enumerate(coords):
            _check_index_kind(coord, f"<coordinate {position}>")
    mesh = _mesh_axes("safedma.mesh_coords()")
    if len(coords) != len(mesh):
        raise DeviceIdError(
            f"mesh_coords got {len(coords)} coordinate(s) {coords!r} for a "
            f"{len(mesh)}-D mesh with axes {dict(mesh)}. Give one coordinate per axis, "
            "or name the axes you mean with safedma.device(axis=index)."
        )
    return Device(
        tuple(_check_index(c, axis, size) for c, (axis, size) in zip(coords, mesh.items()))
    )


def my_index(axis: Axes) -> jax.Array:
    """This device's index along ``axis`` (a tuple of axes: their joint, row-major index)."""
    _check_axis_names(axis, "safedma.my_index()")
    _joint_size(axis, _mesh_axes("safedma.my_index()"), axis)
    index: jax.Array = jax.lax.axis_index(axis)
    return index


def axis_size(axis: Axes) -> int:
    """The number of devices along ``axis`` (a tuple of axes: their product; a static int)."""
    _check_axis_names(axis, "safedma.axis_size()")
    return _joint_size(axis, _mesh_axes("safedma.axis_size()"), axis)


def neighbour(axis: str, shift: int = 1) -> Device:
    """The device ``shift`` steps along ``axis`` around the ring (negative: backwards)."""
    given = cast(object, shift)  # checked at run time too, for unchecked callers
    if isinstance(given, bool) or not isinstance(given, int):
        raise DeviceIdError(f"neighbour shift must be a Python int, got {shift!r}.")
    if not isinstance(cast(object, axis), str):
        raise DeviceIdError(
            f"safedma.neighbour(): axis must be a mesh axis name (a str), got "
            f"{type(axis).__name__} {axis!r}. Name the ring's axis, such as 'x'."
        )
    size = axis_size(axis)
    step = shift % size
    return Device({axis: (my_index(axis) + step) % size})


def logical_device(index: Index) -> Device:
    """The device with logical id ``index`` (``device_id_type=LOGICAL`` in pltpu).

    A logical id counts the devices of the mesh in scope in row-major order of
    its axes; a static id is checked against their number.
    """
    _check_index_kind(index, "<logical id>")
    mesh = _mesh_axes("safedma.logical_device()")
    count = 1
    for size in mesh.values():
        count *= size
    checked = _check_index(index, "<logical id>", count)
    return Device(_compat.LogicalId(checked))


publish(globals(), __name__)  # public classes print as safedma.X
