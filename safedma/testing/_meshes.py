"""Meshes of host CPU devices, argument placement on them, and device names for messages."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from safedma._arguments import check_shape, shown
from safedma.testing._errors import NotEnoughDevicesError

__all__ = [
    "DeviceNames",
    "Specs",
    "bytes_per_device",
    "default_spec",
    "place",
    "simulated_mesh",
    "specs",
]

# Typed handle on an unannotated JAX constructor (see _compile.py).
_partition_spec: Callable[..., PartitionSpec] = PartitionSpec

#: What shard_map takes as in_specs/out_specs here.
Specs = PartitionSpec | tuple[PartitionSpec, ...] | list[PartitionSpec]


def simulated_mesh(shape: int | Sequence[int], axis_names: str | Sequence[str]) -> Mesh:
    """A mesh of host CPU devices, so multi-device kernels can be simulated on CPU.

    jax fixes the number of host devices when it initialises, from
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N``; set it before jax
    is imported.  From pytest, in a ``conftest.py`` that runs before any test
    module imports jax::

        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

    From a script, the same two lines at the top, before ``import jax``.
    Raises :class:`NotEnoughDevicesError` when there are too few devices.
    """
    where = "safedma.testing.simulated_mesh()"
    given: object = shape  # checked at run time too, for callers without a type checker
    if isinstance(given, int) and not isinstance(given, bool):
        given = (given,)
    dims = check_shape(given, "shape", where, fix="Give one device count per axis, such as (2, 4).")
    if any(d < 1 for d in dims):
        raise ValueError(
            f"{where}: shape must be positive integers, one device count per axis, got "
            f"{shown(shape)}."
        )
    named: object = axis_names
    if isinstance(named, str):
        named = (named,)
    if not isinstance(named, (tuple, list)) or not all(
        isinstance(n, str) for n in cast("Sequence[object]", named)
    ):
        raise TypeError(
            f"{where}: axis_names must be a string or a tuple of strings, one per axis, got "
            f"{shown(axis_names)}."
        )
    names = tuple(cast("Sequence[str]", named))
    if len(dims) != len(names):
        raise ValueError(
            f"{where}: shape {dims} and axis_names {names} differ in length: give one name per axis."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: axis_names must be distinct, got {names}.")
    needed = math.prod(dims)
    devices = cast("list[object]", jax.devices("cpu"))  # pyright: ignore[reportUnknownMemberType]
    if len(devices) < needed:
        raise NotEnoughDevicesError(
            f"a simulated mesh of shape {dims} needs {needed} host CPU devices but "
            f"jax has {len(devices)}. jax reads the count once, when it initialises: "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={max(needed, 8)} "
            "before jax is imported (in pytest, at the top of a conftest.py via "
            "os.environ; in a script, before `import jax`)."
        )
    return jax.make_mesh(  # pyright: ignore[reportUnknownMemberType]
        dims, names, devices=devices[:needed]
    )


def check_mesh(mesh: object, where: str) -> None:
    """``mesh`` is None or a jax mesh (a ``Mesh``, an ``AbstractMesh``) whose axes all
    have at least one device."""
    if mesh is None:
        return
    shape = getattr(mesh, "shape", None)
    if not isinstance(shape, Mapping) or not hasattr(mesh, "axis_names"):
        raise TypeError(
            f"{where}: mesh must be a jax mesh (safedma.testing.simulated_mesh(...), "
            f"abstract_mesh(...) or a jax.sharding.Mesh) or None, got {shown(mesh)}."
        )
    sizes = cast("Mapping[object, object]", shape)
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"{where}: mesh axis {name!r} must have at least one device, got size "
                f"{size!r} (mesh {shown(mesh)}). Build the mesh with positive axis sizes."
            )


def check_specs(specs: object, parameter: str, where: str) -> None:
    """``specs`` is None, a ``PartitionSpec``, or a sequence of them (or of pytrees of them)."""
    if specs is None or isinstance(specs, (PartitionSpec, tuple, list)):
        return
    raise TypeError(
        f"{where}: {parameter} must be a jax.sharding.PartitionSpec, a sequence of them "
        f"(one per argument), or None for the default, got {shown(specs)}."
    )


class DeviceNames:
    """Turns interpret mode's logical device ids into mesh coordinates for messages."""

    def __init__(self, mesh: Mesh | None) -> None:
        self._shape: tuple[int, ...] = (
            tuple(int(s) for s in mesh.devices.shape) if mesh is not None else ()
        )
        self._names: tuple[str, ...] = (
            tuple(str(n) for n in mesh.axis_names) if mesh is not None else ()
        )
        self.count = math.prod(self._shape) if mesh is not None else 1

    def only_axis(self) -> tuple[str, int] | None:
        """The mesh's axis and its size, when it has exactly one."""
        if len(self._shape) != 1:
            return None
        return self._names[0], self._shape[0]

    def label(self, device_id: int) -> str:
        if not self._shape or not 0 <= device_id < self.count:
            return f"device {device_id}"
        coords = np.unravel_index(device_id, self._shape)
        where = ", ".join(f"{n}={int(c)}" for n, c in zip(self._names, coords))
        return f"device {device_id} ({where})"


def default_spec(mesh: Mesh) -> PartitionSpec:
    """The leading dimension split over all mesh axes."""
    names = tuple(mesh.axis_names)
    return _partition_spec(names[0] if len(names) == 1 else names)


def specs(
    given: PartitionSpec | Sequence[PartitionSpec] | None,
    default: PartitionSpec,
    *,
    arguments: bool,
) -> Specs:
    """The caller's specs in the form shard_map matches against ``fn``'s pytrees."""
    # The arguments are always a tuple; the outputs keep whatever sequence type
    # the caller (and so fn) uses.
    if given is None:
        return default
    if isinstance(given, PartitionSpec):
        return given
    return list(given) if isinstance(given, list) and not arguments else tuple(given)


def place(args: Sequence[ArrayLike], in_specs: Specs, mesh: Mesh) -> tuple[jax.Array, ...]:
    """Put each argument on the mesh with its spec (jax >= 0.12 refuses implicit resharding)."""
    if isinstance(in_specs, PartitionSpec):
        per_arg: Sequence[PartitionSpec] = [in_specs] * len(args)
    else:
        per_arg = list(in_specs)
        if len(per_arg) != len(args):
            raise ValueError(
                f"in_specs has {len(per_arg)} entries for {len(args)} arguments; give "
                "one PartitionSpec per argument, or a single one for all"
            )
    return tuple(
        cast(
            jax.Array,
            jax.device_put(  # pyright: ignore[reportUnknownMemberType]
                a, NamedSharding(mesh, s)
            ),
        )
        for a, s in zip(args, per_arg)
    )


def bytes_per_device(value: object) -> int:
    """The largest shard of ``value`` in bytes (its whole size if it is not sharded)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return 0
    sharding = getattr(value, "sharding", None)
    shard_shape = getattr(sharding, "shard_shape", None)
    local = tuple(shape)
    if callable(shard_shape):
        try:
            local = tuple(
                cast("Callable[[tuple[int, ...]], tuple[int, ...]]", shard_shape)(tuple(shape))
            )
        except Exception:  # only a size estimate; a sharding it cannot split is whole
            local = tuple(shape)
    return int(math.prod(int(d) for d in local)) * int(np.dtype(dtype).itemsize)
