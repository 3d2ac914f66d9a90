"""Every use of jax internals by the verifier, in one place, each with the reason.

The verifier reads the program jax traced (jaxprs, the ``pallas_call``
parameters, the ref transforms in DMA operands); jax has no public API for
any of it. Everything below is read-only: nothing here binds a primitive or
changes jax state, except :func:`bind_concrete`, which evaluates one scalar
primitive on concrete numpy values.
"""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Iterator, Sequence
import functools
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from safedma._private_jax import PrivateModule, optional_name
from safedma.testing._user_frames import traceback_frames, user_frame_of

# Each private module is imported on its first use (PrivateModule): importing verify reads
# no private name, and one a jax release removed fails where it is used, as
# PrivateJaxApiError naming it. Type checkers see jax's own modules.
if TYPE_CHECKING:
    # Why: Var/Literal/Jaxpr/ClosedJaxpr are the program representation itself.
    from jax._src import core as _core

    # Why: the semaphore dtypes tell DMA, REGULAR and BARRIER semaphores apart.
    from jax._src.pallas import core as _pallas_core
    from jax._src.pallas.mosaic import core as _mosaic_core
else:
    _core = PrivateModule("jax._src.core")
    _pallas_core = PrivateModule("jax._src.pallas.core")
    _mosaic_core = PrivateModule("jax._src.pallas.mosaic.core")

__all__ = [
    "Jaxpr",
    "Var",
    "Literal",
    "is_literal",
    "literal_value",
    "jaxpr_of",
    "consts_of",
    "sub_jaxprs",
    "unflatten",
    "split_transformed",
    "transform_parts",
    "semaphore_kind",
    "memory_space",
    "aval_shape",
    "aval_itemsize",
    "is_ref_aval",
    "scan_split",
    "kernel_params",
    "grid_semantics",
    "all_eqns",
    "traceback_frames",
    "user_frame_of",
    "kernel_param_names",
    "bind_concrete",
    "JaxprEqn",
]

Jaxpr = Any  # jax._src.core.Jaxpr: untyped for our purposes
JaxprEqn = Any
Var = Any
Literal = Any


def is_literal(atom: object) -> bool:
    """True for a constant operand of an equation (``Literal``), False for a ``Var``."""
    return isinstance(atom, _core.Literal)


def literal_value(atom: Any) -> object:
    return atom.val


# Why: jax 0.10 wraps jaxprs with constants in ClosedJaxpr; 0.12 removed the class
# and keeps the constants on the Jaxpr itself (``consts`` for its ``constvars``).
@functools.cache
def _closed_jaxpr() -> Any:
    """jax's ClosedJaxpr class, or None on a jax without it."""
    return optional_name(_core, "ClosedJaxpr")


@functools.cache
def _jaxpr_types() -> tuple[type, ...]:
    return tuple(t for t in (_core.Jaxpr, _closed_jaxpr()) if t is not None)


def jaxpr_of(obj: Any) -> tuple[Any, list[object]]:
    """(jaxpr, values of its constvars) of a Jaxpr or ClosedJaxpr parameter."""
    closed = _closed_jaxpr()
    if closed is not None and isinstance(obj, closed):
        return obj.jaxpr, list(obj.consts)
    return obj, list(getattr(obj, "consts", None) or [])


def consts_of(obj: Any) -> list[object]:
    return jaxpr_of(obj)[1]


def sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """Every jaxpr (open or closed) among an equation's parameters."""
    for value in params.values():
        items: Sequence[Any] = (
            cast("Sequence[Any]", value) if isinstance(value, (tuple, list)) else (value,)
        )
        for item in items:
            if isinstance(item, _jaxpr_types()):
                yield item


def all_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and, after each, those of the jaxprs it holds."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in sub_jaxprs(eqn.params):
            yield from all_eqns(jaxpr_of(sub)[0])


def unflatten(tree: Any, leaves: Sequence[object]) -> Any:
    """Rebuild a DMA/semaphore operand tree (``params['tree']``/``args_tree``) from leaves.

    Why: jax flattens (ref, transforms, semaphore, device id) into the
    equation's operands and keeps the structure in a PyTreeDef (0.10) or a
    flattree (0.12); both have ``unflatten``.
    """
    return tree.unflatten(list(leaves))


def split_transformed(x: Any) -> tuple[Any, tuple[Any, ...]]:
    """(ref, transforms) of a ``TransformedRef`` (``.ref``/``.transforms``), else (x, ())."""
    if type(x).__name__ == "TransformedRef":
        # a transform of a multi-ref (``pl.select_ref(...).reshape(...)``) nests
        # one TransformedRef in another: flatten to (refs, select, reshape)
        base, inner = split_transformed(x.ref)
        return base, inner + tuple(x.transforms)
    return x, ()


def select_parts(x: Any) -> tuple[tuple[Any, ...], Any, tuple[Any, ...]] | None:
    """(candidate refs, index, later transforms) of a ``pl.select_ref`` ref, else None.

    Why: ``select_ref`` (jax 0.12+) builds a ``TransformedRef`` whose ``ref`` is a
    tuple of refs and whose first transform is a ``SelectTransform`` (``idx``).
    """
    base, transforms = split_transformed(x)
    if not isinstance(base, (tuple, list)) or not transforms:
        return None
    first = transforms[0]
    if type(first).__name__ != "SelectTransform":
        return None
    candidates = tuple(cast("Sequence[Any]", base))
    return candidates, first.idx, tuple(transforms[1:])


def transform_parts(t: Any) -> tuple[str, Any]:
    """Classify one ref transform by its class (jax.state.types / state.indexing).

    Returns ("index", (indices, int_indexer_shape)), ("reshape", shape),
    ("bitcast", dtype), ("transpose", permutation) or ("other", name).
    Slices in ``indices`` are ``Slice`` objects (``start``, ``size``, ``stride``).
    """
    name = type(t).__name__
    if name == "NDIndexer":
        return "index", (tuple(t.indices), tuple(t.int_indexer_shape))
    if name in ("ReshapeTransform", "RefReshaper"):
        return "reshape", tuple(t.shape)
    if name in ("BitcastTransform", "RefBitcaster"):
        return "bitcast", np.dtype(t.dtype)
    if name == "TransposeTransform":
        return "transpose", tuple(t.permutation)
    return "other", name


def is_slice(index: Any) -> bool:
    return type(index).__name__ == "Slice"


def slice_parts(index: Any) -> tuple[Any, Any, Any]:
    return index.start, index.size, index.stride


def _inner(aval: Any) -> Any:
    return getattr(aval, "inner_aval", aval)


def is_ref_aval(aval: Any) -> bool:
    return type(aval).__name__ == "AbstractRef"


def semaphore_kind(aval: Any) -> str | None:
    """ "DMA", "REGULAR", "BARRIER" for a semaphore ref aval, else None."""
    dtype = getattr(_inner(aval), "dtype", None)
    if dtype is None:
        return None
    try:
        if jnp.issubdtype(dtype, _mosaic_core.dma_semaphore):
            return "DMA"
        if jnp.issubdtype(dtype, _pallas_core.barrier_semaphore):
            return "BARRIER"
        if jnp.issubdtype(dtype, _pallas_core.semaphore):
            return "REGULAR"
    except TypeError:
        return None
    return None


def memory_space(aval: Any) -> str:
    """ "HBM", "VMEM", "SMEM", "SEMAPHORE", "HOST" or "ANY" for a ref aval."""
    space = getattr(aval, "memory_space", None)
    text = str(space).lower() if space is not None else "any"
    for key, name in (
        ("semaphore", "SEMAPHORE"),
        ("smem", "SMEM"),
        ("vmem", "VMEM"),
        ("hbm", "HBM"),
        ("host", "HOST"),
    ):
        if key in text:
            return name
    return "ANY"


def aval_shape(aval: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in _inner(aval).shape)


def is_extended(dtype: Any) -> bool:
    """A jax extended dtype (PRNG keys): no numpy dtype, no host values."""
    return bool(jnp.issubdtype(dtype, jax.dtypes.extended))


def aval_itemsize(aval: Any) -> int:
    dtype = _inner(aval).dtype
    if semaphore_kind(aval) is not None:
        return 4
    if is_extended(dtype):
        return int(dtype.itemsize)  # a PRNG key: its key data's bytes per element
    return int(np.dtype(dtype).itemsize)


def aval_dtype(aval: Any) -> Any:
    return _inner(aval).dtype


def scan_split(params: dict[str, Any]) -> tuple[int, int]:
    """(num_consts, num_carry) of a scan: explicit in 0.10, a flattree ``ft_in`` in 0.12."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))


def tpu_compiler_params(params: dict[str, Any]) -> Any:
    """The Mosaic TPU ``CompilerParams`` of a ``pallas_call`` or ``pl.kernel`` equation.

    Why: some versions keep them in a dict keyed by backend.
    """
    cp: Any = params.get("compiler_params")
    if isinstance(cp, dict):
        by_backend = cast("dict[str, Any]", cp)
        cp = by_backend.get("mosaic_tpu", by_backend.get("mosaic"))
    return cp


def parallel_grid_dims(eqn: Any) -> tuple[int, ...]:
    """Grid dimensions of a ``pallas_call`` marked "parallel" (or core-parallel) with
    more than one step.

    Why: ``dimension_semantics`` lives in the private ``compiler_params`` and is a
    string in some jax versions and a ``GridDimensionSemantics`` enum in others.
    """
    cp = tpu_compiler_params(eqn.params)
    sems = tuple(getattr(cp, "dimension_semantics", None) or ()) if cp is not None else ()
    grid: tuple[object, ...] = tuple(getattr(eqn.params["grid_mapping"], "grid", ()))

    def one_step(size: object) -> bool:  # a dynamic size is not an int here
        return isinstance(size, int) and size <= 1

    return tuple(
        d
        for d, sem in enumerate(sems)
        if "parallel" in str(getattr(sem, "name", sem)).lower()
        and d < len(grid)
        and not one_step(grid[d])
    )


def grid_semantics(eqn: Any) -> tuple[str, ...]:
    """Each grid dimension's ``dimension_semantics`` as a lower-case name ("parallel",
    "arbitrary", "core_parallel", ...); every dimension "arbitrary" when unset.

    Why: the semantics live in the private ``compiler_params`` (a dict keyed by
    backend in some jax versions) and are strings or ``GridDimensionSemantics``
    enum members depending on how the kernel was written.
    """
    cp = tpu_compiler_params(eqn.params)
    gm: Any = eqn.params["grid_mapping"]
    grid: tuple[object, ...] = tuple(getattr(gm, "grid", ()))
    vmapped = set(cast("tuple[int, ...]", getattr(gm, "vmapped_dims", ()) or ()))
    sems = tuple(getattr(cp, "dimension_semantics", None) or ()) if cp is not None else ()
    names = iter(str(getattr(s, "value", s)).lower() for s in sems)
    # jax's Mosaic lowering (MosaicGridMapping) marks the grid dimensions vmap added
    # "parallel" and gives the user's semantics to the others, in order
    return tuple("parallel" if d in vmapped else next(names, "arbitrary") for d in range(len(grid)))


def kernel_params(eqn: Any) -> dict[str, Any]:
    """The parts of a ``pallas_call`` equation the verifier reads.

    Why: ``grid_mapping`` (grid, operand counts, block mappings) and
    ``compiler_params`` (collective_id, skip_device_barrier; a dict keyed
    by backend in some versions) are private structures.
    """
    p: dict[str, Any] = eqn.params
    gm: Any = p["grid_mapping"]
    cp: Any = tpu_compiler_params(p)
    collective_id = getattr(cp, "collective_id", None) if cp is not None else None
    skip = bool(getattr(cp, "skip_device_barrier", False)) if cp is not None else False
    blocks: list[dict[str, Any]] = []
    for bm in gm.block_mappings:
        aval = bm.transformed_block_aval
        index_map = bm.index_map_jaxpr
        blocks.append(
            {
                "space": _block_space(aval),
                # an array made with pltpu.VMEM(...)/SMEM(...) lives there: no copies
                "array_space": memory_space(bm.array_aval),
                "block_shape": tuple(_block_dim(b) for b in bm.block_shape),
                "block_kinds": tuple(_block_kind(b) for b in bm.block_shape),
                "array_shape": tuple(int(d) for d in bm.array_aval.shape),
                "index_map": index_map,
                "origin": str(getattr(bm, "origin", "")),
                # pl.Buffered(..., revisit=pl.RevisitMode.ANY): Mosaic restores an output
                # block visited again later (None or "immediate": it does not)
                "revisit": str(getattr(getattr(bm.pipeline_mode, "revisit", None), "value", "")),
            }
        )
    mesh = p.get("mesh")
    name = p.get("name")
    if name is None:
        nsi = p.get("name_and_src_info")
        name = getattr(nsi, "name", None)
    if name is None:
        # no name= given: the kernel function's own name (a functools.partial's too),
        # from the kernel jaxpr's debug info ("my_kernel at file.py:12")
        info = getattr(getattr(p["jaxpr"], "debug_info", None), "func_src_info", None)
        if isinstance(info, str) and info:
            name = info.split(" at ")[0] or None
    return {
        "jaxpr": p["jaxpr"],
        "grid": tuple(
            int(cast(int, g)) if isinstance(g, (int, np.integer)) else -1
            for g in cast("tuple[object, ...]", gm.grid)
        ),
        "grid_names": tuple(gm.grid_names) if gm.grid_names else (),
        "semantics": grid_semantics(eqn),
        "vmapped_dims": tuple(int(d) for d in getattr(gm, "vmapped_dims", ()) or ()),
        "num_index_operands": int(gm.num_index_operands),
        "num_inputs": int(gm.num_inputs),
        "num_outputs": int(gm.num_outputs),
        "num_scratch": int(gm.num_scratch_operands),
        "num_dynamic_grid_bounds": int(getattr(gm, "num_dynamic_grid_bounds", 0)),
        "blocks": blocks,
        "aliases": tuple(tuple(a) for a in p.get("input_output_aliases", ())),
        "collective_id": collective_id,
        "skip_device_barrier": skip,
        "name": name,
        "mesh": mesh,
        "out_avals": tuple(p.get("out_avals", ())),
    }


def _block_space(aval: Any) -> str:
    """A block operand's memory space: a BlockSpec without one is a VMEM block on TPU
    (Pallas pipelines it); only an explicit ``pl.ANY`` leaves the operand in place."""
    space = getattr(aval, "memory_space", None)
    if space is None or str(space).lower() == "default":
        return "VMEM"
    return memory_space(aval)


def _block_kind(b: Any) -> str:
    """``"blocked"`` (an int or ``pl.Blocked``: index_map gives block indices),
    ``"squeezed"`` (``None`` / ``pl.Squeezed``: an element index), else the class name
    (``Element``, ``BoundedSlice``: index_map gives element offsets or slices).

    Why: the block-dimension classes are private (``jax._src.pallas.core``).
    """
    if b is None or type(b).__name__ == "Squeezed":
        return "squeezed"
    if isinstance(b, (int, np.integer)) or type(b).__name__ == "Blocked":
        return "blocked"
    return type(b).__name__


def _block_dim(b: Any) -> int | None:
    size = getattr(b, "block_size", b)
    if size is None:
        return None
    try:
        return int(size)
    except TypeError:
        return None


def core_mesh_axes(mesh: Any) -> tuple[tuple[str, int], ...]:
    """Axis (name, size) pairs of a ``pl.kernel`` mesh (e.g. TensorCoreMesh), else ()."""
    if mesh is None:
        return ()
    shape = getattr(mesh, "shape", None)
    if shape is None:
        return ()
    return tuple((str(k), int(v)) for k, v in dict(shape).items())


@functools.lru_cache(maxsize=256)
def _def_params(path: str, line: int) -> tuple[str, ...]:
    source = "".join(linecache.getlines(path))
    if not source:
        return ()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno == line:
            return tuple(a.arg for a in (*node.args.posonlyargs, *node.args.args))
    return ()


# jax's name for an item of a ``*args`` parameter: no name of the author's
_STAR_ITEM = re.compile(r"\w+\[\d+\]")


def kernel_param_names(kernel_jaxpr: Any) -> tuple[str, ...]:
    """The kernel function's positional parameter names, from its ``def`` line.

    Why: the kernel jaxpr's ``debug_info.arg_names`` are ``args[i]`` once a
    wrapper forwards ``*args``, but ``func_src_info`` still names the file
    and line of the kernel's ``def``.
    """
    info = getattr(kernel_jaxpr, "debug_info", None)
    raw: Sequence[object] = getattr(info, "arg_names", None) or ()
    names = tuple(str(n) for n in raw if n is not None)
    # a forwarded *args: every name an item of one parameter (args[0], args[1], ...);
    # pytree parameters beside others (gmm's group_metadata[0], lhs) name their operands
    stars = {n.split("[", 1)[0] for n in names if _STAR_ITEM.fullmatch(n)}
    forwarded = len(stars) == 1 and all(_STAR_ITEM.fullmatch(n) for n in names)
    if names and len(names) == len(raw) and not forwarded:
        return names
    src = str(getattr(info, "func_src_info", "") or "")
    if " at " in src and ":" in src:
        location = src.rsplit(" at ", 1)[1]
        path, _, line = location.rpartition(":")
        if line.isdigit():
            return _def_params(path, int(line))
    return ()


def bind_concrete(eqn: Any, values: Sequence[object]) -> list[object]:
    """Evaluate one primitive on concrete scalars, through jax itself (the slow fallback)."""
    subfuns, bind_params = _bind_params(eqn)
    out = eqn.primitive.bind(*subfuns, *[np.asarray(v) for v in values], **bind_params)
    outs = out if eqn.primitive.multiple_results else [out]
    return [cast(object, np.asarray(o).item()) for o in outs]


def bind_concrete_arrays(eqn: Any, values: Sequence[object]) -> list[object]:
    """Evaluate one primitive on concrete arrays (outside kernels), results as numpy."""
    subfuns, bind_params = _bind_params(eqn)
    out = eqn.primitive.bind(*subfuns, *[np.asarray(v) for v in values], **bind_params)
    outs = out if eqn.primitive.multiple_results else [out]
    result: list[object] = []
    for o in outs:
        a = np.asarray(o)
        result.append(a.item() if a.shape == () and a.dtype.kind in "biuf" else a)
    return result


def _bind_params(eqn: Any) -> tuple[list[Any], dict[str, Any]]:
    """Why: ``Primitive.get_bind_params`` returns (subfuns, params) in jax 0.10 and the
    params alone in 0.12."""
    got: Any = eqn.primitive.get_bind_params(eqn.params)
    if not hasattr(got, "keys"):  # (subfuns, params)
        subfuns: Sequence[Any] = got[0]
        bind: dict[str, Any] = got[1]
        return list(subfuns), dict(bind)
    params: dict[str, Any] = got
    return [], dict(params)


def kernel_def_line(eqn: Any) -> str | None:
    """ "file:line (function)" where the kernel of a ``pallas_call`` equation is defined,
    from its jaxpr's debug info ("my_kernel at file.py:12"); None when jax kept none.
    Why here: ``debug_info.func_src_info`` is a jax internal, read in this module only."""
    jaxpr = eqn.params.get("jaxpr")
    info = getattr(getattr(jaxpr, "debug_info", None), "func_src_info", None)
    if not isinstance(info, str) or " at " not in info:
        return None
    name, _, where = info.partition(" at ")
    return f"{where} ({name})" if where else None
