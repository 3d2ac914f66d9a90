"""Compile-only TPU builds: run the real XLA TPU compiler and Mosaic, no TPU needed.

libtpu can describe a TPU slice it is not attached to
(``jax.experimental.topologies.get_topology_desc``); jitting over a mesh of
those devices compiles with the same compiler a TPU VM uses.  That catches
what cross-lowering cannot, such as VMEM overflows or Mosaic verifier errors,
on CPU-only CI machines.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.experimental import mesh_utils, topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from safedma._arguments import check_bool, check_callable, check_shape, shown
from safedma.testing._libtpu import require_libtpu
from safedma.testing._meshes import check_specs

# Typed handles on JAX constructors whose __init__ is unannotated, so calls
# to them type-check under mypy --strict.
_shape_dtype_struct: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
_partition_spec: Callable[..., PartitionSpec] = PartitionSpec

__all__ = [
    "TpuCompileError",
    "TpuMeshError",
    "TpuCompileReport",
    "compile_for_tpu",
    "tpu_mesh",
]


class TpuCompileError(Exception):
    """The TPU compiler rejected a kernel.

    The message names the function, the Mosaic kernels in it, the topology and
    carries the compiler's own words; the parts are also attributes.
    """

    def __init__(
        self,
        function: str,
        topology: str,
        compiler_message: str,
        kernel_names: tuple[str, ...] = (),
    ) -> None:
        kernels = f" (Mosaic kernels: {', '.join(kernel_names)})" if kernel_names else ""
        super().__init__(
            f"TPU compilation of {function}{kernels} for topology {topology} "
            f"failed: {compiler_message}"
        )
        self.function = function
        self.topology = topology
        self.compiler_message = compiler_message
        self.kernel_names = kernel_names


class TpuMeshError(ValueError):
    """A mesh that cannot be laid over a TPU topology as asked.

    jax raises a bare ``NotImplementedError`` for a mesh whose axes would split
    physical axes (a (64, 4) mesh on ``v6e:16x16``); this names the topology,
    the mesh and the two ways out: ``allow_split_physical_axes=True`` or an
    explicit ``device_order``.
    """


@dataclasses.dataclass(frozen=True)
class TpuCompileReport:
    """What a successful compile-only build produced.

    Sizes come from ``Compiled.memory_analysis()`` and are per device; the
    ones the compiler does not report are ``None``.
    """

    function: str
    topology: str
    device_kind: str
    num_devices: int
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    kernel_names: tuple[str, ...]
    generated_code_size_in_bytes: int
    argument_size_in_bytes: int | None
    output_size_in_bytes: int | None
    temp_size_in_bytes: int | None
    alias_size_in_bytes: int | None
    compile_seconds: float


_MULTI_LOAD = "ALLOW_MULTIPLE_LIBTPU_LOAD"


# jax leaves parts of these signatures unannotated; pyright strict reports each use
# (reportUnknown*). Typed once here, or marked at the call. Read through getattr (Any,
# not Unknown): pyright reports a use passed straight to cast() and basedpyright does
# not, so a suppression comment there is wrong for one of them.
_JaxRuntimeError: type[Exception] = getattr(jax.errors, "JaxRuntimeError")


def _devices(topo: topologies.TopologyDescription) -> list[object]:
    devices: list[object] = getattr(topo, "devices")
    return devices


@functools.cache
def _topology(name: str) -> topologies.TopologyDescription:
    # Cached: each description owns a compile-only libtpu client.
    # libtpu takes /tmp/libtpu_lockfile on load so that only one process per
    # machine drives the TPU; a compile-only client drives none, and the lock
    # would otherwise fail this call whenever any other process (a parallel
    # test run, the other Python version's suite) has libtpu loaded.
    require_libtpu(f"Compiling for TPU topology {name!r} (compile_for_tpu, tpu_mesh)")
    os.environ.setdefault(_MULTI_LOAD, "1")
    try:
        return topologies.get_topology_desc(  # pyright: ignore[reportUnknownMemberType]
            name, "tpu"
        )
    except _JaxRuntimeError as err:
        if "lockfile" in str(err):
            raise RuntimeError(
                f"libtpu could not load to describe TPU topology {name!r} "
                f"because another process holds it ({err}); set {_MULTI_LOAD}=1 "
                "before libtpu is first loaded in this process"
            ) from err
        raise ValueError(f"libtpu does not know TPU topology {name!r}: {err}") from err


def _chips(topo: topologies.TopologyDescription) -> list[object]:
    # v4 and TPU7x descriptions list one device per TensorCore (core_on_chip 0
    # and 1); JAX programs address chips, so keep the first core of each.
    return [d for d in _devices(topo) if getattr(d, "core_on_chip", 0) == 0]


def _check_mesh_arguments(
    where: str,
    topology: object,
    mesh_shape: object,
    axis_names: object,
    device_order: object,
    allow_split_physical_axes: object,
) -> None:
    """The arguments that lay a mesh over a topology's chips, checked before libtpu loads."""
    if not isinstance(topology, str) or not topology.strip():
        raise (ValueError if isinstance(topology, str) else TypeError)(
            f"{where}: topology must be a libtpu topology name such as 'v6e:2x2' or "
            f"'v5p:2x2x1' (generation:chips per dimension), got {shown(topology)}."
        )
    if mesh_shape is not None:
        shape = check_shape(mesh_shape, "mesh_shape", where)
        if any(size < 1 for size in shape):
            raise ValueError(
                f"{where}: mesh_shape must be positive ints, one device count per axis, got "
                f"{shown(mesh_shape)}."
            )
    if isinstance(axis_names, str) or not isinstance(axis_names, (tuple, list)):
        raise TypeError(
            f"{where}: axis_names must be a tuple of strings, one per mesh axis, such as "
            f"('x',), got {shown(axis_names)}."
        )
    names = cast("Sequence[object]", axis_names)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(
            f"{where}: axis_names must be a tuple of strings, one per mesh axis, got "
            f"{shown(names)}."
        )
    if device_order is not None:
        check_shape(device_order, "device_order", where, fix="Give a permutation of the chips.")
    check_bool(allow_split_physical_axes, "allow_split_physical_axes", where)


def tpu_mesh(
    topology: str = "v6e:2x2",
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] = ("x",),
    *,
    device_order: Sequence[int] | None = None,
    allow_split_physical_axes: bool = False,
) -> Mesh:
    """A mesh of compile-only TPU devices, one per chip of ``topology``.

    ``mesh_shape`` defaults to all chips along one axis and must use every
    chip. By default jax's ``create_device_mesh`` picks a physically sensible
    device order; ``allow_split_physical_axes=True`` lets it split a physical
    axis over several mesh axes (needed for e.g. a (64, 4) mesh on
    ``v6e:16x16``), and ``device_order`` (a permutation of the chip indices,
    chips numbered in id order) sets the order outright. Where libtpu lists
    one device per TensorCore, chips are taken in id order unless
    ``device_order`` is given. Raises :class:`TpuMeshError` when the mesh does
    not fit.
    """
    _check_mesh_arguments(
        "safedma.testing.tpu_mesh()",
        topology,
        mesh_shape,
        axis_names,
        device_order,
        allow_split_physical_axes,
    )
    topo = _topology(topology)
    chips = sorted(_chips(topo), key=lambda d: int(getattr(d, "id", 0)))
    names = tuple(axis_names)
    shape = (len(chips),) if mesh_shape is None else tuple(int(s) for s in mesh_shape)
    if len(shape) != len(names):
        raise TpuMeshError(f"mesh_shape {shape} and axis_names {names} differ in length")
    if math.prod(shape) != len(chips):
        raise TpuMeshError(
            f"mesh_shape {shape} has {math.prod(shape)} devices but topology "
            f"{topology} has {len(chips)} chips"
        )
    if device_order is not None:
        order = [int(i) for i in device_order]
        if sorted(order) != list(range(len(chips))):
            raise TpuMeshError(
                f"device_order must be a permutation of 0..{len(chips) - 1} (the chips of "
                f"{topology} in id order), got {list(device_order)!r}"
            )
        picked = np.array([chips[i] for i in order], dtype=object)
        return Mesh(picked.reshape(shape), names)
    if len(chips) != len(_devices(topo)):
        return Mesh(np.array(chips, dtype=object).reshape(shape), names)
    try:
        devices = _create_device_mesh(
            shape, chips, allow_split_physical_axes=allow_split_physical_axes
        )
    except (NotImplementedError, ValueError, AssertionError) as err:
        hint = (
            ""
            if allow_split_physical_axes
            else " Pass allow_split_physical_axes=True to let jax split a physical axis, or"
        )
        raise TpuMeshError(
            f"cannot lay a {shape} mesh {names} over TPU topology {topology}: {err}.{hint} "
            "pass device_order=[...] (chip indices in id order) to choose the layout."
        ) from err
    return Mesh(devices, names)


# Typed once: jax leaves its devices parameter unannotated.
_create_device_mesh = cast(
    "Callable[..., np.ndarray[Any, Any]]", getattr(mesh_utils, "create_device_mesh")
)


def _describe(fn: Callable[..., object]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else repr(fn)


def _kernel_names(hlo_text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(re.findall(r'kernel_name = "([^"]*)"', hlo_text)))


def _shard_args(args: tuple[object, ...], specs: object, mesh: Mesh) -> tuple[object, ...]:
    # ``specs`` is a pytree prefix of ``args`` (one PartitionSpec for all, or
    # one per argument); give every array leaf the sharding it will have.
    def with_sharding(spec: PartitionSpec, sub: object) -> object:
        sharding = NamedSharding(mesh, spec)

        def leaf(x: object) -> object:
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                x = np.asarray(x)
            shape = tuple(int(d) for d in getattr(x, "shape"))
            return _shape_dtype_struct(shape, getattr(x, "dtype"), sharding=sharding)

        return jax.tree.map(leaf, sub)

    if isinstance(specs, PartitionSpec):
        return tuple(with_sharding(specs, a) for a in args)
    sharded = jax.tree.map(
        with_sharding, specs, args, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    return tuple(sharded)


def compile_for_tpu(
    fn: Callable[..., object],
    *args: object,
    topology: str = "v6e:2x2",
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] = ("x",),
    in_specs: PartitionSpec | Sequence[object] | None = None,
    out_specs: object = None,
    check_vma: bool = False,
    per_device: bool = True,
    device_order: Sequence[int] | None = None,
    allow_split_physical_axes: bool = False,
) -> TpuCompileReport:
    """Compile ``jax.shard_map(fn)`` for a TPU slice with libtpu, on any machine.

    ``fn`` is the per-device body (it may use ``jax.lax.axis_index`` and remote
    DMAs over ``axis_names``); ``args`` are the *global* arguments as
    ``jax.ShapeDtypeStruct`` or arrays.  ``in_specs``/``out_specs`` default to
    splitting the leading dimension over all mesh axes; ``in_specs`` is a
    single spec for every argument or a sequence with one per argument.  With
    ``per_device=False`` ``fn`` is jitted as is (it runs its own shard_map over
    ``tpu_mesh(topology, mesh_shape, axis_names)``); ``in_specs`` then only
    sets the input shardings and ``out_specs`` is ignored.
    ``device_order`` and ``allow_split_physical_axes`` lay the mesh over the
    chips as in :func:`tpu_mesh`.
    Raises :class:`TpuCompileError` when the compiler rejects the program,
    :class:`TpuMeshError` (a ``ValueError``) for a mesh that does not fit, and
    ``ValueError`` for an unknown topology.
    """
    where = "safedma.testing.compile_for_tpu()"
    check_callable(fn, "fn", where, "Pass the per-device function, then its arguments.")
    _check_mesh_arguments(
        where, topology, mesh_shape, axis_names, device_order, allow_split_physical_axes
    )
    check_specs(in_specs, "in_specs", where)
    check_bool(check_vma, "check_vma", where)
    check_bool(per_device, "per_device", where)
    mesh = tpu_mesh(
        topology,
        mesh_shape,
        axis_names,
        device_order=device_order,
        allow_split_physical_axes=allow_split_physical_axes,
    )
    names = tuple(mesh.axis_names)
    default_spec = _partition_spec(names[0] if len(names) == 1 else names)
    ins: PartitionSpec | tuple[object, ...]
    if in_specs is None:
        ins = default_spec
    elif isinstance(in_specs, PartitionSpec):
        ins = in_specs
    else:
        ins = tuple(in_specs)
    outs = default_spec if out_specs is None else out_specs
    sharded_args = _shard_args(args, ins, mesh)
    body = (
        jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=check_vma)
        if per_device
        else fn
    )
    program = jax.jit(body)  # pyright: ignore[reportUnknownMemberType]
    function = _describe(fn)
    start = time.perf_counter()
    lowered = program.trace(*sharded_args).lower()  # pyright: ignore[reportUnknownMemberType]
    kernel_names = _kernel_names(lowered.as_text())
    try:
        compiled = lowered.compile()  # pyright: ignore[reportUnknownMemberType]
    except _JaxRuntimeError as err:
        raise TpuCompileError(function, topology, str(err), kernel_names) from err
    seconds = time.perf_counter() - start
    stats = compiled.memory_analysis()

    def size(field: str) -> int | None:
        value = getattr(stats, field, None)
        return None if value is None else int(value)

    return TpuCompileReport(
        function=function,
        topology=topology,
        device_kind=str(mesh.devices.flat[0].device_kind),
        num_devices=int(mesh.devices.size),
        mesh_shape=tuple(int(s) for s in mesh.devices.shape),
        axis_names=names,
        kernel_names=kernel_names,
        generated_code_size_in_bytes=size("generated_code_size_in_bytes") or 0,
        argument_size_in_bytes=size("argument_size_in_bytes"),
        output_size_in_bytes=size("output_size_in_bytes"),
        temp_size_in_bytes=size("temp_size_in_bytes"),
        alias_size_in_bytes=size("alias_size_in_bytes"),
        compile_seconds=seconds,
    )
