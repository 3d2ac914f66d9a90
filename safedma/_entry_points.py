"""The kernel scope: where safedma checks what a body leaves in flight.

:func:`checked` wraps a kernel body so that, each time it is traced, safedma
knows its parameter names (for error messages) and checks, when the body
returns, that every started copy was waited (T7). :func:`pallas_call` is
``pl.pallas_call`` with that wrapper applied and with the compiler parameters
made visible to the body, so that using the barrier semaphore without a
``collective_id`` fails at trace time (T9). :func:`core_kernel` does the
same for ``pl.kernel`` over a mesh of TensorCores.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, Protocol, TypeAlias, TypedDict, TypeVar, cast, overload

from typing_extensions import Unpack

import jax
from jax.experimental import pallas as pl

from safedma import _compat
from safedma._compat import SemaphoreKind
from safedma._arguments import check_callable, shown
from safedma._jax_errors import rewrite
from safedma._describe import is_library_file
from safedma._ledger import ledger_scope, settle_semaphore
from safedma._raw_gpu import check_raw_gpu
from safedma._raw_pairing import check_raw_copies
from safedma._scope import KernelConfig, entry_config, kernel_config, kernel_scope
from safedma._sanitize import Sanitize, for_body, for_call
from safedma._scratch import Scratch, check_scratch_tree, is_scratch
from safedma._scratch_order import check_annotations, check_names
from safedma._public import publish

__all__ = [
    "CoreKernelOptions",
    "KernelCall",
    "PallasCallOptions",
    "checked",
    "core_kernel",
    "pallas_call",
]

P = ParamSpec("P")
_MARK = "__safedma_kernel__"


def _named_arguments(
    signature: inspect.Signature | None, args: tuple[object, ...], kwargs: Mapping[str, object]
) -> dict[str, object]:
    if signature is None:
        return {f"arg{i}": a for i, a in enumerate(args)}
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError:
        return {f"arg{i}": a for i, a in enumerate(args)}
    named: dict[str, object] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL and isinstance(value, tuple):
            positional = cast("tuple[object, ...]", value)
            named.update({f"{name}[{i}]": v for i, v in enumerate(positional)})
        elif kind is inspect.Parameter.VAR_KEYWORD and isinstance(value, dict):
            keywords = cast("dict[object, object]", value)
            named.update({str(k): v for k, v in keywords.items()})
        else:
            named[name] = value
    return _name_leaves(named)


def _name_leaves(named: Mapping[str, object]) -> dict[str, object]:
    """Name the refs inside pytree arguments by their path: a dataclass of semaphores passed
    as one scratch entry gives ``sems.sync``, a tuple of buffers ``bufs[1]``, a dict
    ``refs['k']`` (jax's ``keystr``), so messages name them as the author wrote them."""
    leaves: dict[str, object] = {}
    for name, value in named.items():
        if _compat.is_ref(value):
            leaves[name] = value
            continue
        for path, leaf in _paths_and_leaves(value):
            if _compat.is_ref(leaf):
                leaves[name + path] = leaf
    return leaves


def _paths_and_leaves(tree: object) -> list[tuple[str, object]]:
    """``(path text, leaf)`` for each leaf of ``tree``, refs as leaves (jax leaves the key
    types of ``tree_flatten_with_path`` partly unannotated: typed here once)."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_compat.is_ref)[0]  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    pairs = cast("list[tuple[tuple[object, ...], object]]", flat)
    # jax's keystr(path) is the keys' str() joined: ".sync", "[1]", "['k']".
    return [("".join(map(str, path)), leaf) for path, leaf in pairs]


def _settle_operand_semaphores(args: tuple[object, ...], scratch: int) -> None:
    """Copies on a DMA semaphore the kernel takes or returns as an operand may stay in flight.

    Such a semaphore (``memory_space=pltpu.SEMAPHORE`` in ``in_specs`` / ``out_specs``,
    ``pltpu.SemaphoreType.DMA(())`` in ``out_shape``) outlives the kernel: jax's DMA
    futures start a copy on it in one ``pallas_call`` and wait it in another. T7 is
    checked for the semaphores whose life is the kernel's (scratch, ``run_scoped``).
    ``scratch`` positional arguments at the end are the kernel's scratch.
    """
    operands = args[: len(args) - scratch] if scratch else args
    for leaf in jax.tree_util.tree_leaves(operands, is_leaf=_compat.is_ref):
        if _compat.is_ref(leaf) and _compat.ref_kind(leaf) is SemaphoreKind.DMA:
            settle_semaphore(leaf)


@overload
def checked(body: Callable[P, None], /) -> Callable[P, None]: ...
@overload
def checked(*, sanitize: Sanitize) -> Callable[[Callable[P, None]], Callable[P, None]]: ...
def checked(
    body: Callable[P, None] | None = None, /, *, sanitize: Sanitize = None
) -> Callable[P, None] | Callable[[Callable[P, None]], Callable[P, None]]:
    """Check, each time ``body`` is traced, that it leaves no copy in flight.

    Use it on kernels passed to ``pl.pallas_call``; :func:`pallas_call`
    applies it for you. ``@checked(sanitize=True)`` also sanitizes the body
    wherever :func:`pallas_call` runs it (``sanitize=False``: never, whatever
    ``SAFEDMA_SANITIZE`` says); see docs/sanitizer.md. On a Pallas GPU body
    (``plgpu.kernel``) it checks the raw barriers and TMA stores too (docs/gpu.md).
    """
    if body is not None:
        check_callable(
            body,
            "body",
            "safedma.checked()",
            "Decorate the kernel function (@safedma.checked), or pass options by keyword: "
            "@safedma.checked(sanitize=True).",
        )
        return _checked(body, None)
    mark = for_body(sanitize)

    def decorate(inner: Callable[P, None]) -> Callable[P, None]:
        check_callable(inner, "body", "safedma.checked(sanitize=...)")
        wrapped = _checked(inner, None)
        if mark is not None:
            setattr(wrapped, _SANITIZE_MARK, mark)
        return wrapped

    return decorate


_SANITIZE_MARK = "__safedma_sanitize__"


def _checked(body: Callable[P, None], scratch: int | None) -> Callable[P, None]:
    """:func:`checked`; ``scratch``: how many trailing positional arguments are scratch
    (None: unknown, as under a plain ``pl.pallas_call``: every semaphore is checked)."""
    if getattr(body, _MARK, False):
        return body
    try:
        signature: inspect.Signature | None = inspect.signature(body)
    except (TypeError, ValueError):
        signature = None
    name = _body_name(body)

    @functools.wraps(body)
    def traced(*args: P.args, **kwargs: P.kwargs) -> None:
        _sanitizer_reach(traced)  # before the config of a plain entry point is set
        by_jax = _compat.called_by_jax(getattr(inspect.currentframe(), "f_back", None))
        with (
            _config_of_enclosing_call(),
            kernel_scope(name, named := _named_arguments(signature, args, kwargs)),
            ledger_scope() as ledger,
        ):
            if scratch is not None:
                _settle_operand_semaphores(args, scratch)
            in_scratch = 0
            if ledger.parent is None:  # the kernel's own body, not a checked helper in it
                in_scratch = (
                    _compat.enclosing_scratch_count() if scratch is None else scratch
                ) or 0
            check_annotations(name, body, signature, args, in_scratch)
            try:
                body(*args, **kwargs)
            except ValueError as error:
                check_names(name, body, signature, args, in_scratch, error)
                rewritten = rewrite(error)
                if rewritten is None:
                    raise
                raise rewritten from error
            except Exception as error:
                check_names(name, body, signature, args, in_scratch, error)
                raise
            ledger.check_all_waited(name)
            if ledger.parent is None:  # a nested body's copies are its kernel's
                _check_raw_copies(ledger, name, named, args, scratch)
                _check_raw_gpu(ledger, name, named, whole_body=by_jax)

    # jax names a kernel after its function, looking through functools.partial;
    # a partial has no __name__ for wraps() to copy, so give the wrapper the
    # name jax would have used (the same Mosaic module as pl.pallas_call(partial)).
    traced.__name__ = name
    traced.__qualname__ = getattr(_unwrap_partial(body), "__qualname__", name)
    setattr(traced, _MARK, True)
    return traced


def _check_raw_copies(
    ledger: Any,
    name: str,
    named: Mapping[str, object],
    args: tuple[object, ...],
    scratch: int | None,
) -> None:
    """Pair the raw pltpu copies of the body's jaxpr (safedma/_raw_pairing.py), semaphores
    named by the parameters holding them; those a kernel takes as operands (``scratch``
    known) may outlive it (DMA futures) and are left alone."""
    names: dict[int, str] = {}
    for text, ref in named.items():
        var = _compat.jaxpr_var_of(_compat.root_of(ref))
        if var is not None and id(var) not in names:
            names[id(var)] = text
    operands: object = args
    if scratch is not None:
        operands = args[: len(args) - scratch] if scratch else args
    else:
        # Under a plain pl.pallas_call: the scratch jax handed the body, if found (none
        # found: every parameter is taken for an operand).
        count = _compat.enclosing_scratch_count()
        leaves = jax.tree_util.tree_leaves(args, is_leaf=_compat.is_ref)
        operands = leaves[: len(leaves) - count] if count else leaves
    skip: set[int] = set()
    for leaf in jax.tree_util.tree_leaves(operands, is_leaf=_compat.is_ref):
        if _compat.is_ref(leaf):
            var = _compat.jaxpr_var_of(_compat.root_of(leaf))
            if var is not None:
                skip.add(id(var))
    check_raw_copies(ledger.frame, ledger.begins_at, name, names, skip, is_library_file)


def _check_raw_gpu(
    ledger: Any, name: str, named: Mapping[str, object], *, whole_body: bool
) -> None:
    """The raw plgpu barriers and stores of a GPU kernel body (safedma/_raw_gpu.py), barriers
    named by the parameters holding them."""
    names: dict[int, str] = {}
    for text, ref in named.items():
        var = _compat.jaxpr_var_of(_compat.root_of(ref))
        if var is not None and id(var) not in names:
            names[id(var)] = text
    check_raw_gpu(
        ledger.frame, ledger.begins_at, name, names, is_library_file, whole_body=whole_body
    )


def _sanitizer_reach(body: object) -> None:
    """A body traced by a plain ``pl.pallas_call`` (or ``pl.kernel``) cannot be sanitized:
    an error if it asked for it, a warning under ``SAFEDMA_SANITIZE``."""
    from safedma._sanitize import _call, _options  # noqa: PLC0415 (only on this path)

    if _call.inside_sanitized_call() or entry_config() is not None:
        return  # a safedma entry point decided (sanitized it, or said why not)
    marked = _call.requested_by_body(body)
    if marked is False:
        return
    if marked is not None or _options.requested():
        entry, _ = _compat.enclosing_entry()
        _call.unsanitized_entry(f"pl.{entry or 'pallas_call'}", body, marked is not None)


def _unwrap_partial(body: object) -> object:
    while isinstance(body, functools.partial):
        body = cast("functools.partial[object]", body).func
    return body


def _config_of_enclosing_call() -> contextlib.AbstractContextManager[None]:
    """Under a plain ``pl.pallas_call`` (no safedma entry point around it), the
    configuration read from that call's ``compiler_params``, so the checks that
    need it (T9: a barrier semaphore with no ``collective_id``) run there too; a
    ``pl.pallas_call`` kernel runs on TensorCores (T5, T6: no DMA accumulate, no
    copy without a semaphore)."""
    if entry_config() is not None:
        return contextlib.nullcontext()
    entry, params = _compat.enclosing_entry()
    if params is _compat.NOT_FOUND:
        return contextlib.nullcontext()
    return kernel_config(_config_of(params, tensor_core=entry == "pallas_call"))


def _body_name(body: object) -> str:
    """The name jax gives the kernel: the function's, looking through partials."""
    name = getattr(body, "__name__", None)
    if isinstance(name, str):
        return name
    inner = _unwrap_partial(body)
    name = getattr(inner, "__name__", None)
    return name if isinstance(name, str) else type(inner).__name__


class PallasCallOptions(TypedDict, total=False):
    """The options of ``pl.pallas_call`` safedma passes on, declared once.

    Only the options given are passed on, so jax's own defaults apply to the
    rest; values are jax's (safedma's typed scratch is accepted where jax
    takes scratch shapes).
    """

    grid_spec: object
    grid: int | tuple[int, ...]
    in_specs: object
    out_specs: object
    scratch_shapes: Sequence[object] | Mapping[str, object]
    input_output_aliases: Mapping[int, int]
    compiler_params: object
    interpret: object
    name: str | None
    cost_estimate: object
    debug: bool
    metadata: dict[str, str] | None
    # safedma's own, not passed on: sanitize the kernel (docs/sanitizer.md).
    sanitize: Sanitize


class CoreKernelOptions(TypedDict, total=False):
    """The options of ``pl.kernel`` safedma passes on (besides ``mesh``)."""

    scratch_types: Sequence[object] | Mapping[str, object]
    compiler_params: object
    interpret: object
    cost_estimate: object
    name: str | None
    debug: bool
    metadata: dict[str, str] | None


def _config_of(compiler_params: object, *, tensor_core: bool = False) -> KernelConfig:
    return KernelConfig(
        collective_id=getattr(compiler_params, "collective_id", None), tensor_core=tensor_core
    )


def _with_config(call: Callable[..., Any], config: KernelConfig) -> Callable[..., Any]:
    @functools.wraps(call)
    def run(*args: object) -> Any:
        with kernel_config(config):
            return call(*args)

    return run


# ``out_shape`` as jax takes it: anything with a shape and a dtype (a ShapeDtypeStruct or an
# array), a semaphore returned as an output (``safedma.dma_semaphore()``, which is jax's
# ``pltpu.SemaphoreType.DMA(())``: a DMA future), or a pytree of them. A tuple or a list gives
# a tuple of arrays (jax returns a tuple for a list too); another pytree (a dict, a dataclass,
# nested tuples) gets jax's own ``Any``.
Shaped: TypeAlias = "jax.ShapeDtypeStruct | jax.Array | Scratch[Any]"

R_co = TypeVar("R_co", covariant=True)


class KernelCall(Protocol[R_co]):
    """What :func:`pallas_call` returns: called with the kernel's operands, it returns ``R_co``.

    A protocol rather than ``Callable[..., R]``: when ``out_shape`` is ``Any`` (jax leaves
    ``pltpu.SemaphoreType.DMA(())`` unannotated) mypy joins the overloads' results, and a
    join of ``Callable[..., ...]`` types is an *untyped* callable, whose every call is a
    ``no-untyped-call`` error under ``--strict``; a join of these is ``KernelCall[Any]``.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...


@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: Shaped,
    **options: Unpack[PallasCallOptions],
) -> KernelCall[jax.Array]: ...
# A tuple of two, three or four shapes gives a tuple of as many arrays, so a caller may name
# the result ``tuple[jax.Array, jax.Array]`` (jax's own ``pallas_call`` returns ``Any``, which
# every annotation accepts); longer tuples and lists give ``tuple[jax.Array, ...]``.
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: tuple[Shaped, Shaped],
    **options: Unpack[PallasCallOptions],
) -> KernelCall[tuple[jax.Array, jax.Array]]: ...
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: tuple[Shaped, Shaped, Shaped],
    **options: Unpack[PallasCallOptions],
) -> KernelCall[tuple[jax.Array, jax.Array, jax.Array]]: ...
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: tuple[Shaped, Shaped, Shaped, Shaped],
    **options: Unpack[PallasCallOptions],
) -> KernelCall[tuple[jax.Array, jax.Array, jax.Array, jax.Array]]: ...
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: tuple[Shaped, ...] | list[jax.ShapeDtypeStruct] | list[jax.Array] | list[Shaped],
    **options: Unpack[PallasCallOptions],
) -> KernelCall[tuple[jax.Array, ...]]: ...
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: object,
    **options: Unpack[PallasCallOptions],
) -> KernelCall[Any]: ...
def pallas_call(
    body: Callable[..., None],
    out_shape: object,
    **options: Unpack[PallasCallOptions],
) -> KernelCall[Any]:
    """``pl.pallas_call`` with safedma's kernel-scope checks.

    Takes the same arguments; only those given are passed on, so jax's own
    defaults apply to the rest. The result is called like pl.pallas_call's.
    """
    check_callable(body, "body", "safedma.pallas_call()", _BODY_FIX)
    _check_out_shape(out_shape)
    if "scratch_shapes" in options:
        check_scratch_tree(options["scratch_shapes"], "scratch_shapes", "safedma.pallas_call()")
    # pl.pallas_call on a TPU is a TensorCore kernel (SparseCore takes pl.kernel's meshes).
    config = _config_of(options.get("compiler_params"), tensor_core=True)
    scratch = options.get("scratch_shapes")
    if scratch is None:
        scratch = getattr(options.get("grid_spec"), "scratch_shapes", None)
    given = cast("dict[str, Any]", options)
    sanitize = for_call(given.pop("sanitize", None), body)
    checked_body = _checked(body, _positional_count(scratch))
    if sanitize is not None:
        from safedma._sanitize._call import sanitized_pallas_call  # noqa: PLC0415

        call = sanitized_pallas_call(
            checked_body, body, out_shape, given, sanitize, _positional_count(scratch)
        )
        return _with_config(call, config)
    call = pl.pallas_call(checked_body, out_shape=out_shape, **given)
    return _with_config(call, config)


def _positional_count(scratch: object) -> int:
    """How many positional kernel arguments ``scratch`` adds (a mapping adds keywords)."""
    if scratch is None or isinstance(scratch, Mapping):
        return 0
    return len(cast("Sequence[object]", scratch))


def core_kernel(
    body: Callable[..., None] | Sequence[Callable[..., None]],
    out_type: object,
    *,
    mesh: object,
    **options: Unpack[CoreKernelOptions],
) -> Callable[..., Any]:
    """``pl.kernel`` over a mesh of TensorCores, with the checks of :func:`pallas_call`.

    ``mesh`` is ``pltpu.TensorCoreMesh(axis_name="core", num_cores=n)`` (jax
    0.12; ``pltpu.create_tensorcore_mesh("core", num_cores=n)`` on 0.10.2).
    Inside ``body``, the core axis is a mesh axis like any other:
    ``safedma.my_index("core")``, ``safedma.device(core=j)`` and
    ``safedma.neighbour("core")`` name cores. ``body`` receives the inputs,
    the outputs, then the ``scratch_types``, as with ``pl.kernel``. Named
    ``core_kernel`` so it cannot be mistaken for jax's ``pl.kernel``.

    A list of bodies with a list of meshes (jax 0.12's MPMD ``pl.kernel``: a SparseCore
    scalar-subcore body next to a vector-subcore one, signalling each other) checks each
    body as a kernel of its own.
    """
    bodies = _mpmd_bodies(body)  # before `body` is narrowed below; None for one body
    meshes = cast("Sequence[object]", mesh) if isinstance(mesh, (list, tuple)) else [mesh]
    bodies_given = cast("Sequence[object]", body) if isinstance(body, (list, tuple)) else [body]
    for k, one in enumerate(bodies_given):
        check_callable(
            one,
            "body" if len(bodies_given) == 1 and one is body else f"body[{k}]",
            "safedma.core_kernel()",
            _BODY_FIX,
        )
    if not meshes:
        raise ValueError(
            "safedma.core_kernel(): mesh must name at least one mesh, got an empty list."
        )
    for k, one in enumerate(meshes):
        _check_mesh(one, "mesh" if one is mesh else f"mesh[{k}]")
    if isinstance(body, (list, tuple)) != isinstance(mesh, (list, tuple)) or (
        isinstance(body, (list, tuple)) and len(bodies_given) != len(meshes)
    ):
        raise ValueError(
            f"safedma.core_kernel(): an MPMD kernel takes one body per mesh, got "
            f"{len(bodies_given)} bod{'y' if len(bodies_given) == 1 else 'ies'} and "
            f"{len(meshes)} mesh{'' if len(meshes) == 1 else 'es'}. Pass one body with one "
            "mesh, or a list of bodies with a list of as many meshes."
        )
    if "scratch_types" in options:
        check_scratch_tree(options["scratch_types"], "scratch_types", "safedma.core_kernel()")
    tensor_core = all(_compat.is_tensor_core_mesh(one) for one in meshes)
    config = _config_of(options.get("compiler_params"), tensor_core=tensor_core)
    given = cast("dict[str, Any]", options)
    scratch = _positional_count(options.get("scratch_types"))
    checked_body: object
    if bodies is None:
        single = cast("Callable[..., None]", body)
        _core_kernel_unsanitized(single)
        checked_body = _checked(single, scratch)
    else:
        for one in bodies:
            _core_kernel_unsanitized(one)
        checked_body = [_checked(one, scratch) for one in bodies]
    call = _pl_kernel(checked_body, out_type, mesh=mesh, **given)
    return _with_config(call, config)


_BODY_FIX = "Pass the kernel function itself (def kernel(x_ref, o_ref): ...), not a call of it."


def _check_out_shape(out_shape: object) -> None:
    """Each leaf of ``out_shape`` gives an output's shape and dtype (a ShapeDtypeStruct, an
    array) or is a semaphore declaration (a DMA future), not a number or a string."""
    leaves = jax.tree_util.tree_leaves(out_shape, is_leaf=is_scratch)
    if out_shape is None:
        raise TypeError(
            f"safedma.pallas_call(): out_shape must give the outputs, such as "
            f"jax.ShapeDtypeStruct((8, 128), jnp.float32) or a tuple of them, got "
            f"{shown(out_shape)}."
        )
    for leaf in leaves:
        # jax also takes types registered with it (hijax), so only plain values are refused.
        if not isinstance(leaf, (int, float, complex, str, bytes)):
            continue
        raise TypeError(
            f"safedma.pallas_call(): out_shape must give each output's shape and dtype "
            f"(jax.ShapeDtypeStruct(shape, dtype), or an array like it), got {shown(leaf)}"
            f"{'' if leaf is out_shape else f' in {shown(out_shape)}'}."
        )


def _check_mesh(mesh: object, parameter: str) -> None:
    """A ``pl.kernel`` mesh has a ``shape`` of axis sizes and a core type (jax's Mesh
    protocol): what ``pltpu.TensorCoreMesh`` and the SparseCore meshes are."""
    if mesh is None or not hasattr(mesh, "shape") or not hasattr(mesh, "discharges_effect"):
        raise TypeError(
            f"safedma.core_kernel(): {parameter} must be a Pallas core mesh such as "
            "pltpu.TensorCoreMesh(axis_name='core', num_cores=2) (jax 0.12; "
            "pltpu.create_tensorcore_mesh('core', num_cores=2) on 0.10.2), got "
            f"{shown(mesh)}."
        )


def _core_kernel_unsanitized(body: object) -> None:
    """``core_kernel`` runs no sanitizer (its meshes of cores have no per-call output to
    report through): an error for a body that asked for it, a warning under the switch."""
    from safedma._sanitize import _call, _options  # noqa: PLC0415 (only on this path)

    marked = _call.requested_by_body(body)
    if marked is False:
        return
    if marked is not None or _options.requested():
        _call.unsanitized_entry("safedma.core_kernel", body, marked is not None)


def _mpmd_bodies(body: object) -> list[Callable[..., None]] | None:
    """The bodies of an MPMD kernel (a list or tuple, one per mesh); None for one body."""
    if not isinstance(body, (list, tuple)):
        return None
    return [cast("Callable[..., None]", one) for one in cast("Sequence[object]", body)]


# pl.kernel's mesh parameter is typed with jax's private Mesh class (the public
# TensorCoreMesh is 0.12-only); safedma passes the caller's mesh through as is.
_pl_kernel: Callable[..., Callable[..., Any]] = pl.kernel  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


publish(globals(), __name__)  # public classes print as safedma.X
