"""``fn`` and its arguments traced once into the device program verify walks.

Why its own module: everything verify needs from jax's tracing (the per-device
``shard_map`` body, its mesh, the values and specs of its operands) is found here once,
so the passes after it read only the jaxpr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import VerificationUnsupportedError
from safedma.testing._verify.program.compiler import location
from safedma.testing._verify.program.outer import shard_map_operands

__all__ = ["DeviceProgram", "local_shard", "trace"]


@dataclasses.dataclass
class DeviceProgram:
    """The program each device runs, as verify walks it.

    ``body`` is the ``shard_map`` body (or the whole program when ``fn`` runs none),
    ``consts`` its constants; ``axis_names``/``axis_sizes`` the mesh it runs on
    (empty: one device); ``op_values`` each operand's known value (None: unknown) and
    ``op_specs`` its in_spec when the arguments are split over the mesh
    (``local_shard``), None when they are each device's already."""

    body: Any
    consts: list[Any]
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    shard_map_mesh: Any  # the mesh of the shard_map found (None: no shard_map)
    op_values: list[Any]
    op_specs: list[Any] | None

    @property
    def has_shard_map(self) -> bool:
        return self.shard_map_mesh is not None


def trace(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    mesh: Any,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None,
) -> DeviceProgram:
    """Trace ``fn`` on ``args`` (arrays or ``jax.ShapeDtypeStruct``) over ``mesh`` with
    verify's calling convention, and find the device program in what jax traced."""
    if mesh is None and (in_specs is not None or out_specs is not None):
        raise ValueError("in_specs/out_specs need a mesh")
    leaves, tree = _TREE.flatten(args)
    if len(leaves) != len(args) or any(a is None for a in args):
        # pytree arguments (a tuple of arrays, as jax.jit takes them): verify the
        # function of their leaves
        if mesh is not None:
            raise ValueError(
                "verify with a mesh takes one array (or ShapeDtypeStruct) per argument, "
                "matching in_specs; pass the leaves of pytree arguments separately"
            )
        fn = _of_leaves(fn, tree)
        args = tuple(leaves)
    structs: list[Any] = []
    values: list[np.ndarray[Any, Any] | None] = []
    for a in args:
        # A NamedSharding the argument already has (an array split over a real mesh
        # that fn's own shard_map expects) is kept for tracing.
        sharding = getattr(a, "sharding", None)
        keep = sharding if isinstance(sharding, NamedSharding) else None
        if isinstance(a, jax.ShapeDtypeStruct):
            structs.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=keep))
            values.append(None)
        elif _opaque(a):
            # PRNG keys (extended dtypes) have no numpy values; arrays too large to
            # hold control data are not copied to the host: both stay unknown, and
            # a value the protocol needs from them names the operand.
            structs.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=keep))
            values.append(None)
        else:
            arr = np.asarray(a)
            structs.append(jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=keep))
            values.append(arr)
    program: Callable[..., Any] = fn
    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    if mesh is not None:
        names = tuple(str(n) for n in mesh.axis_names)
        sizes = tuple(
            int(s) for s in (mesh.axis_sizes if hasattr(mesh, "axis_sizes") else mesh.devices.shape)
        )
    # A mesh with no axes (``abstract_mesh((), (), tpu="v5p")``) only names the TPU
    # generation the wrappers ask for: fn runs as it is, inside that mesh.
    split = mesh is not None and bool(names)
    if mesh is not None and not split and (in_specs is not None or out_specs is not None):
        raise ValueError(
            "in_specs/out_specs need a mesh with axes; a mesh with none only names the "
            "TPU generation, and fn gets its arguments whole"
        )
    if mesh is not None and split:
        default = _partition_spec(names[0] if len(names) == 1 else names)
        ins = _specs(in_specs, default, True)
        outs = _specs(out_specs, default, False)
        program = jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)
        if isinstance(mesh, Mesh):
            # jax 0.12 checks the specs against the arguments' shardings.
            per_arg = _local_specs(in_specs, names, len(structs))
            structs = [
                jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))
                for s, spec in zip(structs, per_arg)
            ]

    def fresh(*xs: Any) -> Any:
        return program(*xs)

    with _mesh_context(mesh):
        traced = jax.jit(fresh).trace(*structs)  # pyright: ignore[reportUnknownMemberType]
    closed = traced.jaxpr
    top = closed.jaxpr
    found = _find_device_program(top)
    if split and found is None:
        raise VerificationUnsupportedError("no shard_map found in the traced program")
    if found is None:
        body, consts = top, list(_jax.consts_of(closed))
    else:
        body, consts, inner_mesh, _ = found
        _check_one_device_program(top, body)
        if not split:
            # fn runs its own shard_map: verify on that mesh, arguments unsplit.
            names = tuple(str(n) for n in inner_mesh.axis_names)
            sizes = tuple(int(inner_mesh.shape[n]) for n in names)
    # the value and in_spec of each operand of the device program
    op_values: list[Any] = list(values)
    op_specs: list[Any] | None = None
    if found is not None:
        outer = shard_map_operands(top, list(_jax.consts_of(closed)), values)
        assert outer is not None  # found is a shard_map
        op_values, op_specs = outer
    mesh_found = None if found is None else found[2]
    return DeviceProgram(body, consts, names, sizes, mesh_found, op_values, op_specs)


_partition_spec: Callable[..., PartitionSpec] = PartitionSpec


def _specs(specs: Any, default: PartitionSpec, arguments: bool) -> Any:
    if specs is None:
        return default
    if isinstance(specs, PartitionSpec):
        return specs
    seq = cast("Sequence[PartitionSpec]", specs)
    return list(seq) if isinstance(specs, list) and not arguments else tuple(seq)


def _mesh_context(mesh: Any) -> contextlib.AbstractContextManager[object]:
    if mesh is None:
        return contextlib.nullcontext()
    if isinstance(mesh, Mesh):
        return contextlib.nullcontext()
    return cast("contextlib.AbstractContextManager[object]", jax.sharding.use_abstract_mesh(mesh))


def _find_device_program(jaxpr: Any) -> tuple[Any, list[Any], Any, list[int]] | None:
    """(per-device jaxpr, its consts, mesh, top-level arg index per operand) of the shard_map."""
    top = {v: i for i, v in enumerate(jaxpr.invars)}

    def walk(j: Any, mapping: dict[Any, int]) -> tuple[Any, list[Any], Any, list[int]] | None:
        for eqn in j.eqns:
            name = eqn.primitive.name
            if name == "shard_map":
                body, consts = _jax.jaxpr_of(eqn.params["jaxpr"])
                args = [mapping.get(v, -1) if not _jax.is_literal(v) else -1 for v in eqn.invars]
                return body, consts, eqn.params["mesh"], args
            for sub in _jax.sub_jaxprs(eqn.params):
                inner, _ = _jax.jaxpr_of(sub)
                inner_map = {
                    iv: mapping[ov]
                    for iv, ov in zip(inner.invars, eqn.invars)
                    if not _jax.is_literal(ov) and ov in mapping
                }
                found = walk(inner, inner_map)
                if found is not None:
                    return found
        return None

    return walk(jaxpr, top)


_KERNEL_PRIMITIVES = ("pallas_call", "mpmd_map")


def _check_one_device_program(top: Any, body: Any) -> None:
    """Refuse a program whose kernels are not all in the one shard_map that is walked.

    Why: verify walks the body of the first shard_map it finds per device; kernels in a
    second shard_map, or outside any, would go unchecked while the report says clean."""
    maps: list[Any] = []
    kernels = 0
    for e in _jax.all_eqns(top):
        if e.primitive.name == "shard_map":
            maps.append(e)
        elif e.primitive.name in _KERNEL_PRIMITIVES:
            kernels += 1
    inside = sum(1 for e in _jax.all_eqns(body) if e.primitive.name in _KERNEL_PRIMITIVES)
    if len(maps) < 2 and kernels <= inside:
        return
    where = ", ".join(location(e) for e in maps[:3])
    raise VerificationUnsupportedError(
        f"verify walks the kernels of one shard_map per program, and this program has "
        f"{len(maps)} shard_map(s) (at {where}) and {kernels} kernel call(s), "
        f"{inside} of them in the first shard_map: the others would go unchecked. Verify "
        "each shard_map's function on its own (or pass the per-device function with "
        "mesh=, in_specs= and out_specs=)."
    )


_TREE: Any = jax.tree  # typed loosely: pytree definitions are opaque here


def _of_leaves(fn: Callable[..., Any], tree: Any) -> Callable[..., Any]:
    """``fn`` called with the leaves of its pytree arguments."""

    def flat(*leaves: Any) -> Any:
        return fn(*_TREE.unflatten(tree, leaves))

    return flat


_HOST_VALUES_LIMIT = 1 << 26  # bytes: page tables and flags are far smaller


def _opaque(a: Any) -> bool:
    """Whether argument ``a`` is an array whose values verify does not read."""
    dtype = getattr(a, "dtype", None)
    shape = getattr(a, "shape", None)
    if dtype is None or shape is None:
        return False
    if _jax.is_extended(dtype):
        return True
    size = math.prod(int(d) for d in cast("tuple[int, ...]", shape))
    return size * int(np.dtype(dtype).itemsize) > _HOST_VALUES_LIMIT


def _local_specs(in_specs: Any, names: tuple[str, ...], n: int) -> list[Any]:
    default = _partition_spec(names[0] if len(names) == 1 else names)
    if in_specs is None:
        return [default] * n
    if isinstance(in_specs, PartitionSpec):
        return [in_specs] * n
    return list(in_specs)


def local_shard(
    value: np.ndarray[Any, Any], spec: Any, coords: dict[str, int], sizes: dict[str, int]
) -> np.ndarray[Any, Any]:
    """Device ``coords``'s part of ``value``, an argument split over the mesh by ``spec``."""
    index: list[slice] = []
    for d, entry in enumerate(tuple(spec)):
        if entry is None or d >= value.ndim:
            index.append(slice(None))
            continue
        axes: tuple[str, ...] = (
            tuple(str(a) for a in cast("tuple[object, ...]", entry))
            if isinstance(entry, tuple)
            else (str(entry),)
        )
        parts, pos = 1, 0
        for a in axes:
            pos = pos * sizes[a] + coords[a]
            parts *= sizes[a]
        size = value.shape[d] // parts
        index.append(slice(pos * size, (pos + 1) * size))
    return value[tuple(index)]
