"""The typed API's and the trace checks' seam: every jax version difference and every
jax internal they use, in one place, each private name with a comment saying why.

safedma supports jax 0.10.2 through 0.12.x. The public pltpu calls it lowers
to have the same spelling across that range as long as the deprecated
``device_id_type`` argument is never passed (0.12 warns on it; the default is
the mesh form in both) and the ``pltpu.semaphore_*`` aliases removed in 0.12
are avoided (``pl.semaphore_*`` exists in both). What cannot be done through
public APIs -- recognising a ref and its semaphore kind, reading the mesh axes
and the kernel entry in scope, the traces of control flow, the equations of a body
being traced -- is done here, and only the reading: what is built on it lives with
the check that uses it (the raw-wait analysis in ``_raw_waits.py``, beside the ledger).
``tests/core/test_compat.py`` fails loudly if a jax release moves any of it, and checks
that no other module of the typed API imports ``jax._src``.

The testing helpers have seams of their own: simulate's
``safedma/testing/_interpret_probes.py``, verify's
``safedma/testing/_verify/jax_internals.py``, the Mosaic and compile-only builds'
``safedma/testing/_mosaic.py`` (``_compile.py`` uses public jax only).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import operator
import re
import warnings
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, SupportsIndex, TypeAlias, cast

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._private_jax import PrivateModule, missing_private_name, optional_name

# The private jax modules this seam reads. Type checkers see jax's own modules; at run
# time each is a PrivateModule, imported on its first use: importing this module reads no
# private name, and a name a jax release removed fails where it is used, as
# PrivateJaxApiError naming it (each use below says why it has no public spelling).
if TYPE_CHECKING:
    from jax._src import core as _jax_core
    from jax._src.pallas import core as _pallas_core
    from jax._src.pallas import primitives as _pallas_primitives
    from jax._src.pallas.mosaic import core as _mosaic_core
    from jax._src.pallas.mosaic import lowering as _mosaic_lowering
    from jax._src.pallas.mosaic import primitives as _mosaic_primitives
    from jax._src.pallas.mosaic import sc_lowering as _sc_lowering
    from jax._src import indexing as _indexing
    from jax._src import source_info_util as _source_info
    from jax._src.state import indexing as _state_indexing
    from jax._src.state import types as _state_types
    from jax._src import config as _config
else:
    _jax_core = PrivateModule("jax._src.core")
    _pallas_core = PrivateModule("jax._src.pallas.core")
    _pallas_primitives = PrivateModule("jax._src.pallas.primitives")
    _mosaic_core = PrivateModule("jax._src.pallas.mosaic.core")
    _mosaic_lowering = PrivateModule("jax._src.pallas.mosaic.lowering")
    _mosaic_primitives = PrivateModule("jax._src.pallas.mosaic.primitives")
    _sc_lowering = PrivateModule("jax._src.pallas.mosaic.sc_lowering")
    _indexing = PrivateModule("jax._src.indexing")
    _source_info = PrivateModule("jax._src.source_info_util")
    _state_indexing = PrivateModule("jax._src.state.indexing")
    _state_types = PrivateModule("jax._src.state.types")
    _config = PrivateModule("jax._src.config")

__all__ = [
    "jax_version",
    "SemaphoreKind",
    "ref_kind",
    "is_ref",
    "root_of",
    "static_int",
    "view_selections",
    "axes_in_scope",
    "ArrayAval",
    "AsyncCopyDescriptor",
    "RefAval",
    "FlowKind",
    "current_frame",
    "indexes_by_array",
    "is_tensor_core_mesh",
    "traced_so_far",
    "traced_eqns",
    "operand_tracers",
    "trace_of",
    "jaxpr_var_of",
    "is_jaxpr",
    "sub_jaxprs",
    "emitted_from",
    "is_semaphore_var",
    "view_base",
    "pipeline_body_consts",
    "same_ref_type",
    "frame_parent",
    "frame_kind",
    "static_positions",
    "barrier_tags_supported",
    "waits_compare_shapes",
    "auto_collective_ids",
    "NOT_FOUND",
    "enclosing_entry",
    "enclosing_pallas_call_params",
    "make_local_descriptor",
    "make_remote_descriptor",
    "semaphore_signal",
    "semaphore_wait",
    "semaphore_read",
    "barrier_semaphore",
    "interpret_mode",
    "chip_generation",
    "compiled_for_chip",
    "eqn_record",
    "recorded_eqns",
    "grid_size",
    "scan_layout",
    "view_index_axes",
    "traced_for",
    "frame_inputs",
    "indexer_scalars",
    "called_by_jax",
]


# The public jax API safedma lowers to, present from jax 0.10.2 on: a jax without one of
# these is older than the supported range. Probed by name rather than by version number,
# so that a jax between or after the tested ones is judged by what it has.
_NEEDED = (
    (jax, "jax", "shard_map"),
    (pl, "pl", "semaphore_signal"),
    (pl, "pl", "semaphore_wait"),
    (pl, "pl", "semaphore_read"),
    (pl, "pl", "kernel"),
    (pltpu, "pltpu", "make_async_copy"),
    (pltpu, "pltpu", "make_async_remote_copy"),
    (pltpu, "pltpu", "get_barrier_semaphore"),
    (pltpu, "pltpu", "SemaphoreType"),
)
_absent = [f"{alias}.{name}" for module, alias, name in _NEEDED if not hasattr(module, name)]
if _absent:
    raise ImportError(
        f"safedma supports jax 0.10.2 to 0.12.x; jax {jax.__version__} is installed and "
        f"has no {', '.join(_absent)}. Install a supported version, e.g. "
        "pip install 'jax[tpu]>=0.10.2,<0.13'."
    )


def jax_version() -> str:
    """The installed jax's version, for messages only: behaviour is decided by probing
    jax's features, never by comparing version numbers."""
    return str(jax.__version__)


class SemaphoreKind(enum.Enum):
    """What a ref holds, as far as DMA code cares."""

    DATA = "data ref"
    DMA = "DMA semaphore"
    REGULAR = "REGULAR semaphore"
    BARRIER = "BARRIER semaphore"


def _semaphore_dtypes() -> tuple[Any, Any, Any]:
    """The DMA, REGULAR and BARRIER semaphore dtypes."""
    # Private: the semaphore dtypes a ref's dtype is compared with; pltpu.SemaphoreType
    # builds scratch of them but exposes no dtype (jax 0.10.2 to 0.12 alike).
    return (
        _mosaic_core.dma_semaphore,
        _pallas_core.semaphore,
        _pallas_core.barrier_semaphore,
    )


def is_ref(value: object) -> bool:
    """True for a Pallas ref (a kernel argument, scratch, or a ``.at[...]`` view)."""
    # Private: TransformedRef (a view) and AbstractRef (a ref's aval) have no public
    # name in jax 0.10.2; isinstance on them is the one sure test.
    if isinstance(value, _state_types.TransformedRef):
        return True
    return isinstance(getattr(value, "aval", None), _state_types.AbstractRef)


def ref_kind(ref: object) -> SemaphoreKind:
    """The kind of a ref, from its dtype; call only on values for which is_ref holds.

    A view (``ref.at[...]``) has its root's kind, and reading the root's dtype
    avoids computing the view's type. Kinds are cached per dtype: this runs
    for every ref of every copy.
    """
    dtype = getattr(root_of(ref), "dtype", None)
    if dtype is None:
        return SemaphoreKind.DATA
    try:
        return _kind_by_dtype[dtype]
    except KeyError:
        kind = _kind_of_dtype(dtype)
        _kind_by_dtype[dtype] = kind
        return kind
    except TypeError:  # an unhashable dtype-like
        return _kind_of_dtype(dtype)


_kind_by_dtype: dict[object, SemaphoreKind] = {}


def _kind_of_dtype(dtype: Any) -> SemaphoreKind:
    dma, regular, barrier = _semaphore_dtypes()
    try:
        if jnp.issubdtype(dtype, dma):
            return SemaphoreKind.DMA
        if jnp.issubdtype(dtype, barrier):
            return SemaphoreKind.BARRIER
        if jnp.issubdtype(dtype, regular):
            return SemaphoreKind.REGULAR
    except TypeError:
        return SemaphoreKind.DATA
    return SemaphoreKind.DATA


def root_of(ref: object) -> object:
    """The underlying kernel ref of a ``.at[...]`` view (the view itself otherwise).

    ``pl.select_ref`` makes a view over a tuple of candidates; its root is the
    first candidate's (candidates are checked to be of one kind and layout).
    """
    # Private: a TransformedRef keeps the ref it views as ``.ref`` (see is_ref).
    if isinstance(ref, _state_types.TransformedRef):
        inner = cast(object, ref.ref)
        if isinstance(inner, tuple):
            candidates = cast("tuple[object, ...]", inner)
            return root_of(candidates[0]) if candidates else candidates
        return inner
    return ref


# Its candidates are unannotated in jax; typed here.
_select_ref = cast("Callable[..., object]", getattr(pl, "select_ref"))


def select_ref(index: object, candidates: tuple[object, ...]) -> object:
    return _select_ref(index, *candidates)


def ref_layout(ref: object) -> tuple[tuple[object, ...], object]:
    """``(shape, dtype)`` of a ref or view, as ``ref.shape`` and ``ref.dtype`` give them.

    For the common view, one ``.at[...]`` index of a kernel ref, the shape
    comes from the indexer and the dtype from the root ref: asking the view
    itself computes its whole abstract type, which was the largest part of
    safedma's trace-time cost per copy. ``tests/core/test_compat.py`` checks the
    two agree.
    """
    # Private: a view's transforms; NDIndexer and Slice are how jax records ``.at[...]``
    # (jax 0.10.2 and 0.12 alike), and reading them is what makes this fast.
    if isinstance(ref, _state_types.TransformedRef):
        transforms = ref.transforms
        if len(transforms) == 1 and isinstance(transforms[0], _state_indexing.NDIndexer):
            indexer = transforms[0]
            if indexer.int_indexer_shape == ():  # integer indices drop their dimension
                slices = (i for i in indexer.indices if isinstance(i, _indexing.Slice))
                return tuple(i.size for i in slices), ref.ref.dtype
            return tuple(indexer.get_indexer_shape()), ref.ref.dtype
    return tuple(getattr(ref, "shape", ())), getattr(ref, "dtype", None)


def is_static_size(size: object) -> bool:
    """Whether a copy dimension's size is part of the Mosaic memref type (a Python or
    numpy int), as jax decides it (``Slice.is_dynamic_size``: ``not core.is_dim(size)``).

    Any jax value is a dynamic (``?``) dimension, even a constant one (``jnp.int32(8)``
    traced in a kernel), and Mosaic's DMA verifier rejects a static dimension opposite a
    dynamic one ("DMA source and target shape mismatch"), whatever the run-time value.
    """
    # Private: core.is_dim is the rule jax's own Slice applies (see above).
    return not isinstance(size, bool) and bool(_jax_core.is_dim(size))


def waits_compare_shapes() -> bool:
    """Whether Mosaic verifies a DMA *wait*'s source and target shapes as it does a
    start's (a size fixed while tracing opposite a traced one is rejected).

    jax 0.10.2 lowers a wait to ``tpu.wait_dma2``, whose verifier does not compare them;
    0.12 lowers it to ``tpu.wait_dma`` (the start's operands), whose verifier does
    ("DMA source and target shape mismatch"); 0.11.2 still lowers to ``tpu.wait_dma2``.
    Probed in jax's own wait lowering rather than by version number, so that a jax
    between or after these is judged by what it emits.
    tests/core/test_traced_sizes.py pins this against the raw
    lowering."""
    return _wait_lowers_to_wait_dma()


@functools.cache
def _wait_lowers_to_wait_dma() -> bool:
    # Private: the TensorCore lowering rule of the dma_wait primitive (its table and the
    # primitive have no public name); the Mosaic op it builds is read off the names its
    # code (and its nested functions) use: ``wait_dma`` from 0.12, ``wait_dma2`` before.
    rules: Any = getattr(_mosaic_lowering, "lowering_rules")  # unannotated in jax
    try:
        rule: Any = rules[_mosaic_core.CoreType.TC][_mosaic_primitives.dma_wait_p]
        code: Any = inspect.unwrap(rule).__code__
    except (AttributeError, KeyError, TypeError) as err:
        raise missing_private_name(
            "jax._src.pallas.mosaic.lowering.lowering_rules[TC][dma_wait_p]", err
        ) from err
    return "wait_dma" in _code_names(code)


def _code_names(code: Any) -> set[str]:
    names: set[str] = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def static_int(value: object) -> int | None:
    """The value of an index known while tracing (a Python int, or a literal jax
    turned into a constant tracer), else None.

    ``ref.at[5]`` stores 5 as a constant tracer; ``get_const()`` (jax 0.10.2 and
    0.12) gives it back. A traced index (``pl.program_id``, SMEM reads) has none.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    # Private: a tracer's get_const(), the one record of the literal it stands for.
    get_const = getattr(value, "get_const", None)
    if get_const is None:
        if getattr(value, "shape", None) == () and hasattr(value, "__index__"):
            try:
                return operator.index(cast(SupportsIndex, value))  # numpy integer scalars
            except TypeError:
                return None
        return None
    try:
        const = get_const()
    except Exception:  # a tracer kind without a constant
        return None
    if const is None or getattr(const, "shape", ()) != ():
        return None
    try:
        return int(const)
    except (TypeError, ValueError):
        return None


def view_selections(ref: object) -> tuple[tuple[int, ...], list[tuple[int, object, int]]]:
    """The root's shape and, for each position index of a ``.at[...]`` view, in
    order, ``(dimension, index, size of that dimension)``.

    Slices narrow a dimension; positions drop it. Views made by anything other
    than indexing (reshape, bitcast) end the walk: their later indices are not
    reported.
    """
    root = root_of(ref)
    shape = tuple(int(d) for d in getattr(root, "shape", ()))
    # Private: NDIndexer and Slice, the record of each ``.at[...]`` (see ref_layout).
    if not isinstance(ref, _state_types.TransformedRef):
        return shape, []
    positions: list[tuple[int, object, int]] = []
    current = list(shape)
    for transform in ref.transforms:
        if not isinstance(transform, _state_indexing.NDIndexer):
            break
        if transform.int_indexer_shape != ():  # array indices: not a plain selection
            break
        narrowed: list[int] = []
        for dim, (index, size) in enumerate(zip(transform.indices, current)):
            if isinstance(index, _indexing.Slice):
                narrowed.append(int(index.size))
                start = static_int(index.start)
                if start is not None:
                    positions.append((dim, (start, int(index.size)), size))
            else:
                positions.append((dim, index, size))
        current = narrowed
    return shape, positions


def axes_in_scope() -> Mapping[str, int]:
    """The named mesh axes in scope (from ``shard_map``), in mesh order, with sizes."""
    # Private: the axis environment is the only record of the shard_map axes in scope
    # while a body is traced (jax.lax.axis_size needs a name); unannotated in jax.
    get_axis_env: Callable[[], Any] = _jax_core.get_axis_env
    sizes = get_axis_env().axis_sizes
    return {str(name): int(size) for name, size in sizes.items()}


# Control flow. safedma's kernel-scope checks run while Python traces the
# body, so they see both branches of a lax.cond and one iteration of a loop.
# jax traces each branch, loop body and run_scoped body into a jaxpr of its
# own: the current trace object (core.trace_ctx.trace, a DynamicJaxprTrace)
# changes on entry, links to the enclosing one (parent_trace), and records
# what it is tracing for (frame.debug_info.traced_for: "cond", "fori_loop",
# ...). No public API exposes this; tests/core/test_control_flow.py pins it
# on both supported jax versions.


class FlowKind(enum.Enum):
    """What a traced block of the kernel body is, as far as DMA bookkeeping cares."""

    BRANCH = "branch"  # runs on some paths only: lax.cond / switch / pl.when
    LOOP = "loop"  # runs any number of times: fori_loop, while_loop, scan
    ONCE = "once"  # runs exactly once where it appears: run_scoped
    OTHER = "other"  # anything else (the kernel body itself, jax internals)


_KINDS = {
    "cond": FlowKind.BRANCH,
    "switch": FlowKind.BRANCH,
    "fori_loop": FlowKind.LOOP,
    "while_body": FlowKind.LOOP,
    "while_cond": FlowKind.LOOP,
    "scan": FlowKind.LOOP,
    "pallas run_scoped": FlowKind.ONCE,
}


def current_frame() -> object:
    """The jax trace the current code is being traced into (its identity is the block)."""
    # Private: core.trace_ctx (see the note above); unannotated in jax.
    context: Any = _jax_core.trace_ctx
    return context.trace


def frame_parent(frame: object) -> object | None:
    """The trace enclosing ``frame`` (None at the top)."""
    # Private: a trace's ``parent_trace`` (see the note above).
    parent: object | None = getattr(frame, "parent_trace", None)
    return parent


def frame_kind(frame: object) -> FlowKind:
    """Whether ``frame`` is a branch, a loop body, a run-once body or something else."""
    # Private: ``frame.debug_info.traced_for`` (see the note above).
    debug_info = getattr(getattr(frame, "frame", None), "debug_info", None)
    return _KINDS.get(str(getattr(debug_info, "traced_for", "")), FlowKind.OTHER)


# Kernel bodies as jax traces them, for the raw-wait analysis (safedma/_raw_waits.py):
# the equations traced so far into a trace's frame, the tracers they hold, the trace
# that made a tracer and its jaxpr variable, the closed jaxprs in an equation's params,
# and who emitted an equation. No public API exposes any of it while a body is being
# traced; tests/core/test_raw_waits.py and tests/core/test_compat.py pin it on both
# supported jax versions.


def traced_eqns(frame: object, since: int = 0) -> list[Any]:
    """The equations traced into ``frame`` so far, from its ``since``-th on (those only
    a dead weak reference is left of are skipped)."""
    # Private: a DynamicJaxprTrace's ``frame.tracing_eqns`` holds the equations (or weak
    # references to them) as they are traced, jax 0.10.2 and 0.12 alike.
    entries: list[object] = list(getattr(getattr(frame, "frame", None), "tracing_eqns", ()))
    found: list[Any] = []
    for entry in entries[since:]:
        if isinstance(entry, weakref.ReferenceType):
            entry = cast("weakref.ReferenceType[object]", entry)()
        if entry is not None:
            found.append(entry)
    return found


def traced_so_far(frame: object) -> int:
    """How many equations have been traced into ``frame``: where a body nested in
    enclosing code (an ``emit_pipeline`` body) begins in its frame."""
    # Private: the frame's ``tracing_eqns`` (see traced_eqns), jax 0.10.2 and 0.12 alike.
    return len(getattr(getattr(frame, "frame", None), "tracing_eqns", ()))


def operand_tracers(eqn: Any) -> list[object]:
    """The tracers a traced (not yet finished) equation takes, one per operand."""
    # Private: an equation being traced holds its operands as ``in_tracers`` (its
    # ``invars`` are only made when the trace ends), jax 0.10.2 and 0.12 alike.
    return list(getattr(eqn, "in_tracers", ()))


def trace_of(value: object) -> object | None:
    """The trace that made tracer ``value`` (None for a value that is no tracer)."""
    # Private: a tracer's ``_trace`` is the only record of the trace that made it (jax
    # 0.10.2 and 0.12 alike).
    return getattr(value, "_trace", None)


def jaxpr_var_of(tracer: object) -> object | None:
    """The jaxpr variable a tracer of a trace being recorded stands for (None if none)."""
    # Private: a DynamicJaxprTracer's ``val`` is its variable in the jaxpr being built
    # (jax 0.10.2 and 0.12 alike); it is how an operand of a block is found again inside
    # the block's jaxpr.
    return getattr(tracer, "val", None)


def is_jaxpr(value: object) -> bool:
    """Whether ``value`` is an open jaxpr (a ``ClosedJaxpr``'s ``.jaxpr``)."""
    # Private: the Jaxpr class has no public home in jax 0.10.2 (jax.extend.core has it
    # from 0.12).
    return isinstance(value, _jax_core.Jaxpr)


def sub_jaxprs(params: Mapping[str, Any]) -> Generator[Any, None, None]:
    """The open jaxprs among an equation's params (branches, bodies, called jaxprs)."""
    for value in params.values():
        items = cast("Sequence[object]", value) if isinstance(value, Sequence) else (value,)
        for item in items:
            jaxpr = getattr(item, "jaxpr", item)
            if is_jaxpr(jaxpr):
                yield jaxpr


def emitted_from(eqn: Any, is_own_file: Callable[[str], bool]) -> bool:
    """Whether the innermost frame outside jax that traced ``eqn`` is in an own file."""
    # Private: an equation's ``source_info.traceback`` and source_info_util.user_frame,
    # the frame jax itself names in errors (jax 0.10.2 and 0.12 alike).
    traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
    frame = _source_info.user_frame(traceback) if traceback is not None else None
    return frame is not None and is_own_file(str(frame.file_name))


def is_semaphore_var(var: object) -> bool:
    """Whether a jaxpr variable is a semaphore ref (a ``dma_wait``'s semaphore operand)."""
    # Private: AbstractRef, the aval of a ref, has no public name in jax 0.10.2.
    aval = getattr(var, "aval", None)
    if not isinstance(aval, _state_types.AbstractRef):
        return False
    dtype = getattr(aval, "dtype", None) or getattr(
        getattr(aval, "inner_aval", None), "dtype", None
    )
    return dtype is not None and _kind_of_dtype(dtype) is not SemaphoreKind.DATA


def view_base(value: object) -> object:
    """The variable under a view of it in a jaxpr (``sems.at[i]`` is a TransformedRef)."""
    # Private: TransformedRef (see root_of).
    while isinstance(value, _state_types.TransformedRef):
        value = value.ref
    return value


def pipeline_body_consts(params: Mapping[str, Any], n: int) -> list[int] | None:
    """The operand positions of an ``emit_pipeline`` equation's body constants (the refs
    the body closes over, its jaxpr's constvars in order), or None if not found.

    With ``jax_use_emit_pipeline_primitive`` the body is traced to a jaxpr of its own and
    the pipeline is one equation. jax 0.10.2 binds ``(*index-map consts, *grid bounds,
    *offsets, *body consts, *refs)`` with ``body_consts_len`` and ``args_tree`` the refs';
    jax 0.12 binds one flattened ``EmitPipelinePrimitiveArgs`` whose ``body_consts``
    field, unflattened from ``args_tree``, gives the positions. Private in both (the
    params of a private primitive); tests/core/test_false_alarms_s10.py pins it on both
    versions."""
    tree = params.get("args_tree")
    if tree is None:
        return None
    try:
        if "body_consts_len" in params:
            count, refs = int(params["body_consts_len"]), int(tree.num_leaves)
            return list(range(n - refs - count, n - refs))
        args = tree.unflatten(list(range(n)))
        positions = getattr(args, "body_consts", None)
        return None if positions is None else [int(k) for k in positions]
    except (AttributeError, TypeError, ValueError):
        return None


def same_ref_type(a: object, b: object) -> bool:
    """Whether two refs have one type (shape, dtype or semaphore kind, memory space)."""
    return str(getattr(a, "aval", a)) == str(getattr(b, "aval", b))


def _static_int(value: object) -> int | None:
    # Python ints become constant tracers inside a kernel; their value is kept.
    # Private: the Tracer class and its get_const() (jax 0.10.2 and 0.12 alike).
    if isinstance(value, _jax_core.Tracer):
        get_const: Callable[[], object] | None = getattr(value, "get_const", None)  # pyright: ignore[reportUnknownArgumentType]
        value = get_const() if get_const is not None else None
        if value is None:
            return None
    try:
        return operator.index(cast(Any, value))  # ints and int-like arrays; others raise
    except (TypeError, ValueError):
        return None


def _indexers(ref: object) -> list[Any] | None:
    """The ``.at[...]`` indexers of a view, outermost first; None if it has other transforms."""
    # Private: NDIndexer (see ref_layout).
    transforms: tuple[Any, ...] = tuple(getattr(ref, "transforms", ()))
    if not all(isinstance(t, _state_indexing.NDIndexer) for t in transforms):
        return None
    return list(transforms)


def _static_index(item: Any) -> int | slice | None:
    # Private: Slice, an indexer's record of a ``pl.ds`` (see ref_layout).
    if isinstance(item, _indexing.Slice):
        start, size = _static_int(item.start), _static_int(item.size)
        if start is None or size is None:
            return None
        return slice(start, start + size * item.stride, item.stride)
    return _static_int(item)


def indexes_by_array(ref: object) -> bool:
    """Whether a view picks its rows by an array of indices (``buf.at[indices]``, an index
    ref or a vector): an indirect (gather or scatter) DMA operand, which only SparseCore
    lowers. A slice or a scalar index picks a contiguous window."""
    # Private: a view's NDIndexer knows its array indices (``int_indexer_shape``); jax's
    # SparseCore lowering tells an indirect DMA by them (0.10.2 and 0.12 alike).
    if not isinstance(ref, _state_types.TransformedRef):
        return False
    return any(
        isinstance(transform, _state_indexing.NDIndexer) and transform.int_indexer_shape != ()
        for transform in ref.transforms
    )


# SparseCore push streams. jax 0.12's SparseCore lowering (sc_lowering._is_push_stream)
# treats a local copy from VMEM to any other memory, or from VMEM_SHARED to SMEM, as a
# push stream: the hardware tracks it without a destination semaphore, jax warns when one
# is given ("pass sem=None") and lowers sem=None; jax 0.10.2 has no such copies.


@functools.cache
def push_streams_supported() -> bool:
    """Whether jax's SparseCore lowering knows push streams (jax 0.12 does; 0.10.2 and
    0.11.2 do not): probed by the rule itself, not by the version number."""
    # Private: sc_lowering._is_push_stream is jax's rule (see above); its absence means a
    # jax without push streams, not a moved name, so it answers False rather than raising.
    return _has_private(_sc_lowering, "_is_push_stream")


def memory_space_of(ref: object) -> object:
    """The memory space of a ref or view (its root's), None when jax leaves it unset."""
    return getattr(getattr(root_of(ref), "aval", None), "memory_space", None)


@functools.cache
def _memory_spaces() -> tuple[tuple[object, object], object, object]:
    """``((VMEM, DEFAULT), VMEM_SHARED, SMEM)``: read on first use, not at import, since
    a jax without one of them (``pl.MemorySpace`` was renamed before) must still import
    safedma; pl.MemorySpace.DEFAULT is VMEM on a SparseCore vector subcore, as jax maps it."""
    try:
        tpu_spaces: Any = pltpu.MemorySpace
        spaces: Any = pl.MemorySpace
        return (tpu_spaces.VMEM, spaces.DEFAULT), tpu_spaces.VMEM_SHARED, tpu_spaces.SMEM
    except AttributeError as err:
        raise missing_private_name("the memory spaces pltpu.MemorySpace", err) from err


def is_push_stream(src: object, dst: object) -> bool:
    """Whether a local copy ``src -> dst`` is a SparseCore push stream by jax 0.12's rule
    (memory spaces only: jax asks the kernel's core type too, which a trace cannot see)."""
    vmem_spaces, vmem_shared, smem = _memory_spaces()
    src_space, dst_space = memory_space_of(src), memory_space_of(dst)
    if src_space in vmem_spaces:
        return dst_space not in vmem_spaces
    return src_space is vmem_shared and dst_space is smem


def is_tensor_core_mesh(mesh: object) -> bool:
    """Whether ``mesh`` (given to ``pl.kernel``) is a mesh of TensorCores."""
    # Private: TensorCoreMesh is public only from 0.12 (pltpu.TensorCoreMesh); on 0.10.2
    # pltpu.create_tensorcore_mesh returns the same private class.
    return isinstance(mesh, _mosaic_core.TensorCoreMesh)


def static_positions(ref: object) -> frozenset[int] | None:
    """The flat positions of its root array a view covers, or None if any index is traced.

    ``sems.at[1]`` of a 4-semaphore array covers {1}; ``sems.at[pl.ds(2, 2)].at[1]``
    covers {3}; ``sems.at[i]`` with a traced ``i`` is None (any of them).
    """
    root = root_of(ref)
    shape = tuple(int(d) for d in getattr(root, "shape", ()))
    indexers = _indexers(ref) if ref is not root else []
    if indexers is None:
        return None
    # The common case, sems.at[i] of a 1-D array, without numpy.
    if len(shape) == 1 and len(indexers) == 1 and len(indexers[0].indices) == 1:
        index = _static_index(indexers[0].indices[0])
        if index is None:
            return None
        if isinstance(index, int):
            return frozenset({index % shape[0]})
    positions = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    for indexer in indexers:
        index_tuple: list[int | slice] = []
        for item in indexer.indices:
            index = _static_index(item)
            if index is None:
                return None
            index_tuple.append(index)
        positions = np.asarray(positions[tuple(index_tuple)])
    return frozenset(int(p) for p in positions.ravel())


# Barriers. jax 0.11 and later name a barrier by a tag (get_barrier_semaphore(tag=...));
# jax 0.12 can assign collective ids itself (config jax_pallas_auto_assign_collective_ids,
# "yes" or "override"); jax 0.10.2 has neither.


@functools.cache
def barrier_tags_supported() -> bool:
    """Whether ``pltpu.get_barrier_semaphore`` takes a ``tag`` (from jax 0.11): probed on
    its signature, not by the version number."""
    try:
        return "tag" in inspect.signature(_get_barrier_semaphore).parameters
    except (TypeError, ValueError):  # no signature to read: call it as 0.10.2 did
        return False


def auto_collective_ids() -> bool:
    """True when jax assigns collective ids to kernels that name none."""
    mode = getattr(jax.config, "jax_pallas_auto_assign_collective_ids", "no")
    return str(mode) in ("yes", "override")


# The compiler_params of a plain ``pl.pallas_call``, ``pl.kernel`` or ``pl.core_map``
# whose kernel is being traced. ``safedma.checked`` under one of them (not under a
# safedma entry point) has no other way to learn the kernel's collective_id (T9): jax
# traces the body inside a closure of that entry point whose live frame holds
# ``compiler_params`` (a free variable or a local):
#   pl.pallas_call: ``wrapped`` in jax/_src/pallas/pallas_call.py (0.10.2 through 0.12);
#   pl.kernel: ``wrapper`` in jax/_src/pallas/mpmd.py (0.10.2 through 0.12);
#   pl.core_map: ``wrapped`` in jax/_src/pallas/core.py (0.10.2; in 0.12 it calls
#   pl.kernel's ``wrapper`` too).
# The innermost such frame is the kernel being traced. Private: if jax renames one,
# the lookup finds nothing and the check is skipped, as before it existed
# (tests/core/test_compat.py fails loudly then).
_ENTRY_FRAMES = (
    ("pallas/pallas_call.py", "wrapped"),
    ("pallas/mpmd.py", "wrapper"),
    ("pallas/core.py", "wrapped"),
)
NOT_FOUND = object()
"""What :func:`enclosing_pallas_call_params` returns outside a kernel trace."""


def enclosing_pallas_call_params() -> object:
    """The ``compiler_params`` of the innermost ``pl.pallas_call``, ``pl.kernel`` or
    ``pl.core_map`` being traced (None when it was given none), or :data:`NOT_FOUND`."""
    return enclosing_entry()[1]


def enclosing_entry() -> tuple[str | None, object]:
    """The innermost ``pl.pallas_call`` (``"pallas_call"``), ``pl.kernel`` (``"kernel"``)
    or ``pl.core_map`` (``"core_map"``) being traced and its ``compiler_params``;
    ``(None, NOT_FOUND)`` outside one. jax lowers a ``pl.pallas_call`` for TensorCores."""
    import inspect

    frame = inspect.currentframe()  # None only on Pythons without frames: no check then
    while frame is not None:
        code = frame.f_code
        if "compiler_params" in code.co_freevars or "compiler_params" in code.co_varnames:
            filename = code.co_filename.replace("\\", "/")
            for suffix, name in _ENTRY_FRAMES:
                if code.co_name == name and filename.endswith(suffix):
                    entry = _ENTRY_NAMES[suffix]
                    return entry, frame.f_locals.get("compiler_params", NOT_FOUND)
        frame = frame.f_back
    return None, NOT_FOUND


_ENTRY_NAMES = {
    "pallas/pallas_call.py": "pallas_call",
    "pallas/mpmd.py": "kernel",
    "pallas/core.py": "core_map",
}


# The two avals jax's ScratchShape protocol asks a scratch declaration for:
# safedma.Scratch declares them (for type checkers only) so grid specs typed
# with ScratchShapeTree (PrefetchScalarGridSpec) accept typed scratch. Private: jax's
# protocol names these classes, which have no public spelling in jax 0.10.2.
ArrayAval: TypeAlias = "_jax_core.AbstractValue"
RefAval: TypeAlias = "_state_types.AbstractRef | _state_types.TransformedRef"


class AsyncCopyDescriptor(Protocol):
    """What safedma uses of pltpu's async-copy descriptor (make_async_copy's result)."""

    def start(self, priority: int = 0, *, add: bool = False) -> None: ...
    def wait(self) -> None: ...
    def wait_send(self) -> None: ...
    def wait_recv(self) -> None: ...


# Lowering. These are the calls a careful author writes by hand; nothing else
# is emitted. device_id_type is never passed: MESH is the default everywhere.
# Each jax call is read once, with the type safedma calls it with: jax leaves their ref
# and semaphore parameters unannotated (pyright strict reports each use), while
# safedma's own stubs (safedma/stubs/) type them for raw pltpu code and refuse the
# `object` refs held here (their brands are checked at trace time, in _checks.py). Read
# through getattr, the library type-checks the same against jax and against the stubs,
# and make_async_copy's result is the protocol below whichever of the two types it.
_make_async_copy: Callable[[object, object, object], AsyncCopyDescriptor] = getattr(
    pltpu, "make_async_copy"
)
_make_async_remote_copy: Callable[..., AsyncCopyDescriptor] = getattr(
    pltpu, "make_async_remote_copy"
)
_semaphore_signal: Callable[..., None] = getattr(pl, "semaphore_signal")
_semaphore_wait: Callable[[object, Any], None] = getattr(pl, "semaphore_wait")
_semaphore_read: Callable[[object], jax.Array] = getattr(pl, "semaphore_read")


def make_local_descriptor(src: object, dst: object, sem: object) -> AsyncCopyDescriptor:
    return _make_async_copy(src, dst, sem)


class LogicalId(dict["str | tuple[str, ...]", Any]):
    """A device named by its logical id (``device_id_type=LOGICAL``), not mesh coordinates.

    An empty ``dict`` to the type checker (so ``Device.pltpu_device_id`` keeps its
    type), recognised here by its class. jax 0.12 deprecates ``device_id_type``
    but has no other spelling that passes a logical id as it is: the deprecation warning
    (about safedma's own call, not the user's) is silenced for these calls only; a jax
    without ``DeviceIdType`` gets the id as mesh coordinates.
    """

    def __init__(self, index: Any) -> None:
        super().__init__()
        self.index: Any = index


def _logical_id_type() -> Any:
    """``DeviceIdType.LOGICAL``, or None where jax has removed ``DeviceIdType``."""
    # Private: jax 0.12 deprecates the public pl.DeviceIdType (and warns on each access)
    # along with device_id_type=, still the only way to pass a logical id as it is; the
    # private enum is read without the warning. jax announced their removal: where they
    # are gone, a logical id is passed as mesh coordinates instead (_as_mesh_coordinates).
    if not _has_private(_pallas_primitives, "DeviceIdType"):
        return None
    return _pallas_primitives.DeviceIdType.LOGICAL


def _has_private(module: object, name: str) -> bool:
    """Whether a private module has ``name``: for names a supported jax may lack."""
    return optional_name(module, name) is not None


def _as_mesh_coordinates(index: Any) -> dict[str, Any]:
    """A logical device id as the mesh coordinates jax turns back into it: jax numbers
    devices row-major over the mesh axes in scope (``device_id_to_logical`` sums each
    coordinate times its axis's stride), the spelling that needs no ``DeviceIdType``."""
    sizes = axes_in_scope()
    if not sizes:
        raise missing_private_name(
            "jax._src.pallas.primitives.DeviceIdType",
            "removed, and a logical device id outside shard_map has no mesh coordinates",
        )
    coordinates: dict[str, Any] = {}
    stride = 1
    for name, size in reversed(list(sizes.items())):
        coordinates[name] = (index // stride) % size
        stride *= size
    return dict(reversed(list(coordinates.items())))


@contextlib.contextmanager
def _logical_ids() -> Generator[None, None, None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*device_id_type.*", category=DeprecationWarning)
        yield


def _remote(
    src: object, dst: object, send_sem: object, recv_sem: object, device_id: Any
) -> AsyncCopyDescriptor:
    if isinstance(device_id, LogicalId):
        logical = _logical_id_type()
        if logical is None:
            coordinates = _as_mesh_coordinates(device_id.index)
            return _make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=coordinates)
        with _logical_ids():
            return _make_async_remote_copy(
                src, dst, send_sem, recv_sem, device_id=device_id.index, device_id_type=logical
            )
    return _make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=device_id)


def make_remote_descriptor(
    src: object, dst: object, send_sem: object, recv_sem: object, device_id: Any
) -> AsyncCopyDescriptor:
    return _remote(src, dst, send_sem, recv_sem, device_id)


def semaphore_signal(sem: object, inc: Any, device_id: Any) -> None:
    if device_id is None:
        _semaphore_signal(sem, inc)
    elif isinstance(device_id, LogicalId):
        logical = _logical_id_type()
        if logical is None:
            _semaphore_signal(sem, inc, device_id=_as_mesh_coordinates(device_id.index))
            return
        with _logical_ids():
            _semaphore_signal(sem, inc, device_id=device_id.index, device_id_type=logical)
    else:
        _semaphore_signal(sem, inc, device_id=device_id)


def semaphore_wait(sem: object, value: Any) -> None:
    _semaphore_wait(sem, value)


def semaphore_read(sem: object) -> jax.Array:
    return _semaphore_read(sem)


# Typed as a plain callable: jax 0.10.2 leaves it unannotated (and has no tag), 0.12 does
# not. getattr, so that no checker keeps the installed jax's signature (ty would, and
# reject tag= on 0.10.2, where barrier_semaphore() never passes it).
_get_barrier_semaphore: Callable[..., object] = getattr(pltpu, "get_barrier_semaphore")


def barrier_semaphore(tag: object = None) -> object:
    if tag is None:
        return _get_barrier_semaphore()
    return _get_barrier_semaphore(tag=tag)


# ---------------------------------------------------------------- the chip a kernel is for


def _forced_interpret() -> object:
    # Private: pltpu.force_tpu_interpret_mode (which safedma.testing.simulate uses) sets this
    # config state and jax reads it when a pallas_call is built; there is no public getter.
    state = optional_name(_config, "pallas_tpu_interpret_mode_context_manager")
    return getattr(state, "value", None)


def _enclosing_interpret() -> object:
    """The ``interpret`` of the innermost ``pl.pallas_call`` whose kernel is being traced.

    Private: jax traces the kernel inside ``wrapped`` (jax/_src/pallas/pallas_call.py,
    0.10.2 and 0.12), a closure that holds ``interpret`` (already combined with the forced
    mode); there is no public way to ask a kernel body where it will run."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wrapped" and code.co_filename.replace("\\", "/").endswith(
            "pallas/pallas_call.py"
        ):
            return frame.f_locals.get("interpret", False)
        frame = frame.f_back
    return False


def interpret_mode(given: object = None) -> object:
    """How the kernel being traced will run: a falsy value for the chip, else jax's
    ``interpret`` value. ``given``: the call's ``interpret=`` when the caller knows it;
    ``pltpu.force_tpu_interpret_mode`` wins, as it does in jax."""
    forced = _forced_interpret()
    value = forced if forced else given
    return _enclosing_interpret() if value is None else value


_GENERATION = re.compile(r"TPU\s*v?(\d+)", re.IGNORECASE)


def chip_generation(device_kind: str) -> int | None:
    """The TPU generation in a device kind (``"TPU v5 lite"`` -> 5, ``"TPU7x"`` -> 7)."""
    found = _GENERATION.search(device_kind)
    return int(found.group(1)) if found else None


def compiled_for_chip() -> str | None:
    """The device kind of the TPU that the kernel being traced will be compiled for and
    run on, when this process's default backend is a TPU and the kernel is not
    interpreted; None otherwise (the CPU, interpret mode, or compile-only builds for a
    topology, whose chip this process does not run)."""
    try:
        # The backend first: on a CPU host (the common case) no frame walk is needed.
        if jax.default_backend() != "tpu" or interpret_mode():
            return None
        devices_of: Callable[[], Sequence[object]] = getattr(jax, "devices")
        return str(getattr(devices_of()[0], "device_kind", ""))
    except RuntimeError:  # no backend could be started: not a chip
        return None


# Raw DMA equations for the raw-copy pairing (safedma/_raw_pairing.py). Private: the
# operand layout of jax's ``dma_start`` / ``dma_wait`` (their ``tree``: ``(src, dst,
# sem, other_sem, device_id)``, jax 0.10.2 and 0.12 alike; a wait's ``sem`` and ``dst``
# are the waited side's, jax swaps them for a send wait) and the indexer a view carries
# (NDIndexer, see ref_layout). No public API exposes an equation's operands.
DMA_START = "dma_start"
DMA_WAIT = "dma_wait"


def dma_operands(eqn: Any, operands: list[object]) -> tuple[object, ...] | None:
    """``(src, dst, sem, other_sem, device_id)`` of a ``dma_start`` / ``dma_wait`` whose
    flat operands are ``operands`` (jaxpr variables or literals); None if not that form."""
    try:
        args = eqn.params["tree"].unflatten(list(operands))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if not isinstance(args, tuple) or len(cast("tuple[object, ...]", args)) != 5:
        return None
    return cast("tuple[object, ...]", args)


def view_slot(
    view: object, known: Mapping[int, int] | None = None
) -> tuple[int | None, ...] | None:
    """The static index of each indexed axis of a semaphore view (None: computed),
    ``()`` for the bare ref; None when the view has other transforms or slices.
    ``known``: static values of variables by id (a literal a block received)."""
    slot: list[int | None] = []
    # Private: TransformedRef / NDIndexer (see ref_layout).
    while isinstance(view, _state_types.TransformedRef):
        for transform in view.transforms:
            if not isinstance(transform, _state_indexing.NDIndexer):
                return None
            for index in transform.indices:
                if isinstance(index, _indexing.Slice):
                    return None
                literal = getattr(index, "val", index)  # a Literal holds its value
                if is_jaxpr_var(index):
                    slot.append((known or {}).get(id(index)))
                else:
                    slot.append(_static_int(literal))
        view = view.ref
    return tuple(slot)


def literal_int(value: object) -> int | None:
    """The integer a jaxpr literal holds (None for a variable or another literal)."""
    if is_jaxpr_var(value):
        return None
    return _static_int(getattr(value, "val", value))


def is_jaxpr_var(value: object) -> bool:
    """Whether ``value`` is a jaxpr variable (not a literal)."""
    # Private: the Var class has no public home in jax 0.10.2.
    return isinstance(value, _jax_core.Var)


def view_nbytes(view: object) -> int | None:
    """The bytes a view of a data ref covers, when its shape is static; else None."""
    base = view_base(view)
    aval = getattr(base, "aval", None)
    dtype = getattr(aval, "dtype", None)
    shape = tuple(getattr(aval, "shape", ()))
    # Private: NDIndexer.get_indexer_shape (see ref_layout); the last indexer gives the shape.
    current: object = view
    indexers: list[Any] = []
    while isinstance(current, _state_types.TransformedRef):
        indexers = list(current.transforms) + indexers
        current = current.ref
    if indexers:
        last = indexers[-1]
        if not isinstance(last, _state_indexing.NDIndexer):
            return None
        shape = tuple(last.get_indexer_shape())
    if dtype is None or not all(isinstance(d, int) for d in shape):
        return None
    try:
        size = int(np.prod(cast("tuple[int, ...]", shape))) * int(np.dtype(dtype).itemsize)
    except TypeError:
        return None
    return size


def eqn_user_line(eqn: Any) -> tuple[str, int] | None:
    """The innermost frame outside jax that traced ``eqn`` (see emitted_from)."""
    traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
    frame = _source_info.user_frame(traceback) if traceback is not None else None
    if frame is None:
        return None
    return str(frame.file_name), int(frame.start_line)


def enclosing_scratch_count() -> int | None:
    """How many ref leaves the innermost ``pl.pallas_call`` being traced hands its body as
    scratch, after its operands (0 for scratch given as a mapping: keywords), or None
    outside one: a body checked under a plain ``pl.pallas_call`` tells its scratch
    semaphores from those it takes as operands (DMA futures) this way."""
    import inspect

    # Private: pallas_call's body wrapper holds the scratch given as ``scratch_shapes``
    # (avals) as its local ``scratch_args`` (a mapping: handed over as keywords), and
    # ``_trace_kernel_to_jaxpr`` holds the ``grid_mapping`` whose ``num_scratch_operands``
    # also counts a grid spec's scratch (``PrefetchScalarGridSpec(scratch_shapes=...)``,
    # which ``scratch_args`` leaves out); jax 0.10.2 and 0.12 alike. If jax renames them,
    # nothing is found and every semaphore parameter is taken for an operand (the raw
    # pairing then skips it).
    frame = inspect.currentframe()
    fallback: int | None = None
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if filename.endswith("pallas/pallas_call.py"):
            local = frame.f_locals
            if "scratch_args" in local and fallback is None:
                scratch: object = local["scratch_args"]
                if isinstance(scratch, Mapping):
                    return 0
                fallback = len(jax.tree_util.tree_leaves(scratch))
            count: object = getattr(local.get("grid_mapping"), "num_scratch_operands", None)
            if isinstance(count, int) and fallback is not None:
                return max(count, fallback)
        frame = frame.f_back
    return fallback


# Semaphore index ranges (safedma/_slot_ranges.py). Private, jax 0.10.2 and 0.12 alike
# unless said: the pallas grid being traced, a scan equation's operand layout, and the
# integer indices a semaphore view records (NDIndexer / Slice, see ref_layout). No public
# API says how large the grid is without binding a primitive into the body (pl.num_programs
# does so for a dynamic dimension), nor which of a scan's operands are carried.


def grid_size(axis: int) -> int | None:
    """The size of grid axis ``axis`` of the ``pl.pallas_call`` being traced, or None
    (no grid in scope, a dynamic dimension, an axis out of range)."""
    # Private: pallas_core.axis_frame(), the grid context pallas_call sets while it traces
    # its body (what pl.num_programs reads); it asserts when there is none.
    try:
        size: object = _pallas_core.axis_frame().size(axis)
    except (AssertionError, AttributeError, ValueError, IndexError, TypeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def scan_layout(params: Mapping[str, Any], n: int) -> tuple[int, int] | None:
    """``(consts, carries)``: how many of a ``scan`` equation's ``n`` operands are its
    constants and its carries (the rest are the sliced ``xs``); None if not known."""
    # Private: jax 0.10.2 records them as ``num_consts`` / ``num_carry``; 0.12 as the
    # flat tree ``ft_in`` of (consts, carry, xs).
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    tree: Any = params.get("ft_in")
    if tree is None:
        return None
    try:
        consts, carry, _ = tree.update(list(range(n))).unpack()
        return len(consts), len(carry)
    except (AttributeError, TypeError, ValueError):
        return None


def view_index_axes(view: object) -> list[tuple[object, int]] | None:
    """For a view that picks one semaphore of its root by an integer index per dimension
    (``sems.at[i]``, ``sems.at[i, j]``, ``sems.at[i].at[j]``): each index (an int, a
    tracer, a jaxpr variable or literal) with the size of the dimension it indexes, in
    the root's dimension order; ``[]`` for the bare root; None for any other view (a
    slice, an array index, a reshape)."""
    indices: list[object] = []
    current: object = view
    transforms: list[Any] = []
    while isinstance(current, _state_types.TransformedRef):
        transforms = list(current.transforms) + transforms
        current = current.ref
    aval = getattr(current, "aval", current)
    raw_shape: object = getattr(aval, "shape", ())
    shape = tuple(cast("Sequence[object]", raw_shape))
    for transform in transforms:
        if not isinstance(transform, _state_indexing.NDIndexer):
            return None
        for index in transform.indices:
            if isinstance(index, _indexing.Slice) or getattr(index, "shape", ()) != ():
                return None
            indices.append(index)
    sizes = [d for d in shape if isinstance(d, int)]
    if len(indices) != len(shape) or len(sizes) != len(shape):
        return None
    return list(zip(indices, sizes))


def eqn_record(frame: object) -> object:
    """The record a trace keeps of its equations while it is traced. jax gives an ended
    trace a new, empty record and leaves the old one as it was: a check that keeps it
    can read, once the body is traced, the equations a block (a branch) traced."""
    # Private: a DynamicJaxprTrace's ``frame.tracing_eqns`` (see traced_eqns), rebound to
    # a new list when the trace ends (jax 0.10.2 and 0.12 alike).
    record: object = getattr(getattr(frame, "frame", None), "tracing_eqns", None)
    return cast("list[object]", record) if isinstance(record, list) else list[object]()


def recorded_eqns(record: object) -> list[Any]:
    """The equations of an :func:`eqn_record` still alive (an effect's always is)."""
    found: list[Any] = []
    for entry in cast("list[object]", record) if isinstance(record, list) else []:
        if isinstance(entry, weakref.ReferenceType):
            entry = cast("weakref.ReferenceType[object]", entry)()
        if entry is not None:
            found.append(entry)
    return found


# Pallas GPU kernel bodies (safedma/_raw_gpu.py): what a trace is traced for, the inputs
# of the jaxpr it builds, and the scalar indices of a barrier view's transforms. Private,
# jax 0.12 (the only jax with Pallas GPU safedma reads): a DynamicJaxprTrace's
# ``frame.debug_info.traced_for`` and ``frame.invars``, and NDIndexer / Slice (see
# ref_layout). A name jax moves reads as "unknown", and the GPU checks then say nothing.


def traced_for(frame: object) -> str:
    """What jax traces ``frame`` for (``"pallas run_scoped"``, ``"pallas_call kernel"``,
    ``"fori_loop"``...); ``""`` when not known."""
    debug_info = getattr(getattr(frame, "frame", None), "debug_info", None)
    return str(getattr(debug_info, "traced_for", ""))


def frame_inputs(frame: object) -> list[object]:
    """The input variables of the jaxpr ``frame`` is building (a ``run_scoped`` body's
    allocations, a kernel's operands and scratch)."""
    inputs: object = getattr(getattr(frame, "frame", None), "invars", ())
    return list(cast("Sequence[object]", inputs)) if isinstance(inputs, (list, tuple)) else []


def indexer_scalars(transforms: object) -> list[object] | None:
    """The scalar index per dimension of a view whose transforms are one ``.at[...]`` of
    integers (jaxpr variables, literals or ints), ``[]`` for no transform; None for any
    other view (a slice, several indexers, a reshape)."""
    items = cast("Sequence[object]", transforms) if isinstance(transforms, (list, tuple)) else ()
    if not items:
        return [] if isinstance(transforms, (list, tuple)) else None
    if len(items) != 1 or not isinstance(items[0], _state_indexing.NDIndexer):
        return None
    found: list[object] = []
    for index in items[0].indices:
        if isinstance(index, _indexing.Slice) or getattr(index, "shape", ()) != ():
            return None
        found.append(index)
    return found


def called_by_jax(frame: object) -> bool:
    """Whether Python ``frame`` (a function's caller) runs jax's own code: jax traces the
    function itself (a kernel or ``run_scoped`` body), rather than user code calling it."""
    code = getattr(frame, "f_code", None)
    filename = str(getattr(code, "co_filename", "")).replace("\\", "/")
    root = jax.__file__.replace("\\", "/").rsplit("/", 1)[0] + "/"
    return filename.startswith(root)
