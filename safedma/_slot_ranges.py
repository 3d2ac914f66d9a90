"""The values a computed semaphore index can take, read from the kernel body's jaxpr.

A wait on ``sems.at[i % 2]`` can only ever stand for a copy on slot 0 or 1 of
``sems``: a copy on ``sems.at[2]`` is waited by no such wait. The trace-time pairing
(``_ledger.py`` for the typed API, ``_raw_pairing.py`` for raw pltpu copies) asks this
module for each index's range, and a wait meets a copy only where their ranges meet
in every dimension of the semaphore array.

A range is an over-approximation of the values the index takes in *every* loop
iteration and grid step of the body, never one iteration's: a copy started on
``(i + 1) % 2`` and waited on ``i % 2`` an iteration later has two ranges [0, 1],
which meet. What the analysis does not know is the whole array (it meets
everything), so a correct kernel is never rejected because of it:

* literals and constants fold; ``add`` / ``sub`` / ``mul`` / ``neg`` shift and scale,
  ``min`` / ``max`` / ``clamp`` bound, ``and`` with a non-negative mask gives
  [0, mask]; ``rem`` by a constant ``n`` > 0 gives [0, n-1] for a non-negative
  dividend and [-(n-1), n-1] otherwise (``lax.rem`` follows the dividend's sign);
  jnp's ``%`` (floor-mod) is ``rem`` and a ``select_n`` that adds ``n`` back where the
  remainder is negative, read through the facts its predicate implies in each case;
* ``select_n`` (``jnp.where``, ``lax.select``) joins the cases it can pick, each
  under what its predicate says in that case (``x < 0`` false: ``x >= 0``);
* ``program_id`` is in [0, size-1] for a grid dimension of static size,
  ``axis_index`` in [0, size-1] for a named axis in scope;
* a loop's index (a carry a ``fori_loop`` / ``while_loop`` / ``scan`` body adds a
  step of one sign to, bounded by the loop's trip count or its condition ``i < hi``)
  is within the loop's bounds over all its iterations; a carry the body passes on
  unchanged is its initial value; any other carry, a ``scan``'s sliced input, an SMEM
  read, a float: unknown;
* a ``jax.jit`` helper, a ``cond`` branch or ``run_scoped`` body sees what its caller
  passed in; a ``cond``'s result is the join of its branches';
* a result outside its integer type's range (it may wrap) is unknown.

Two identical index expressions (one jaxpr variable, or the same pure equations over
the same inputs) are one slot, whatever their ranges.

A range is only what the index is *when the copy runs*. A wait's is always used, but
a start's only where it runs on every run of the body (``Scope.always``: not in a
branch or a while loop): a prefetch ``pl.when(i + 1 < n)`` in a loop of one iteration
has the range {1} for ``(i + 1) % 2`` and never runs; reading it as slot 1 would
report a copy that never starts. There a start's index is read without the loops' and
the grid's bounds (``Ranges(bounds=False)``): a constant is still itself, a loop index
any value.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import numpy as np

from safedma import _compat

__all__ = [
    "BodySlots",
    "Index",
    "Ranges",
    "Scope",
    "Span",
    "UNKNOWN",
    "flat_positions",
    "index_of",
    "top_scope",
]

Span: TypeAlias = "tuple[int | None, int | None]"
"""Inclusive bounds of an integer's values; None: unbounded on that side."""

UNKNOWN: Span = (None, None)

_BUDGET = 4000
"""Equations one question may read before its answer is unknown (a body's index
arithmetic is a handful; this bounds a pathological one)."""

_CALLS = (
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "remat",
    "checkpoint",
)
"""Blocks that run once where they are called, on the operands they are given."""
_PURE = frozenset(
    {
        "add",
        "sub",
        "mul",
        "neg",
        "max",
        "min",
        "clamp",
        "rem",
        "div",
        "and",
        "or",
        "not",
        "xor",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "select_n",
        "convert_element_type",
        "copy",
        "copy_p",
        "squeeze",
        "reshape",
        "broadcast_in_dim",
        "program_id",
        "axis_index",
        "abs",
        "sign",
    }
)


def _dtype_bounds(var: object) -> Span | None:
    """The values a variable's dtype can hold: bool [0, 1], a signed integer its range;
    None for any other dtype (floats, unsigned integers: not followed)."""
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    if dtype is None:
        return None
    try:
        kind = np.dtype(dtype)
    except TypeError:
        return None
    if kind == np.bool_:
        return (0, 1)
    if kind.kind == "i":
        info = np.iinfo(cast("type[np.signedinteger[Any]]", kind.type))
        return (int(info.min), int(info.max))
    return None


def _fits(span: Span, bounds: Span | None) -> Span:
    """``span`` if every value of it fits the type's ``bounds`` (else it may wrap: unknown),
    narrowed by them."""
    if bounds is None:
        return UNKNOWN
    lo, hi = span
    if (lo is not None and lo < (bounds[0] or 0)) or (hi is not None and hi > (bounds[1] or 0)):
        return bounds
    return (bounds[0] if lo is None else lo, bounds[1] if hi is None else hi)


def _join(a: Span, b: Span) -> Span:
    lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return (lo, hi)


def _meet(a: Span, b: Span) -> Span | None:
    """The intersection, None if empty."""
    lo = a[0] if b[0] is None else b[0] if a[0] is None else max(a[0], b[0])
    hi = a[1] if b[1] is None else b[1] if a[1] is None else min(a[1], b[1])
    if lo is not None and hi is not None and lo > hi:
        return None
    return (lo, hi)


def _add(a: Span, b: Span) -> Span:
    lo = None if a[0] is None or b[0] is None else a[0] + b[0]
    hi = None if a[1] is None or b[1] is None else a[1] + b[1]
    return (lo, hi)


def _neg(a: Span) -> Span:
    return (None if a[1] is None else -a[1], None if a[0] is None else -a[0])


def _mul(a: Span, b: Span) -> Span:
    if None in a or None in b:
        return UNKNOWN
    products = [x * y for x in a for y in b if x is not None and y is not None]
    return (min(products), max(products))


def _const(span: Span) -> int | None:
    return span[0] if span[0] is not None and span[0] == span[1] else None


def _compare(name: str, a: Span, b: Span) -> Span:
    """A comparison's truth as a span of {0, 1}: decided where the ranges decide it."""

    def below(x: Span, y: Span) -> bool:  # every x < every y
        return x[1] is not None and y[0] is not None and x[1] < y[0]

    def above_eq(x: Span, y: Span) -> bool:  # every x >= every y
        return x[0] is not None and y[1] is not None and x[0] >= y[1]

    truth: dict[str, tuple[bool, bool]] = {
        "lt": (below(a, b), above_eq(a, b)),
        "ge": (above_eq(a, b), below(a, b)),
        "gt": (below(b, a), above_eq(b, a)),
        "le": (above_eq(b, a), below(b, a)),
    }
    if name in truth:
        true, false = truth[name]
    else:
        ca, cb = _const(a), _const(b)
        same = ca is not None and ca == cb
        apart = _meet(a, b) is None
        true, false = (same, apart) if name == "eq" else (apart, same)
    return (1, 1) if true else (0, 0) if false else (0, 1)


@dataclasses.dataclass(frozen=True)
class _Outer:
    """A block input that is its caller's operand: the same value in the enclosing scope."""

    operand: object
    scope: Scope


_Input: TypeAlias = "_Outer | Span"


class Scope:
    """One jaxpr (or a trace's equations so far) and what its inputs are.

    ``operands_of`` gives an equation's operands as jaxpr variables or literals (the
    equations of a trace still being recorded hold tracers); ``inputs``: per input
    variable (by id), the caller's operand it is or the span it is known to lie in."""

    def __init__(
        self,
        eqns: Iterable[Any],
        operands_of: Callable[[Any], list[object]],
        inputs: Mapping[int, _Input] | None = None,
    ) -> None:
        self.eqns = list(eqns)
        self.operands_of = operands_of
        self.inputs: dict[int, _Input] = dict(inputs or {})
        # Tracers by the id of their variable (a trace being recorded): a constant's value.
        self.tracers: dict[int, object] = {}
        # Runs on every run of the body (the kernel's, or a loop's that runs): not inside
        # a branch, a while loop or an unknown block. Only there does a copy surely
        # start, so that its slot is one of its index's range (see ``always``).
        self.always = True
        self._defs: dict[int, tuple[Any, int]] | None = None

    def definition(self, var: object) -> tuple[Any, int] | None:
        """The equation that makes ``var`` here and which of its results it is."""
        if self._defs is None:
            self._defs = {
                id(out): (eqn, k) for eqn in self.eqns for k, out in enumerate(eqn.outvars)
            }
        return self._defs.get(id(var))


def _jaxpr_operands(eqn: Any) -> list[object]:
    return list(eqn.invars)


def top_scope(eqns: Iterable[Any]) -> Scope:
    """A scope over the equations of a trace being recorded (their operands are tracers;
    a constant one's value is read where it is asked for)."""
    scope = Scope(eqns, _jaxpr_operands)

    def operands_of(eqn: Any) -> list[object]:
        found: list[object] = []
        for tracer in _compat.operand_tracers(eqn):
            var = _compat.jaxpr_var_of(tracer)
            scope.tracers[id(var)] = tracer
            found.append(var)
        return found

    scope.operands_of = operands_of
    return scope


def _runs_with_caller(eqn: Any) -> bool:
    """Whether the blocks of ``eqn`` run whenever ``eqn`` does: a call, a ``run_scoped``
    body, a scan of static length 1 or more; not a branch, a while loop's body (it may
    run no time) or a block of a primitive not known here."""
    name = eqn.primitive.name
    if name == "scan":
        length = eqn.params.get("length")
        return isinstance(length, int) and length >= 1
    return name in _CALLS or name == "run_scoped"


def _inner(value: object) -> Any:
    return getattr(value, "jaxpr", value)


class _OutOfBudget(Exception):
    pass


class Ranges:
    """Spans and identities of index expressions, memoised per scope.

    ``bounds=False``: spans that hold whatever a loop's or the grid's bounds are (a
    loop index, ``program_id`` and ``axis_index`` unknown): what an index is in any
    iteration it runs in, for a copy that may not run in every one."""

    def __init__(self, *, bounds: bool = True) -> None:
        self.bounds = bounds
        self._memo: dict[tuple[int, int], Span] = {}
        self._keys: dict[tuple[int, int], Hashable] = {}  # shared subexpressions: once
        self._children: dict[tuple[int, int, int], Scope] = {}
        self._keep: list[object] = []  # ids are keys: keep what they name alive
        self._budget = _BUDGET
        self._active = 0  # questions being answered (one asks others: loop bounds)
        self._under_facts: dict[tuple[int, int, int], Span] = {}
        self._facts_alive: list[object] = []

    # ------------------------------------------------------------------ blocks

    def enter(self, eqn: Any, scope: Scope, jaxpr: Any) -> Scope:
        """The scope of block ``jaxpr`` of ``eqn`` (an equation of ``scope``): its inputs
        bound to what they receive, where that is known."""
        key = (id(eqn), id(jaxpr), id(scope))
        found = self._children.get(key)
        if found is None:
            found = Scope(jaxpr.eqns, _jaxpr_operands)
            self._keep += [eqn, jaxpr, scope]
            self._children[key] = found
            try:
                self._bind(eqn, scope, jaxpr, found)
            except _OutOfBudget:
                pass
            # Spans read while binding saw the block's inputs still unbound (a carry's
            # step may read the loop index itself): not kept.
            self._memo.clear()
            found.always = scope.always and _runs_with_caller(eqn)
        return found

    def _bind(self, eqn: Any, scope: Scope, jaxpr: Any, inner: Scope) -> None:
        name, params = eqn.primitive.name, eqn.params
        operands = scope.operands_of(eqn)
        inputs = [*jaxpr.constvars, *jaxpr.invars]

        def outer(var: object, k: int) -> None:
            if 0 <= k < len(operands):
                inner.inputs[id(var)] = _Outer(operands[k], scope)

        if name == "cond":
            for i, var in enumerate(jaxpr.invars):
                outer(var, i + 1)
        elif name in _CALLS or name == "run_scoped":
            if len(jaxpr.constvars) == 0 and len(jaxpr.invars) >= len(operands):
                for i, var in enumerate(jaxpr.invars[: len(operands)]):
                    outer(var, i)
            elif len(jaxpr.constvars) == len(operands):
                for i, var in enumerate(jaxpr.constvars):
                    outer(var, i)
        elif name == "emit_pipeline":
            consts = _compat.pipeline_body_consts(params, len(operands))
            if consts is not None and len(consts) == len(jaxpr.constvars):
                for var, k in zip(jaxpr.constvars, consts):
                    outer(var, k)
        elif name == "scan" and jaxpr is _inner(params.get("jaxpr")):
            layout = _compat.scan_layout(params, len(operands))
            if layout is None or len(jaxpr.constvars) or len(jaxpr.invars) != len(operands):
                return
            nconsts, ncarry = layout
            for i in range(nconsts):
                outer(inputs[i], i)
            self._carries(
                inner, scope, operands, nconsts, ncarry, jaxpr, trips=int(params["length"])
            )
        elif name == "while":
            cn, bn = int(params["cond_nconsts"]), int(params["body_nconsts"])
            body, cond = _inner(params["body_jaxpr"]), _inner(params["cond_jaxpr"])
            if len(body.constvars) or len(cond.constvars):
                return
            ncarry = len(operands) - cn - bn
            if jaxpr is body:
                for i in range(bn):
                    outer(body.invars[i], cn + i)
                carries = operands[cn + bn :]
                self._carries(
                    inner,
                    scope,
                    [*operands[cn : cn + bn], *carries],
                    bn,
                    ncarry,
                    body,
                    cond=(cond, self.enter(eqn, scope, cond), cn),
                )
            elif jaxpr is cond:
                for i in range(cn):
                    outer(cond.invars[i], i)
                for j in range(ncarry):
                    if body.outvars[j] is body.invars[bn + j]:  # passed on unchanged
                        outer(cond.invars[cn + j], cn + bn + j)

    def _carries(
        self,
        inner: Scope,
        scope: Scope,
        operands: list[object],
        nconsts: int,
        ncarry: int,
        body: Any,
        *,
        trips: int | None = None,
        cond: tuple[Any, Scope, int] | None = None,
    ) -> None:
        """Bind a loop body's carries: one passed on unchanged is its initial value; a
        loop index (the body adds a constant of one sign to it) lies within the loop's
        bounds; any other is unknown (unbound)."""
        invars = body.invars
        steps: dict[int, Span] = {}
        for j in range(ncarry):
            var, out = invars[nconsts + j], body.outvars[j]
            if out is var:
                inner.inputs[id(var)] = _Outer(operands[nconsts + j], scope)
                continue
            made = inner.definition(out)
            if made is None or made[0].primitive.name not in ("add", "sub"):
                continue
            eqn = made[0]
            a, b = eqn.invars
            if eqn.primitive.name == "add" and b is var:
                a, b = b, a
            if a is not var or b is var:
                continue
            step = self.span(b, inner)  # the index itself is still unbound: no cycle
            steps[j] = _neg(step) if eqn.primitive.name == "sub" else step
        for j, step in steps.items():
            first = self.span(operands[nconsts + j], scope)
            span = self._index_span(first, step, trips, cond, j)
            if span is not None:
                inner.inputs[id(invars[nconsts + j])] = span

    def _index_span(
        self,
        first: Span,
        step: Span,
        trips: int | None,
        cond: tuple[Any, Scope, int] | None,
        j: int,
    ) -> Span | None:
        """The values loop index ``j`` takes at the top of the body: from ``first`` on by
        ``step`` per iteration, for ``trips`` iterations (a scan) or while the loop's
        condition ``i < bound`` (``<=``; ``>`` / ``>=`` counting down) holds."""
        rising = step[0] is not None and step[0] > 0
        falling = step[1] is not None and step[1] < 0
        if not (rising or falling):
            return None
        if trips is not None:
            if trips <= 0:
                return first
            return _join(first, _add(first, _mul(step, (trips - 1, trips - 1))))
        if cond is None:
            return None
        jaxpr, cond_scope, cn = cond
        if len(jaxpr.outvars) != 1 or cn + j >= len(jaxpr.invars):
            return None
        var = jaxpr.invars[cn + j]
        made = cond_scope.definition(jaxpr.outvars[0])
        if made is None or len(made[0].invars) != 2:
            return None
        name, (a, b) = made[0].primitive.name, made[0].invars
        if b is var and name in _FLIP:
            a, b, name = b, a, _FLIP[name]
        if a is not var or b is var or name not in _FLIP:
            return None
        # The body runs only where the condition holds: at its top the index is past
        # neither its first value nor the bound (where they cross, it never runs).
        bound = self.span(b, cond_scope)
        if rising and name in ("lt", "le") and bound[1] is not None:
            hi = bound[1] - (1 if name == "lt" else 0)
            return (first[0], hi if first[0] is None else max(hi, first[0]))
        if falling and name in ("gt", "ge") and bound[0] is not None:
            lo = bound[0] + (1 if name == "gt" else 0)
            return (lo if first[1] is None else min(lo, first[1]), first[1])
        return None

    # ------------------------------------------------------------------ values

    def _resolve(self, operand: object, scope: Scope) -> tuple[object, Scope]:
        """Follow a block input out to the caller's operand it is."""
        for _ in range(64):
            if not _compat.is_jaxpr_var(operand):
                break
            bound = scope.inputs.get(id(operand))
            if not isinstance(bound, _Outer):
                break
            operand, scope = bound.operand, bound.scope
        return operand, scope

    def span(
        self, operand: object, scope: Scope, facts: Mapping[tuple[int, int], Span] | None = None
    ) -> Span:
        """The values ``operand`` (a variable or literal of ``scope``) can take; UNKNOWN
        where they are not known. ``facts``: spans variables are known to lie in (one case
        of a ``select_n``), by (variable id, scope id)."""
        if self._active == 0:  # a question, not one asked while answering another
            self._budget = _BUDGET
            self._under_facts.clear()
            self._facts_alive.clear()
        self._active += 1
        try:
            return self._span(operand, scope, facts or {})
        except (_OutOfBudget, RecursionError):
            return UNKNOWN
        finally:
            self._active -= 1

    def _span(self, operand: object, scope: Scope, facts: Mapping[tuple[int, int], Span]) -> Span:
        operand, scope = self._resolve(operand, scope)
        if not _compat.is_jaxpr_var(operand):
            return _literal(operand)
        key = (id(operand), id(scope))
        if not facts and key in self._memo:
            return self._memo[key]
        # Under facts (one case of a select_n), spans are kept for that case only.
        under = (id(operand), id(scope), id(facts))
        if facts and under in self._under_facts:
            return self._under_facts[under]
        self._budget -= 1
        if self._budget < 0:
            raise _OutOfBudget
        span = self._compute(operand, scope, facts)
        known = facts.get(key)
        if known is not None:
            span = _meet(span, known) or span
        if not facts:
            self._memo[key] = span
            self._keep.append(operand)
        else:
            self._under_facts[under] = span
            self._facts_alive += [facts, operand]  # ids are keys: alive for the question
        return span

    def _compute(self, var: object, scope: Scope, facts: Mapping[tuple[int, int], Span]) -> Span:
        tracer = scope.tracers.get(id(var))
        if tracer is not None and _dtype_bounds(var) is not None:
            constant = _literal(tracer)
            if constant != UNKNOWN:
                return constant
        bound = scope.inputs.get(id(var))
        if bound is not None and not isinstance(bound, _Outer):
            return bound if self.bounds else (_dtype_bounds(var) or UNKNOWN)
        made = scope.definition(var)
        if made is None:
            return _dtype_bounds(var) or UNKNOWN
        eqn, k = made
        bounds = _dtype_bounds(var)
        if bounds is None:
            return UNKNOWN
        span = self._transfer(eqn, k, scope, facts)
        return _fits(span, bounds)

    def _transfer(
        self, eqn: Any, k: int, scope: Scope, facts: Mapping[tuple[int, int], Span]
    ) -> Span:
        name, params = eqn.primitive.name, eqn.params
        operands = scope.operands_of(eqn)

        def arg(i: int) -> Span:
            return self._span(operands[i], scope, facts)

        if name in ("add", "sub", "mul", "max", "min", "rem", "div", "and", "or", "xor"):
            if len(operands) != 2:
                return UNKNOWN
            a, b = arg(0), arg(1)
            return _binary(name, a, b, _is_bool(eqn.outvars[0]))
        if name in ("eq", "ne", "lt", "le", "gt", "ge"):
            return _compare(name, arg(0), arg(1))
        if name == "neg":
            return _neg(arg(0))
        if name == "abs":
            a = arg(0)
            if a[0] is not None and a[0] >= 0:
                return a
            return (0, None if None in a else max(abs(a[0] or 0), abs(a[1] or 0)))
        if name == "sign":
            return (-1, 1)
        if name == "not":
            a = arg(0)
            return (
                (1 - (a[1] or 0), 1 - (a[0] or 0))
                if _is_bool(eqn.outvars[0])
                else _add(_neg(a), (-1, -1))
            )
        if name == "clamp":
            lo, x, hi = arg(0), arg(1), arg(2)
            return _binary("min", _binary("max", x, lo, False), hi, False)
        if name in (
            "convert_element_type",
            "copy",
            "copy_p",
            "squeeze",
            "reshape",
            "broadcast_in_dim",
        ):
            if _dtype_bounds(eqn.invars[0]) is None:
                return UNKNOWN
            return arg(0)
        if name == "select_n":
            return self._select(eqn, operands, scope, facts)
        if name in ("program_id", "axis_index") and not self.bounds:
            return UNKNOWN
        if name == "program_id":
            axis = params.get("axis")
            size = _compat.grid_size(axis) if isinstance(axis, int) and axis >= 0 else None
            return UNKNOWN if size is None or size < 1 else (0, size - 1)
        if name == "axis_index":
            return _axis_index(params.get("axis_name"))
        if name in _CALLS:
            jaxpr = _called(params)
            if jaxpr is None or k >= len(jaxpr.outvars):
                return UNKNOWN
            inner = self.enter(eqn, scope, jaxpr)
            return self._span(jaxpr.outvars[k], inner, facts)
        if name == "cond":
            branches = [_inner(b) for b in params.get("branches", ())]
            which = arg(0)
            spans = [
                self._span(b.outvars[k], self.enter(eqn, scope, b), facts)
                for i, b in enumerate(branches)
                if k < len(b.outvars) and _meet(which, (i, i)) is not None
            ]
            if not spans:
                return UNKNOWN
            out = spans[0]
            for other in spans[1:]:
                out = _join(out, other)
            return out
        return UNKNOWN

    def _select(
        self, eqn: Any, operands: list[object], scope: Scope, facts: Mapping[tuple[int, int], Span]
    ) -> Span:
        """The join of the cases ``select_n`` can pick, each under what the predicate
        says when it picks that case."""
        which = self._span(operands[0], scope, facts)
        cases = operands[1:]
        out: Span | None = None
        for i, case in enumerate(cases):
            if _meet(which, (i, i)) is None:
                continue
            known = dict(facts)
            if len(cases) == 2 and _is_bool(eqn.invars[0]):
                implied = self._facts(operands[0], scope, bool(i), facts)
                if implied is None:
                    continue  # this case cannot be picked
                for key, span in implied.items():
                    now = known.get(key)
                    met = span if now is None else _meet(now, span)
                    if met is None:
                        met = span
                    known[key] = met
            span = self._span(case, scope, known)
            out = span if out is None else _join(out, span)
        return UNKNOWN if out is None else out

    def _facts(
        self, pred: object, scope: Scope, truth: bool, facts: Mapping[tuple[int, int], Span]
    ) -> dict[tuple[int, int], Span] | None:
        """Spans that variables lie in whenever boolean ``pred`` is ``truth`` ({}: none
        known), by (variable id, scope id); None: ``pred`` is never ``truth``."""
        pred, scope = self._resolve(pred, scope)
        value = self._span(pred, scope, facts)
        if value == ((0, 0) if truth else (1, 1)):
            return None
        if not _compat.is_jaxpr_var(pred):
            return {}
        made = scope.definition(pred)
        if made is None:
            return {}
        eqn = made[0]
        name = eqn.primitive.name
        operands = scope.operands_of(eqn)
        if name == "not":
            return self._facts(operands[0], scope, not truth, facts)
        if name in ("and", "or") and len(operands) == 2:
            both = (name == "and") == truth  # both hold, or one of them does
            parts = [self._facts(o, scope, truth, facts) for o in operands]
            if both:
                if any(p is None for p in parts):
                    return None
                return _merge(*(p or {} for p in parts))
            live = [p for p in parts if p is not None]
            if not live:
                return None
            return _either(live)
        if name in ("eq", "ne", "xor", "lt", "le", "gt", "ge") and len(operands) == 2:
            if _is_bool(eqn.invars[0]) and name in ("eq", "ne", "xor"):
                # A comparison of booleans: with one side known, the other is fixed.
                for mine, other in ((0, 1), (1, 0)):
                    c = _const(self._span(operands[other], scope, facts))
                    if c is not None:
                        same = (name == "eq") == truth
                        return self._facts(operands[mine], scope, same == bool(c), facts)
                return {}
            return self._comparison(name, truth, operands, scope, facts)
        return {}

    def _comparison(
        self,
        name: str,
        truth: bool,
        operands: list[object],
        scope: Scope,
        facts: Mapping[tuple[int, int], Span],
    ) -> dict[tuple[int, int], Span]:
        a, b = operands
        if not truth:
            name = _NEGATE[name]
        if name == "ne":
            return {}
        sa, sb = self._span(a, scope, facts), self._span(b, scope, facts)
        found: dict[tuple[int, int], Span] = {}

        def note(x: object, span: Span) -> None:
            x, where = self._resolve(x, scope)
            if _compat.is_jaxpr_var(x):
                found[(id(x), id(where))] = span

        if name == "eq":
            note(a, sb)
            note(b, sa)
        elif name in ("lt", "le"):
            gap = 1 if name == "lt" else 0
            note(a, (None, None if sb[1] is None else sb[1] - gap))
            note(b, (None if sa[0] is None else sa[0] + gap, None))
        elif name in ("gt", "ge"):
            gap = 1 if name == "gt" else 0
            note(a, (None if sb[0] is None else sb[0] + gap, None))
            note(b, (None, None if sa[1] is None else sa[1] - gap))
        return found

    # ------------------------------------------------------------------ identity

    def key(self, operand: object, scope: Scope) -> Hashable:
        """A key equal for two index expressions that always have one value in a body run:
        one variable, one constant, or the same pure equations over the same inputs."""
        try:
            return self._key(operand, scope, 0)
        except RecursionError:
            operand, scope = self._resolve(operand, scope)
            return ("var", id(operand), id(scope))

    def _key(self, operand: object, scope: Scope, depth: int) -> Hashable:
        operand, scope = self._resolve(operand, scope)
        memo = (id(operand), id(scope))
        if memo not in self._keys:
            self._keys[memo] = self._make_key(operand, scope, depth)
        return self._keys[memo]

    def _make_key(self, operand: object, scope: Scope, depth: int) -> Hashable:
        constant = _const(self.span(operand, scope))
        if constant is not None:
            return ("const", constant)
        if not _compat.is_jaxpr_var(operand):
            return ("literal", repr(operand))
        self._keep.append(operand)
        made = scope.definition(operand)
        if made is None or depth > 32:
            return ("var", id(operand), id(scope))
        eqn, k = made
        name = eqn.primitive.name
        params: Hashable
        if name in _PURE:
            params = tuple(sorted((p, repr(v)) for p, v in eqn.params.items()))
        elif name in _CALLS and _called(eqn.params) is not None and _pure(_called(eqn.params)):
            self._keep.append(_called(eqn.params))
            params = ("call", id(_called(eqn.params)))
        else:
            return ("var", id(operand), id(scope))
        inputs = tuple(self._key(o, scope, depth + 1) for o in scope.operands_of(eqn))
        return (name, params, inputs, k)


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def _literal(operand: object) -> Span:
    """The span of a literal or constant operand: its value if it is an integer."""
    if hasattr(operand, "aval") and _dtype_bounds(operand) is None:
        return UNKNOWN  # a float literal (an infinity has no int)
    if isinstance(operand, float):
        return UNKNOWN
    try:
        value = _compat.literal_int(operand)
        if value is None:
            value = _compat.static_int(operand)
    except (OverflowError, TypeError, ValueError):
        return UNKNOWN
    return UNKNOWN if value is None else (value, value)


def _is_bool(var: object) -> bool:
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    try:
        return dtype is not None and np.dtype(dtype) == np.bool_
    except TypeError:
        return False


def _binary(name: str, a: Span, b: Span, boolean: bool) -> Span:
    if name == "add":
        return _add(a, b)
    if name == "sub":
        return _add(a, _neg(b))
    if name == "mul":
        return _mul(a, b)
    if name in ("max", "min"):
        if name == "max":
            lo = a[0] if b[0] is None else b[0] if a[0] is None else max(a[0], b[0])
            hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
        else:
            lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
            hi = a[1] if b[1] is None else b[1] if a[1] is None else min(a[1], b[1])
        return (lo, hi)
    if name == "rem":
        n = _const(b)
        if n is None or n == 0:
            return UNKNOWN
        m = abs(n) - 1
        if a[0] is not None and a[1] is not None and -m <= a[0] and a[1] <= m:
            return a  # no value reaches n: each is its own remainder
        if a[0] is not None and a[0] >= 0:
            return (0, m if a[1] is None else min(m, a[1]))
        if a[1] is not None and a[1] <= 0:
            return (-m if a[0] is None else max(-m, a[0]), 0)
        return (-m, m)
    if name == "div":
        n = _const(b)
        if n is None or n <= 0 or None in a:
            return UNKNOWN
        return (int((a[0] or 0) / n), int((a[1] or 0) / n))  # truncates toward zero
    if name in ("and", "or", "xor") and boolean:
        ca, cb = _const(a), _const(b)
        if ca is not None and cb is not None:
            value = {"and": ca & cb, "or": ca | cb, "xor": ca ^ cb}[name]
            return (value, value)
        if name == "and" and 0 in (ca, cb):
            return (0, 0)
        if name == "or" and 1 in (ca, cb):
            return (1, 1)
        return (0, 1)
    if name == "and":
        masks = [s[1] for s in (a, b) if s[0] is not None and s[0] >= 0 and s[1] is not None]
        return (0, min(masks)) if masks else UNKNOWN
    if name == "or":
        if a[0] is not None and b[0] is not None and a[0] >= 0 and b[0] >= 0:
            hi = None if a[1] is None or b[1] is None else a[1] + b[1]
            return (max(a[0], b[0]), hi)
        return UNKNOWN
    return UNKNOWN


def _merge(*parts: Mapping[tuple[int, int], Span]) -> dict[tuple[int, int], Span]:
    """Facts that all hold."""
    out: dict[tuple[int, int], Span] = {}
    for part in parts:
        for key, span in part.items():
            now = out.get(key)
            out[key] = span if now is None else (_meet(now, span) or span)
    return out


def _either(parts: list[dict[tuple[int, int], Span]]) -> dict[tuple[int, int], Span]:
    """Facts that hold when one of ``parts`` does: a variable each of them bounds, by
    the join of its spans."""
    keys = set(parts[0]).intersection(*parts[1:])
    out: dict[tuple[int, int], Span] = {}
    for key in keys:
        span = parts[0][key]
        for part in parts[1:]:
            span = _join(span, part[key])
        out[key] = span
    return out


def _called(params: Mapping[str, Any]) -> Any:
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if name in params:
            jaxpr = _inner(params[name])
            if _compat.is_jaxpr(jaxpr):
                return jaxpr
    return None


def _pure(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _PURE:
            continue
        inner = _called(eqn.params) if name in _CALLS else None
        if inner is None or not _pure(inner):
            return False
    return True


def _axis_index(axis_name: object) -> Span:
    names: tuple[object, ...] = (
        cast("tuple[object, ...]", axis_name) if isinstance(axis_name, tuple) else (axis_name,)
    )
    sizes = _compat.axes_in_scope()
    total = 1
    for name in names:
        size = sizes.get(str(name))
        if size is None:
            return UNKNOWN
        total *= size
    return (0, total - 1) if total >= 1 else UNKNOWN


# ------------------------------------------------------------------ slots


@dataclasses.dataclass(frozen=True)
class Index:
    """One dimension of a semaphore view: the positions ``lo``..``hi`` (inclusive, within
    the dimension) its index can take, and its identity (None: none known)."""

    lo: int
    hi: int
    key: Hashable = None

    def meets(self, other: Index) -> bool:
        if self.key is not None and self.key == other.key:
            return True
        return self.lo <= other.hi and other.lo <= self.hi

    @property
    def static(self) -> bool:
        return self.lo == self.hi

    def __str__(self) -> str:
        return str(self.lo) if self.static else f"{self.lo}..{self.hi}"


def index_of(
    index: object, size: int, span: Span, key: Hashable = None, *, literal: bool = False
) -> Index:
    """Dimension ``size``'s :class:`Index` for an index in ``span``: the whole dimension
    where the span is not within it (an index outside its array is no slot a check can
    name). A ``literal`` negative index counts from the end, as ``sems.at[-1]`` does."""
    lo, hi = span
    if literal and lo is not None and lo == hi and -size <= lo < 0:
        lo = hi = lo + size
    if lo is None or hi is None or lo < 0 or hi >= size:
        return Index(0, size - 1, None)
    if lo == hi:
        key = ("const", lo)
    return Index(lo, hi, key)


def flat_positions(
    indices: list[Index], shape: tuple[int, ...], most: int = 4096
) -> frozenset[int] | None:
    """The flat positions (row-major) a view with these per-dimension indices can be;
    None where there would be more than ``most``."""
    count = 1
    for index in indices:
        count *= index.hi - index.lo + 1
    if count > most or len(indices) != len(shape):
        return None
    strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
    return frozenset(
        sum(p * s for p, s in zip(point, strides))
        for point in itertools.product(*(range(i.lo, i.hi + 1) for i in indices))
    )


class BodySlots:
    """The slots typed-API semaphore views (whose indices are tracers) can be, read from
    the equations of the body traced into ``frame`` and of the traces around it, once
    the body is traced (a loop's bounds are known once the loop is an equation)."""

    def __init__(self, frame: object, *, bounds: bool = True) -> None:
        self.ranges = Ranges(bounds=bounds)
        self._frames: list[object] = []
        current: object | None = frame
        while current is not None:
            self._frames.append(current)
            current = _compat.frame_parent(current)
        self._walked = 0
        self._scopes: dict[int, list[Scope]] = {}

    def _walk(self, scope: Scope) -> None:
        for eqn in scope.eqns:
            for out in eqn.outvars:
                self._scopes.setdefault(id(out), []).append(scope)
            for jaxpr in _compat.sub_jaxprs(eqn.params):
                inner = self.ranges.enter(eqn, scope, jaxpr)
                for var in [*jaxpr.constvars, *jaxpr.invars]:
                    self._scopes.setdefault(id(var), []).append(inner)
                self._walk(inner)

    def _where(self, var: object) -> list[Scope]:
        while id(var) not in self._scopes and self._walked < len(self._frames):
            frame = self._frames[self._walked]
            self._walked += 1
            self._walk(top_scope(_compat.traced_eqns(frame)))
        return self._scopes.get(id(var), [])

    def span(self, index: object) -> Span:
        """The values a view's index (an int or a tracer) can take."""
        constant = _literal(index)
        if constant != UNKNOWN or not hasattr(index, "aval"):
            return constant
        var = _compat.jaxpr_var_of(index)
        scopes = self._where(var) if var is not None else []
        if not scopes:
            return UNKNOWN
        out = self.ranges.span(var, scopes[0])
        for scope in scopes[1:]:
            out = _join(out, self.ranges.span(var, scope))
        return out

    def runs_always(self, record: object) -> bool:
        """Whether the block whose equations ``record`` holds (``_compat.eqn_record`` of
        the trace a copy was started in) runs on every run of the body (Scope.always);
        False where it is not found."""
        for eqn in _compat.recorded_eqns(record):
            for tracer in _compat.operand_tracers(eqn):
                var = _compat.jaxpr_var_of(tracer)
                scopes = self._where(var) if _compat.is_jaxpr_var(var) else []
                if scopes:
                    return all(scope.always for scope in scopes)
        return False

    def positions(self, view: object) -> frozenset[int] | None:
        """The flat positions of its root array ``view`` can be (None: any)."""
        axes = _compat.view_index_axes(view)
        if axes is None:
            return None
        indices = [
            index_of(i, size, self.span(i), literal=not hasattr(i, "aval")) for i, size in axes
        ]
        return flat_positions(indices, tuple(size for _, size in axes))
