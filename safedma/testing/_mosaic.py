"""Mosaic identity: the exact TPU kernel a JAX function lowers to, as text.

A safedma kernel and a hand-written ``pltpu`` twin are "the same" when they
hand the TPU compiler the same Mosaic module.  These helpers cross-lower a
function for TPU on any machine (no TPU needed), pull every Mosaic module out
of the ``tpu_custom_call`` ops in the exported StableHLO and print it without
source locations, so two kernels can be compared as strings.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import difflib
import json
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, cast

import jax
from jax.extend.mlir import ir
from jax.sharding import AbstractMesh, AxisType, Mesh

from safedma._arguments import check_callable, check_shape, shown
from safedma._sanitize._report import unchecked_on_host
from safedma.testing._meshes import check_mesh
from safedma.testing._private import moved, private_callable, private_module

__all__ = [
    "KERNEL_PLACEHOLDER",
    "TPU_GENERATIONS",
    "MosaicKernel",
    "MosaicMismatchError",
    "abstract_mesh",
    "assert_same_mosaic",
    "mosaic_kernels",
    "mosaic_text",
]

#: What kernel names become when ``normalize_names`` is on.
KERNEL_PLACEHOLDER = "__kernel__"

_TARGET = "tpu_custom_call"
# Parts of the backend config that are not kernel identity: the body is
# printed separately and debug_locations only carries source positions.
_CONFIG_SKIP = frozenset({"body", "debug_locations"})
_MAX_DIFF_LINES = 400


# Private JAX names used here (and only here in _mosaic): the MLIR context
# factory of jax._src.interpreters.mlir and the TPU dialect registration of
# jax._src.lib.tpu, because jax has no public way to parse exported StableHLO
# that holds Mosaic bytecode.
@contextlib.contextmanager
def mosaic_ir_context() -> Generator[ir.Context, None, None]:
    """Enter an MLIR context that parses exported StableHLO and Mosaic bytecode.

    It has JAX's dialects (for the StableHLO), the Mosaic TPU dialect (the
    kernel bytecode uses its types) and accepts unregistered ops (serialised
    Mosaic ops are ``stable_mosaic.*``, which no dialect registers).  Since
    jax 0.12 ``make_ir_context`` hands out a cached per-thread context that JAX
    reuses for its own lowering, so we take the uncached ``_create_ir_context``
    where it exists; otherwise (jax 0.10, where ``make_ir_context`` is
    uncached, or a release that renamed it) we put the unregistered-dialects
    flag back on exit in case the context is shared.  Registering the TPU
    dialect is idempotent and what JAX's own Pallas lowering does.
    """
    jmlir = private_module("jax._src.interpreters.mlir")
    jtpu = private_module("jax._src.lib.tpu")
    # The name is kept: a callable's __name__ is not part of its type (ty reports it).
    name = "_create_ir_context" if hasattr(jmlir, "_create_ir_context") else "make_ir_context"
    factory = private_callable(jmlir, name)
    register_tpu = private_callable(jtpu, "register_dialect")
    ctx = factory()
    if not isinstance(ctx, ir.Context):
        raise moved(
            f"{jmlir.__name__}.{name}",
            f"returned {type(ctx).__name__}, not an MLIR Context",
        )
    register_tpu(ctx)
    allowed = ctx.allow_unregistered_dialects
    ctx.allow_unregistered_dialects = True
    try:
        with ctx:
            yield ctx
    finally:
        ctx.allow_unregistered_dialects = allowed


@dataclasses.dataclass(frozen=True)
class MosaicKernel:
    """One Mosaic kernel found in a lowered program.

    ``module`` is the printed Mosaic module (no locations; the kernel name
    replaced by :data:`KERNEL_PLACEHOLDER` if it was normalised), ``config``
    the rest of the custom call's backend config as sorted compact JSON and
    ``aliases`` the custom call's ``output_operand_aliases`` (empty if none),
    because both change what the compiled kernel does.
    """

    index: int
    name: str
    module: str
    config: str
    aliases: str

    def render(self, *, count: int, normalize_names: bool) -> str:
        """This kernel as a section of :func:`mosaic_text`."""
        shown = KERNEL_PLACEHOLDER if normalize_names else self.name
        lines = [
            f"// ===== Mosaic kernel {self.index + 1} of {count}: {shown} =====",
            f"// backend_config: {self.config}",
        ]
        if self.aliases:
            lines.append(f"// output_operand_aliases: {self.aliases}")
        lines.append(self.module.rstrip("\n"))
        return "\n".join(lines)


class MosaicMismatchError(AssertionError):
    """Two functions lower to different Mosaic; the message is a unified diff.

    Subclasses ``AssertionError`` so pytest reports it as a test failure;
    ``text_a``/``text_b`` hold the full texts for closer inspection.
    """

    def __init__(self, message: str, text_a: str, text_b: str) -> None:
        super().__init__(message)
        self.text_a = text_a
        self.text_b = text_b


# The device kind and TensorCores per device a TPU of each generation reports
# (what jax's tpu_info reads from an abstract mesh's device).
TPU_GENERATIONS: dict[str, tuple[str, int]] = {
    "v4": ("TPU v4", 2),
    "v5e": ("TPU v5 lite", 1),
    "v5p": ("TPU v5", 2),
    "v6e": ("TPU v6 lite", 1),
    "tpu7x": ("TPU7x", 1),
}


def abstract_mesh(
    axis_sizes: Sequence[int], axis_names: Sequence[str], *, tpu: str | None = None
) -> AbstractMesh:
    """A device-free mesh for cross-lowering ``jax.shard_map`` kernels.

    This is the simplest mesh that works on a CPU-only machine without
    ``XLA_FLAGS`` or libtpu topologies.  Axes are ``Auto`` because jax 0.12
    defaults an ``AbstractMesh`` to ``Explicit`` axes, under which shard_map
    rejects inputs that carry no sharding; pass inputs as
    ``jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))``
    so the export knows the device count.

    ``tpu`` (one of :data:`TPU_GENERATIONS`: ``"v4"``, ``"v5e"``, ``"v5p"``,
    ``"v6e"``, ``"tpu7x"``) names the TPU generation the kernel is lowered for:
    kernels whose lowering asks for it (``pltpu.emit_pipeline``,
    ``pltpu.sync_copy`` and scoped VMEM on jax 0.12, HOST memory) lower on a CPU
    inside this mesh (``mesh=`` of :func:`mosaic_text`). ``axis_sizes=()`` gives
    a mesh with no axes, for kernels that are not shard_mapped.
    """
    where = "safedma.testing.abstract_mesh()"
    sizes = _axis_sizes(axis_sizes, where)
    names = _axis_names(axis_names, where)
    if len(sizes) != len(names):
        raise ValueError(
            f"{where}: axis_sizes {sizes} and axis_names {names} differ in length: give one "
            "name per axis."
        )
    axis_types = (AxisType.Auto,) * len(names)
    if tpu is None:
        return AbstractMesh(sizes, names, axis_types=axis_types)
    if not isinstance(cast(object, tpu), str) or tpu not in TPU_GENERATIONS:
        raise ValueError(
            f"{where}: unknown TPU generation {tpu!r}: tpu must be one of "
            f"{', '.join(map(repr, TPU_GENERATIONS))} or None."
        )
    kind, cores = TPU_GENERATIONS[tpu]
    device = _abstract_device(device_kind=kind, num_cores=cores, platform="tpu")
    return AbstractMesh(sizes, names, axis_types=axis_types, abstract_device=device)


def _axis_sizes(axis_sizes: object, where: str) -> tuple[int, ...]:
    """A mesh's axis sizes: a tuple of positive ints (an empty one for no axes)."""
    sizes = check_shape(axis_sizes, "axis_sizes", where, fix="")
    for size in sizes:
        if size < 1:
            raise ValueError(
                f"{where}: axis_sizes must be positive ints, one device count per axis, got "
                f"{shown(axis_sizes)}."
            )
    return sizes


def _axis_names(axis_names: object, where: str) -> tuple[str, ...]:
    """A mesh's axis names: a tuple of distinct strings."""
    if isinstance(axis_names, str) or not isinstance(axis_names, (tuple, list)):
        raise TypeError(
            f"{where}: axis_names must be a tuple of strings, one per axis, such as ('x',), "
            f"got {shown(axis_names)}."
        )
    given = cast("Sequence[object]", axis_names)
    names = tuple(given)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(
            f"{where}: axis_names must be a tuple of strings, one per axis, got {shown(given)}."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: axis_names must be distinct, got {shown(given)}.")
    return cast("tuple[str, ...]", names)


def _check_lowering(fn: object, mesh: object, where: str, parameter: str = "fn") -> None:
    check_callable(
        fn, parameter, where, "Pass the function that runs the kernels, then its arguments."
    )
    check_mesh(mesh, where)


# jax.sharding.AbstractDevice (jax 0.10.2 and 0.12) is a dataclass jax leaves
# partly unannotated; typed once here.
_abstract_device = cast("Callable[..., object]", getattr(jax.sharding, "AbstractDevice"))


def _mesh_context(
    mesh: Mesh | AbstractMesh | None,
) -> contextlib.AbstractContextManager[object]:
    if mesh is None:
        return contextlib.nullcontext()
    if isinstance(mesh, AbstractMesh):
        return jax.sharding.use_abstract_mesh(mesh)
    return jax.set_mesh(mesh)


def _exported_stablehlo(
    fn: Callable[..., object], args: tuple[object, ...], mesh: Mesh | AbstractMesh | None
) -> str:
    # jax.export cannot lower a host callback for another platform: a sanitized kernel's
    # flags are left unchecked here (the Mosaic kernel is the same).
    with _mesh_context(mesh), unchecked_on_host():
        jitted = jax.jit(fn)  # pyright: ignore[reportUnknownMemberType]
        exported = jax.export.export(jitted, platforms=["tpu"])(*args)
    return str(exported.mlir_module())


# jaxlib 0.10.2's MLIR bindings leave these constructors' context parameter
# unannotated (0.12's do not): looked up once with a declared type, so pyright
# strict is clean on both without a version-dependent ignore.
_parse_module = cast("Callable[[str | bytes], ir.Module]", getattr(ir.Module, "parse"))
_string_attr_of = cast("Callable[[str], ir.Attribute]", getattr(ir.StringAttr, "get"))


def _walk(op: ir.Operation) -> Iterator[ir.Operation]:
    # Pre-order over nested regions: the order ops appear in the module text.
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield child.operation
                yield from _walk(child.operation)


def _string_attr(op: ir.Operation, name: str) -> str | None:
    attrs = op.attributes
    if name not in attrs:
        return None
    return ir.StringAttr(attrs[name]).value


def _rename_kernel(module: ir.Module, kernel_name: str | None) -> None:
    top = module.operation
    old_names: set[str] = {kernel_name} if kernel_name else set()
    module_name = _string_attr(top, "sym_name")
    if module_name is not None:  # jax >= 0.12 names the module after the kernel
        old_names.add(module_name)
        top.attributes["sym_name"] = _string_attr_of(KERNEL_PLACEHOLDER)
    for child in module.body.operations:
        op = child.operation
        name = _string_attr(op, "sym_name")
        if name is not None and name in old_names:
            op.attributes["sym_name"] = _string_attr_of(KERNEL_PLACEHOLDER)
            ir.SymbolTable.replace_all_symbol_uses(name, KERNEL_PLACEHOLDER, top)


def _kernel_from_custom_call(op: ir.Operation, index: int, normalize_names: bool) -> MosaicKernel:
    kernel_name = _string_attr(op, "kernel_name")
    raw_config = _string_attr(op, "backend_config")
    if raw_config is None:
        raise ValueError(f"{_TARGET} #{index} has no backend_config")
    config = json.loads(raw_config)
    call_config = config.get("custom_call_config")
    if not isinstance(call_config, dict) or "body" not in call_config:
        raise ValueError(
            f"{_TARGET} #{index} ({kernel_name}): backend_config has no "
            "custom_call_config.body; the Mosaic serialisation format changed"
        )
    fields = cast("dict[str, Any]", call_config)  # parsed JSON
    body = base64.b64decode(fields["body"])
    module = _parse_module(body)
    if normalize_names:
        _rename_kernel(module, kernel_name)
    text = module.operation.get_asm(enable_debug_info=False)
    if not isinstance(text, str):
        raise TypeError(f"MLIR printed {type(text).__name__}, expected str")
    kept = dict(config)
    kept["custom_call_config"] = {k: v for k, v in fields.items() if k not in _CONFIG_SKIP}
    aliases = ""
    if "output_operand_aliases" in op.attributes:
        aliases = str(op.attributes["output_operand_aliases"])
    return MosaicKernel(
        index=index,
        name=kernel_name or "<unnamed>",
        module=text,
        config=json.dumps(kept, sort_keys=True, separators=(",", ":")),
        aliases=aliases,
    )


def mosaic_kernels(
    fn: Callable[..., object],
    *args: object,
    mesh: Mesh | AbstractMesh | None = None,
    normalize_names: bool = True,
) -> tuple[MosaicKernel, ...]:
    """Every Mosaic kernel ``jax.jit(fn)(*args)`` lowers to for TPU, in program order.

    ``args`` are usually ``jax.ShapeDtypeStruct`` (with a sharding for
    shard_map'd kernels, see :func:`abstract_mesh`).  ``mesh`` is made the
    current mesh while tracing, for functions that call ``jax.shard_map``
    without ``mesh=``.  Program order is the order the ``tpu_custom_call`` ops
    appear in the exported module.
    """
    _check_lowering(fn, mesh, "safedma.testing.mosaic_kernels()")
    hlo_text = _exported_stablehlo(fn, args, mesh)
    kernels: list[MosaicKernel] = []
    with mosaic_ir_context():
        hlo = _parse_module(hlo_text)
        for op in _walk(hlo.operation):
            if op.name != "stablehlo.custom_call":
                continue
            if _string_attr(op, "call_target_name") != _TARGET:
                continue
            kernels.append(_kernel_from_custom_call(op, len(kernels), normalize_names))
    return tuple(kernels)


def _describe(fn: Callable[..., object]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name) if name else repr(fn)


def _render(
    fn: Callable[..., object],
    kernels: tuple[MosaicKernel, ...],
    normalize_names: bool,
) -> str:
    if not kernels:
        raise ValueError(
            f"{_describe(fn)} lowers to no {_TARGET}: there is no Mosaic kernel to compare"
        )
    count = len(kernels)
    return (
        "\n\n".join(k.render(count=count, normalize_names=normalize_names) for k in kernels) + "\n"
    )


def mosaic_text(
    fn: Callable[..., object],
    *args: object,
    mesh: Mesh | AbstractMesh | None = None,
    normalize_names: bool = True,
) -> str:
    """The Mosaic modules of ``fn`` as one location-free string.

    Kernels are separated by ``// ===== Mosaic kernel i of n: name =====``
    headers followed by their backend config.  With ``normalize_names`` (the
    default) kernel names become :data:`KERNEL_PLACEHOLDER`, so a library
    kernel and a hand-written twin with a different Python name compare
    equal; everything else is kept exactly as the compiler will see it.
    Raises ``ValueError`` if ``fn`` contains no Mosaic kernel, since comparing
    two empty texts would prove nothing.
    """
    _check_lowering(fn, mesh, "safedma.testing.mosaic_text()")
    kernels = mosaic_kernels(fn, *args, mesh=mesh, normalize_names=normalize_names)
    return _render(fn, kernels, normalize_names)


def assert_same_mosaic(
    fn_a: Callable[..., object],
    fn_b: Callable[..., object],
    *args: object,
    mesh: Mesh | AbstractMesh | None = None,
    normalize_names: bool = True,
) -> None:
    """Fail with a unified diff unless both functions lower to the same Mosaic.

    Both are lowered with the same ``args`` and ``mesh`` (see
    :func:`mosaic_text`).  Raises :class:`MosaicMismatchError`, an
    ``AssertionError``, whose diff marks lines of ``fn_a`` with ``-`` and of
    ``fn_b`` with ``+``; both sides are labelled with the function and its
    kernel names.
    """
    _check_lowering(fn_a, mesh, "safedma.testing.assert_same_mosaic()", "fn_a")
    check_callable(fn_b, "fn_b", "safedma.testing.assert_same_mosaic()")
    kernels_a = mosaic_kernels(fn_a, *args, mesh=mesh, normalize_names=normalize_names)
    kernels_b = mosaic_kernels(fn_b, *args, mesh=mesh, normalize_names=normalize_names)
    text_a = _render(fn_a, kernels_a, normalize_names)
    text_b = _render(fn_b, kernels_b, normalize_names)
    if text_a == text_b:
        return

    def label(side: str, fn: Callable[..., object], ks: tuple[MosaicKernel, ...]) -> str:
        return f"{side}={_describe(fn)} [kernels: {', '.join(k.name for k in ks)}]"

    name_a = label("fn_a", fn_a, kernels_a)
    name_b = label("fn_b", fn_b, kernels_b)
    diff = list(
        difflib.unified_diff(
            text_a.splitlines(),
            text_b.splitlines(),
            fromfile=name_a,
            tofile=name_b,
            lineterm="",
        )
    )
    if len(diff) > _MAX_DIFF_LINES:
        hidden = len(diff) - _MAX_DIFF_LINES
        diff = diff[:_MAX_DIFF_LINES] + [f"... ({hidden} more diff lines)"]
    message = f"Mosaic differs between {name_a} (-) and {name_b} (+):\n" + "\n".join(diff)
    raise MosaicMismatchError(message, text_a, text_b)
