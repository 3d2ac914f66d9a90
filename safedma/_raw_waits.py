"""Raw pltpu waits (and starts) in a kernel body's jaxpr, and the refs they stand for.

The ledger pairs only the waits made through safedma; a body that starts a copy with
safedma and waits it with ``pltpu.make_async_copy(...).wait()`` is correct, and the
truth is in the body's jaxpr: its ``dma_wait`` equations. jax keeps the equations
traced so far on the trace's frame (``_compat.traced_eqns``, holding the operand
tracers: ``_compat.operand_tracers``); waits inside ``cond`` / loops / ``run_scoped``
sit in the closed jaxprs of those equations' params. A wait is safedma's own when the
innermost frame of its source traceback outside jax is in a file the caller's
``is_own_file`` accepts (``_compat.emitted_from``).

Blocks (branches, loop bodies, ``run_scoped``, ``emit_pipeline`` bodies) see an outer
ref under a new tracer; :func:`outer_ref` follows one back out. Every private jax name
this needs is read through ``safedma._compat``; tests/core/test_raw_waits.py pins the
analysis on both jax versions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias, cast

import jax

from safedma import _compat
from safedma._compat import FlowKind, SemaphoreKind

__all__ = [
    "ALLOCATED_INSIDE",
    "RawWait",
    "allocated_inside",
    "block_inputs",
    "is_block_argument",
    "outer_ref",
    "raw_dma_waits",
    "raw_waited_inside",
]

RawWait: TypeAlias = "tuple[object | None, object | None]"
"""A raw wait's semaphore as ``(root, view)``: ``view`` None means any slot of
``root``; ``root`` None means a semaphore the check cannot name (any);
``root`` :data:`ALLOCATED_INSIDE` means any semaphore allocated inside a block."""

ALLOCATED_INSIDE: object = object()
"""The root of raw waits in a block that receives no semaphore: they wait semaphores
allocated inside blocks (``run_scoped``), never one the kernel body was given."""

# Unannotated in jax's pytree module as seen by some checkers; typed here.
_tree_unflatten = cast(
    "Callable[[object, list[object]], object]", getattr(jax.tree_util, "tree_unflatten")
)


def allocated_inside(value: object, frame: object) -> bool:
    """Whether ``value`` is a tracer of a block nested in ``frame`` (a ref a ``run_scoped``
    allocated), not of ``frame`` or an enclosing trace (a kernel parameter, scratch, or
    a ref an enclosing body closes over)."""
    trace = _compat.trace_of(value)  # None for a non-tracer: never allocated inside
    if trace is None:
        return False
    enclosing: object | None = frame
    while enclosing is not None:
        if trace is enclosing:
            return False
        enclosing = _compat.frame_parent(enclosing)
    return True


def _has_raw_wait(
    jaxpr: Any, is_own_file: Callable[[str], bool], primitive: str = "dma_wait"
) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive and not _compat.emitted_from(eqn, is_own_file):
            return True
        if any(
            _has_raw_wait(sub, is_own_file, primitive) for sub in _compat.sub_jaxprs(eqn.params)
        ):
            return True
    return False


def _is_semaphore(value: object) -> bool:
    return _compat.is_ref(value) and _compat.ref_kind(value) is not SemaphoreKind.DATA


def block_inputs(eqn: Any) -> list[tuple[Any, list[int]]] | None:
    """Each block of ``eqn`` with, for each of its inputs (constvars then invars), the
    position of the operand of ``eqn`` it receives (-1: none, e.g. a ``run_scoped``
    allocation or a loop counter); None for a primitive whose blocks are not known here."""
    name, params, n = eqn.primitive.name, eqn.params, len(eqn.invars)

    def inner(value: object) -> Any:
        return getattr(value, "jaxpr", value)

    if name == "cond":
        return [
            (inner(b), [-1] * len(inner(b).constvars) + list(range(1, n)))
            for b in params["branches"]
        ]
    if name == "while":
        cn, bn = params["cond_nconsts"], params["body_nconsts"]
        body, cond = inner(params["body_jaxpr"]), inner(params["cond_jaxpr"])
        carry = list(range(cn + bn, n))
        return [
            (body, [-1] * len(body.constvars) + list(range(cn, cn + bn)) + carry),
            (cond, [-1] * len(cond.constvars) + list(range(cn)) + carry),
        ]
    if name == "run_scoped":
        body = inner(params["jaxpr"])
        if len(body.constvars) == n:  # the closed-over refs, then the allocations
            return [(body, list(range(n)) + [-1] * len(body.invars))]
        if len(body.constvars) == 0 and len(body.invars) >= n:
            return [(body, list(range(n)) + [-1] * (len(body.invars) - n))]
        return None
    if name == "emit_pipeline":
        body = inner(params["body_jaxpr"])
        consts = _compat.pipeline_body_consts(params, n)
        if consts is None or len(consts) != len(body.constvars):
            return None
        # The body's inputs are its closed-over refs, then the pipeline's own buffers.
        return [(body, consts + [-1] * len(body.invars))]
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in params and _compat.is_jaxpr(inner(params[key])):
            body = inner(params[key])
            if len(body.invars) == n:
                return [(body, [-1] * len(body.constvars) + list(range(n)))]
    return None


def _operand_of(var: object, eqn: Any) -> int | None:
    """The position of the operand of ``eqn`` that block input ``var`` (a variable of a
    block of ``eqn``, at any depth) receives; -1 if ``var`` is made inside (a
    ``run_scoped`` allocation, a value a block computes), None if it is not found."""
    blocks = block_inputs(eqn)
    for jaxpr, positions in blocks or ():
        inputs = [*jaxpr.constvars, *jaxpr.invars]
        at = {id(v): i for i, v in enumerate(inputs)}
        if id(var) in at:
            i = at[id(var)]
            return positions[i] if i < len(positions) else -1
        for nested in jaxpr.eqns:
            if not any(True for _ in _compat.sub_jaxprs(nested.params)):
                continue
            k = _operand_of(var, nested)
            if k is None:
                continue
            if k < 0 or id(nested.invars[k]) not in at:
                return -1
            i = at[id(nested.invars[k])]
            return positions[i] if i < len(positions) else -1
    return None


def outer_ref(ref: object, frame: object, since: int = 0) -> object | None:
    """The ref of ``frame`` (or of a trace enclosing it) that ``ref``'s root stands for:
    the root itself if it lives there; if it is a block's argument (a loop carry, a
    branch operand, a ref an ``emit_pipeline`` passes its step), the operand the block
    received, followed out through every block between; None if the root was allocated
    inside (``run_scoped``) or the blocks cannot be followed.

    jax makes a new tracer for each operand a block receives, so a semaphore passed into
    a ``cond``, a ``fori_loop`` carry or a pipeline's loop has a new identity there; the
    tracer's jaxpr variable (``_compat.jaxpr_var_of``) is an
    input of the block's jaxpr inside the equation the block became in ``frame`` (from
    its ``since``-th equation on), whose operand at that position is the outer ref."""
    root = _compat.root_of(ref)
    if not allocated_inside(root, frame):
        return root
    var = _compat.jaxpr_var_of(root)
    if var is None:
        return None
    for eqn in _compat.traced_eqns(frame, since):
        if not any(True for _ in _compat.sub_jaxprs(eqn.params)):
            continue
        k = _operand_of(var, eqn)
        if k is None:
            continue
        operands = _compat.operand_tracers(eqn)
        return operands[k] if 0 <= k < len(operands) else None
    return None


def _raw_waited_operands(
    eqn: Any, is_own_file: Callable[[str], bool], primitive: str = "dma_wait"
) -> tuple[set[int], bool] | None:
    """The operands of ``eqn`` whose semaphores a raw ``dma_wait`` inside its blocks waits,
    and whether one waits a semaphore allocated inside; None when a block on the way is
    not known (the caller then assumes every semaphore operand)."""
    blocks = block_inputs(eqn)
    if blocks is None:
        return None
    operands: set[int] = set()
    inside = False
    for jaxpr, positions in blocks:
        found = _raw_waited_inputs(jaxpr, is_own_file, primitive)
        if found is None:
            return None
        inputs, allocated = found
        inside = inside or allocated
        for k in inputs:
            if k < len(positions) and positions[k] >= 0:
                operands.add(positions[k])
            else:
                inside = True  # a block's own allocation or a value it makes
    return operands, inside


def _raw_waited_inputs(
    jaxpr: Any, is_own_file: Callable[[str], bool], primitive: str = "dma_wait"
) -> tuple[set[int], bool] | None:
    """Positions (constvars then invars) of ``jaxpr``'s inputs that raw waits inside it
    wait, and whether one waits a semaphore allocated inside it; None: not followed."""
    index = {id(v): i for i, v in enumerate([*jaxpr.constvars, *jaxpr.invars])}
    inputs: set[int] = set()
    inside = False
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive:
            if _compat.emitted_from(eqn, is_own_file):
                continue
            try:
                args = _tree_unflatten(eqn.params["tree"], list(eqn.invars))
            except (KeyError, TypeError, ValueError):
                return None
            if _waits_no_semaphore(args):
                continue
            roots = [_compat.view_base(a) for a in cast("tuple[object, ...]", args)]
            sems = [a for a in roots if _compat.is_semaphore_var(a)]
            if not sems:
                return None
            for sem in sems:
                if id(sem) in index:
                    inputs.add(index[id(sem)])
                else:
                    inside = True
            continue
        if not any(
            _has_raw_wait(sub, is_own_file, primitive) for sub in _compat.sub_jaxprs(eqn.params)
        ):
            continue
        nested = _raw_waited_operands(eqn, is_own_file, primitive)
        if nested is None:
            return None
        operands, allocated = nested
        inside = inside or allocated
        for k in operands:
            var = eqn.invars[k]
            if id(var) in index:
                inputs.add(index[id(var)])
            else:
                inside = True
    return inputs, inside


def _waits_no_semaphore(args: object) -> bool:
    """Whether a ``dma_wait``'s operands (jax's ``(src, dst, sem, src_sem, device_id)``
    tree, 0.10.2 and 0.12 alike) hold no semaphore: jax 0.12's fence for SparseCore push
    streams (``make_async_copy(src, dst).wait()``, ``sem=None``). It waits no semaphore
    slot, so it stands for no copy on one."""
    parts = cast("tuple[object, ...]", args) if isinstance(args, tuple) else ()
    return len(parts) == 5 and parts[2] is None and parts[3] is None


def raw_dma_waits(
    frame: object, is_own_file: Callable[[str], bool], since: int = 0, primitive: str = "dma_wait"
) -> list[RawWait]:
    """The semaphores waited by ``dma_wait``s traced into ``frame`` (from its ``since``-th
    equation on) that were not emitted from a file ``is_own_file`` accepts (safedma's own
    waits). ``primitive="dma_start"``: the semaphores of raw starts, read the same way
    (both primitives carry their operands' pytree as ``tree``, jax 0.10.2 and 0.12)."""
    found: list[RawWait] = []
    for eqn in _compat.traced_eqns(frame, since):
        operands = _compat.operand_tracers(eqn)
        if eqn.primitive.name == primitive:
            if _compat.emitted_from(eqn, is_own_file):
                continue
            try:
                args = _tree_unflatten(eqn.params["tree"], operands)
            except (KeyError, TypeError, ValueError):
                found.append((None, None))
                continue
            if _waits_no_semaphore(args):
                continue
            views = [a for a in cast("tuple[object, ...]", args) if _is_semaphore(a)]
            found += [(_compat.root_of(view), view) for view in views] or [(None, None)]
        elif any(
            _has_raw_wait(sub, is_own_file, primitive) for sub in _compat.sub_jaxprs(eqn.params)
        ):
            # A block sees an outer semaphore only as an operand (jax passes closed-over
            # refs in). The waits inside are followed back to the operands they wait
            # (any slot of each: the index inside is not mapped); a wait on a semaphore
            # allocated inside (a run_scoped, an emit_pipeline's own) is never a
            # kernel-level one. Where a block cannot be followed, every semaphore the
            # block receives counts as waited.
            followed = _raw_waited_operands(eqn, is_own_file, primitive)
            if followed is None:
                roots = [_compat.root_of(a) for a in operands if _is_semaphore(a)]
                found += [(root, None) for root in roots] or [(ALLOCATED_INSIDE, None)]
                continue
            waited, _ = followed
            found += [
                (_compat.root_of(operands[i]), None)
                for i in sorted(waited)
                if i < len(operands) and _is_semaphore(operands[i])
            ]
            if not any(_is_semaphore(a) for a in operands):
                found.append((ALLOCATED_INSIDE, None))
    return found


def _raw_waited_vars(jaxpr: Any, is_own_file: Callable[[str], bool], found: set[int]) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dma_wait" and not _compat.emitted_from(eqn, is_own_file):
            try:
                args = _tree_unflatten(eqn.params["tree"], list(eqn.invars))
            except (KeyError, TypeError, ValueError):
                continue
            roots = [_compat.view_base(a) for a in cast("tuple[object, ...]", args)]
            found.update(id(a) for a in roots if _compat.is_semaphore_var(a))
        for sub in _compat.sub_jaxprs(eqn.params):
            _raw_waited_vars(sub, is_own_file, found)


def raw_waited_inside(
    frame: object, is_own_file: Callable[[str], bool], since: int = 0
) -> Callable[[object], bool]:
    """Whether a ref made inside a block traced into ``frame`` (a ``run_scoped``
    allocation, a block's argument: see :func:`outer_ref`) is waited by a raw ``dma_wait``
    inside the blocks of ``frame``'s equations (from the ``since``-th on), by the identity
    of its jaxpr variable (``_compat.jaxpr_var_of``; any slot of it).
    ``raw_dma_waits`` can only say "a semaphore allocated inside" of such a wait; this names
    the very one."""
    found: set[int] = set()
    for eqn in _compat.traced_eqns(frame, since):
        for sub in _compat.sub_jaxprs(eqn.params):
            _raw_waited_vars(sub, is_own_file, found)

    def waited(ref: object) -> bool:
        var = _compat.jaxpr_var_of(_compat.root_of(ref))
        return (
            var is not None and allocated_inside(_compat.root_of(ref), frame) and id(var) in found
        )

    return waited


def is_block_argument(ref: object) -> bool:
    """Whether ``ref`` is a tracer a loop body or branch received as an argument: jax makes
    a new tracer for each operand or carry it passes in explicitly (``emit_pipeline``
    passes its buffered refs to its loop and ``pl.when`` blocks that way), so the tracer
    is some outer ref under a new identity. A ref a block closes over keeps its own
    tracer; one a ``run_scoped`` allocates is new, not an alias."""
    trace = _compat.trace_of(ref)
    return trace is not None and _compat.frame_kind(trace) in (FlowKind.LOOP, FlowKind.BRANCH)
