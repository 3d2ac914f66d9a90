"""Jaxprs compiled once into lists of small closures, run per participant as generators.

An op is ``op(env, ctx)`` (``context.Op``); it returns None, or a generator when it
may block (a wait) or runs a sub-program (cond, loops, calls). Only scalars are
computed; vectors are :data:`VECTOR`; refs are ``context.RefVal``. The walk adds the
rules of the primitives that touch its state with :func:`register`.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import (
    OutOfBoundsDmaError,
    SemaphoreIndexError,
    VerificationUnsupportedError,
    VerifiedRaceError,
    VerifyKernelError,
)
from safedma.testing._verify.model.regions import (
    Box,
    Buffer,
    RegionError,
    UnsupportedView,
    View,
    overlaps,
    resolve,
)
from safedma.testing._verify.model.semantics import Machine
from safedma.testing._verify.model.termination import memory_free, same_state
from safedma.testing._verify.program.context import Ctx, Gen, InFlight, Op, RefVal
from safedma.testing._verify.program.output_reads import (
    PLACEMENT,
    DimMap,
    OutReads,
    Reader,
    dim_maps,
    layout_reads,
)
from safedma.testing._verify.program.patchy import Patchy, carry
from safedma.testing._verify.program.scalars import (
    VECTOR,
    Partial,
    Unknown,
    lost_by,
    scalar_rule,
    unknown_result,
)

__all__ = [
    "Compiled",
    "Compiler",
    "cast_to",
    "compile_jaxpr",
    "kernel_of",
    "location",
    "need_int",
    "register",
    "run",
    "run_plain",
    "view_of",
]


class Compiled:
    __slots__ = ("nslots", "invars", "outvars", "ops", "consts", "eqns")

    def __init__(self) -> None:
        self.nslots = 0
        self.invars: list[int] = []
        self.outvars: list[tuple[bool, Any]] = []
        self.ops: list[Op] = []
        self.consts: list[object] = []
        self.eqns: list[Any] = []  # the equation of each op, for error locations


# Compiled bodies by jaxpr (a loop body or kernel compiled once however often it runs,
# and again only if jax traces it anew). Bounded, least recently used dropped first:
# each entry keeps its jaxpr alive, so an unbounded cache grows with every program a
# process verifies (a test suite, a benchmark calling verify hundreds of times).
_CACHE: OrderedDict[tuple[int, bool, bool, object], tuple[Any, Compiled]] = OrderedDict()
_CACHE_SIZE = 512
_OUTER_LIMIT = 1 << 16  # elements of an array computed concretely outside kernels
_INNER_LIMIT = 1 << 10  # elements of a known vector computed inside a kernel


def _vector_op(name: str, ins: list[tuple[bool, Any]], outs: list[int]) -> Op:
    """Vector data out; the origin of an unknown input (a load from a named ref) is kept
    so a predicate or index computed from it says where it came from, and garbage is
    followed through the primitives that keep it (``unknown_result``)."""
    slots = [x for is_var, x in ins if is_var]

    def vector(env: list[Any], ctx: Ctx) -> None:
        why = unknown_result(name, [env[x] for x in slots])
        for s in outs:
            env[s] = why

    return vector


def _lazy_location(eqn: Any) -> Callable[[], str]:
    """``location(eqn)``, found when a message first needs it (and kept)."""
    found: list[str] = []
    enclosing, in_kernel = [f[:] for f in _ENCLOSING], bool(_IN_KERNEL)

    def where() -> str:
        if not found:
            saved, saved_in = _ENCLOSING[:], _IN_KERNEL[:]
            _ENCLOSING[:] = enclosing
            _IN_KERNEL[:] = [True] if in_kernel else []
            try:
                found.append(location(eqn))
            finally:
                _ENCLOSING[:], _IN_KERNEL[:] = saved, saved_in
        return found[0]

    return where


def _outer_array(v: Any, aval: Any) -> Any:
    """A value outside the kernels as the operation sees it: a kernel's output (or an
    argument) whose every element the verifier knows is that array; one it does not
    know is an unknown naming where it came from (the argument given as a shape)."""
    if not isinstance(v, RefVal):
        return v
    buf = v.buffer
    if v.steps or buf.sem_kind is not None:
        return v
    values = buf.values
    if values is not None and not any(isinstance(x, Unknown) for x in values):
        try:
            return np.asarray(values, dtype=aval.dtype).reshape(buf.shape)
        except (TypeError, ValueError, AttributeError):
            return v
    if values is not None:
        return next(x for x in values if isinstance(x, Unknown))
    if buf.origin is not None:
        return Unknown(buf.origin)
    return v


def _refused(message: str) -> Op:
    """An op that refuses the program when it is reached (the message says why and
    where); compiling alone refuses nothing, since the walk may never take that path."""

    def refuse(env: list[Any], ctx: Ctx) -> None:
        raise VerificationUnsupportedError(message)

    return refuse


def _calls_kernels(eqn: Any) -> bool:
    """Whether a primitive's sub-jaxprs call a kernel: one the verifier has no rule for
    would otherwise be evaluated as an XLA operation and its kernels never run."""
    return any(
        e.primitive.name in ("pallas_call", "mpmd_map")
        for sub in _jax.sub_jaxprs(eqn.params)
        for e in _jax.all_eqns(_jax.jaxpr_of(sub)[0])
    )


def _effect_free(eqn: Any) -> bool:
    """A primitive whose only result is its outputs (safe to evaluate on known values)."""
    return not getattr(eqn, "effects", None) and not any(True for _ in _jax.sub_jaxprs(eqn.params))


def compile_jaxpr(
    jaxpr: Any,
    consts: Sequence[object] = (),
    outer: bool = False,
    consts_are_args: bool = False,
    kernel_body: bool = False,
    out_reads: OutReads = None,
) -> Compiled:
    """``jaxpr`` as closures; ``outer`` for the program around the kernels, where small
    arrays built from known values (page tables, flags) are computed concretely.
    ``consts_are_args``: the constvars are fed by the equation's operands (run_scoped
    in jax 0.12), not by constants. ``kernel_body``: the body of a kernel, whose
    equations' lines are named up to the kernel function and no further out.
    ``out_reads``: what the caller reads of each result (a nested jit's), None: all."""
    key = (id(jaxpr), outer, consts_are_args, out_reads)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is jaxpr:
        _CACHE.move_to_end(key)
        return hit[1]
    if kernel_body:
        saved = _ENCLOSING[:]
        _ENCLOSING.clear()
        _IN_KERNEL.append(True)
        try:
            c = Compiler(jaxpr, outer).compiled
        finally:
            _IN_KERNEL.pop()
            _ENCLOSING[:] = saved
    else:
        c = Compiler(jaxpr, outer, out_reads).compiled
    values = [_const(v, outer) for v in consts]
    nconst = 0 if consts_are_args else len(jaxpr.constvars)
    c.consts = (values + [VECTOR] * nconst)[:nconst]
    _CACHE[key] = (jaxpr, c)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return c


def _const(v: object, outer: bool = False) -> object:
    try:
        import numpy as np

        a = np.asarray(v)
        if a.dtype.kind not in "biuf":
            return VECTOR
        if a.shape == ():
            return a.item()
        if outer and a.size <= _OUTER_LIMIT:
            return a
    except Exception:
        pass
    return VECTOR


def run(c: Compiled, args: Sequence[object], ctx: Ctx) -> Gen:
    env: list[Any] = [None] * c.nslots
    slots = c.invars
    nconst = len(c.consts)
    for i, v in enumerate(c.consts):
        env[slots[i]] = v
    for s, v in zip(slots[nconst:], args):
        env[s] = v
    op: Op | None = None
    try:
        for op in c.ops:
            g = op(env, ctx)
            if g is not None:
                yield from g
    except (VerificationUnsupportedError, VerifyKernelError) as err:
        if op is not None:
            _locate(err, c.eqns[c.ops.index(op)])
        raise
    return [env[a] if is_var else a for is_var, a in c.outvars]


def _locate(err: Exception, eqn: Any) -> None:
    """Name the user's line in an error raised without one (the innermost equation wins)."""
    if vars(err).get("_located") or not err.args:
        return
    where = location(eqn)
    if where.startswith("<"):
        return  # no user frame here (jax-internal code): the enclosing equation names it
    msg = str(err.args[0])
    if where not in msg:
        err.args = (f"{msg} [at {where}]", *err.args[1:])
    vars(err)["_located"] = True


def run_plain(c: Compiled, args: Sequence[object], ctx: Ctx) -> list[Any]:
    """Run a program that cannot block (index maps, scalar helpers)."""
    g = run(c, args, ctx)
    try:
        next(g)
    except StopIteration as stop:
        return list(stop.value)
    raise VerificationUnsupportedError("an index map or scalar helper waited on a semaphore")


def location(eqn: Any, guard: bool = False) -> str:
    """The user's line of ``eqn``, with the kernel lines that called its helper; for an
    equation jax built with no user frame (the copies inside ``pltpu.sync_copy``), the
    line of the user's call that holds it. jax records an equation's frames only up to
    the body it was traced in, so the frames of the equations enclosing it count too.
    ``guard``: with the line of the ``pl.when``/``lax.cond`` it runs under (copy starts)."""
    frames = _jax.traceback_frames(eqn.source_info)
    for outer in reversed(_ENCLOSING):
        frames.extend(outer)
    found = _jax.user_frame_of(frames, whole_kernel=bool(_IN_KERNEL), guard=guard)
    if found:
        return found
    # a kernel handed to verify with no user frame around it: where it is defined
    return _jax.kernel_def_line(eqn) or f"<{eqn.primitive.name}>"


# Frames of the equations whose bodies are being compiled, innermost last (``location``).
_ENCLOSING: list[list[Any]] = []
# Non-empty while a kernel body is compiled: its equations' frames plus _ENCLOSING reach
# exactly the kernel function (jax cuts a body's frames where its trace began).
_IN_KERNEL: list[bool] = []


@contextlib.contextmanager
def locating_from_the_kernel_top() -> Generator[None, None, None]:
    """Locate equations (``location``) as while a kernel body is compiled from its top,
    whatever is being compiled now: the lockstep path names a ``run_scoped`` region's
    buffers by the line the per-device walk gives them."""
    saved, saved_in = _ENCLOSING[:], _IN_KERNEL[:]
    _ENCLOSING.clear()
    _IN_KERNEL[:] = [True]
    try:
        yield
    finally:
        _ENCLOSING[:], _IN_KERNEL[:] = saved, saved_in


@contextlib.contextmanager
def inside_body_of(eqn: Any) -> Generator[None, None, None]:
    """Locate equations as inside ``eqn``'s body (its frames enclose theirs)."""
    _ENCLOSING.append(_jax.traceback_frames(eqn.source_info))
    try:
        yield
    finally:
        _ENCLOSING.pop()


def _is_scalar(aval: Any) -> bool:
    return getattr(aval, "shape", None) == () and not _jax.is_ref_aval(aval)


class Compiler:
    def __init__(self, jaxpr: Any, outer: bool = False, out_reads: OutReads = None) -> None:
        self.outer = outer
        self.jaxpr = jaxpr
        self.out_reads = out_reads
        self._slice_reads: dict[Any, tuple[Box, ...] | None] | None = None
        self._read_by: dict[Any, Reader] = {}
        self.slots: dict[Any, int] = {}
        self.compiled = c = Compiled()
        for v in jaxpr.constvars:
            c.invars.append(self.slot(v))
        for v in jaxpr.invars:
            c.invars.append(self.slot(v))
        for eqn in jaxpr.eqns:
            c.ops.append(self.op(eqn))
            c.eqns.append(eqn)
        c.outvars = [self.atom(a) for a in jaxpr.outvars]
        c.nslots = len(self.slots)

    def read_boxes(self, v: Any) -> tuple[tuple[tuple[int, int], ...], ...] | None:
        """The parts of array ``v`` this program reads, when only layout, element-wise,
        row-keeping (a contraction over other dimensions) equations and calls lead from
        it to every use that reads it (a wrapper that drops a kernel's padding rows);
        None: all of it; (): none (only kernels' data inputs take it, docs/verify-model.md
        rule 12)."""
        return self._reads().get(v)

    def _reads(self) -> dict[Any, tuple[Box, ...] | None]:
        if self._slice_reads is None:
            self._slice_reads = layout_reads(self.jaxpr, self.out_reads, self._read_by)
        return self._slice_reads

    def read_by(self, v: Any) -> str:
        """Who reads array ``v`` outside the kernels, for messages ("" when it is only
        the program's result, or a kernel's)."""
        self._reads()
        reader = self._read_by.get(v)
        if reader is None or reader[1] is None:
            return ""
        eqn = reader[1]
        return f"{eqn.primitive.name} at {location(eqn)}"

    def is_read(self, v: Any) -> bool:
        """Whether this program reads array ``v`` at all (a kernel output the wrapper
        drops is not: no equation uses it and the program does not return it)."""
        return v in self._reads()

    def slot(self, v: Any) -> int:
        s = self.slots.get(v)
        if s is None:
            s = self.slots[v] = len(self.slots)
        return s

    def atom(self, a: Any) -> tuple[bool, Any]:
        if _jax.is_literal(a):
            val = _jax.literal_value(a)
            return False, _const(val, self.outer)
        return True, self.slot(a)

    def reader(self, a: Any) -> Callable[[list[Any]], Any]:
        is_var, x = self.atom(a)
        if is_var:
            return lambda env: env[x]
        return lambda env: x

    # ------------------------------------------------------------------ ops

    def op(self, eqn: Any) -> Op:
        name = eqn.primitive.name
        builder = _BUILDERS.get(name)
        if builder is None:
            return self.generic(eqn)
        if next(iter(_jax.sub_jaxprs(eqn.params)), None) is None:
            return builder(self, eqn)
        with inside_body_of(eqn):
            return builder(self, eqn)

    def outs(self, eqn: Any) -> list[int]:
        return [self.slot(v) for v in eqn.outvars]

    def generic(self, eqn: Any) -> Op:
        if not _IN_KERNEL and eqn.primitive.name in PLACEMENT:
            return self.placement(eqn)
        op = self._generic(eqn)
        if _IN_KERNEL:
            return op
        # outside kernels: an operation on a kernel's output reads it (_outside_reads)
        arrays = [(k, self.slot(a)) for k, a in enumerate(eqn.invars) if _is_array(a)]
        if not arrays:
            return op
        starts = [self.atom(a) for a in eqn.invars[1:]]  # a dynamic_slice's
        op = _outside_reads(eqn, arrays, starts, op)
        maps = dim_maps(eqn)
        if maps is not None or (
            eqn.primitive.name in ("slice", "transpose", "reshape") and len(eqn.invars) == 1
        ):
            return _keeps_garbage(eqn, maps, arrays, self.outs(eqn)[0], op)
        return op

    def placement(self, eqn: Any) -> Op:
        """A placement primitive outside kernels (``PLACEMENT``): each result is its
        operand, so a kernel output keeps its buffer (a DMA future's destination and
        semaphore reach the kernel that waits them) and a known table its values."""
        if len(eqn.invars) != len(eqn.outvars):
            return self._generic(eqn)
        ins = [self.atom(a) for a in eqn.invars]
        outs = self.outs(eqn)

        def same(env: list[Any], ctx: Ctx) -> None:
            for (is_var, x), s in zip(ins, outs):
                env[s] = env[x] if is_var else x

        return same

    def _generic(self, eqn: Any) -> Op:
        name = eqn.primitive.name
        ins = [self.atom(a) for a in eqn.invars]
        outs = self.outs(eqn)
        out_avals = [v.aval for v in eqn.outvars]
        scalar_out = all(_is_scalar(a) for a in out_avals)
        if any(
            _jax.is_ref_aval(getattr(a, "aval", None)) for a in eqn.invars if not _jax.is_literal(a)
        ):
            return _refused(
                f"the verifier does not model the primitive {name!r} on a ref (at "
                f"{location(eqn)}); check this kernel with safedma.testing.simulate instead"
            )
        if any(
            _jax.is_ref_aval(v.aval)
            for sub in _jax.sub_jaxprs(eqn.params)
            for v in _jax.jaxpr_of(sub)[0].invars
        ):
            return _refused(
                f"{name!r} at {location(eqn)} runs a kernel body the verifier does not model "
                "(it knows pallas_call and pl.kernel over a TensorCoreMesh); check it "
                "with safedma.testing.simulate"
            )
        if not _IN_KERNEL and _calls_kernels(eqn):
            return _refused(
                f"{name!r} at {location(eqn)} calls kernels the verifier does not run (it "
                "follows jit, jax.checkpoint, custom_jvp/custom_vjp, cond, scan and "
                "while); check this program with safedma.testing.simulate"
            )
        if self.outer and outs:
            return self.concrete(eqn, ins, outs)
        if outs and not scalar_out and _effect_free(eqn):
            # small vectors of known values (an iota compared with a row count, a
            # mask of valid rows): computed, since copy sizes and indices come from them
            return self.concrete(eqn, ins, outs, _INNER_LIMIT)
        if not scalar_out or not outs:
            return _vector_op(eqn.primitive.name, ins, outs)
        rule = scalar_rule(name, eqn.params)
        kinds = [getattr(a, "dtype", None) for a in out_avals]
        where = _lazy_location(eqn)

        def scalar(env: list[Any], ctx: Ctx) -> None:
            vals = [env[x] if is_var else x for is_var, x in ins]
            for v in vals:
                if isinstance(v, (Unknown, RefVal)) or v is None:
                    why = lost_by(name, where, v) if isinstance(v, Unknown) else VECTOR
                    for s in outs:
                        env[s] = why
                    return
                if isinstance(v, np.ndarray):
                    break  # a scalar taken from a known small vector: jax computes it
            else:
                if rule is not None and len(outs) == 1:
                    try:
                        env[outs[0]] = cast_to(kinds[0])(rule(*vals))
                        return
                    except (TypeError, ValueError, ArithmeticError):
                        pass
            try:
                res = _jax.bind_concrete(eqn, vals)
            except Exception:
                res = [VECTOR] * len(outs)
            for s, v in zip(outs, res):
                env[s] = v

        if rule is not None and len(outs) == 1 and len(ins) in (1, 2):
            return _fast_scalar(rule, cast_to(kinds[0]), ins, outs[0], scalar)
        return scalar

    def concrete(
        self, eqn: Any, ins: list[tuple[bool, Any]], outs: list[int], limit: int = 0
    ) -> Op:
        """Evaluate small arrays of known values with jax itself (outside kernels up to
        ``_OUTER_LIMIT`` elements, inside up to ``limit``); others are vector data."""
        limit = limit or _OUTER_LIMIT
        name = eqn.primitive.name
        small = all(int(np.prod(getattr(v.aval, "shape", ()))) <= limit for v in eqn.outvars)
        if not small:
            return _vector_op(eqn.primitive.name, ins, outs)
        memo: dict[tuple[Any, ...], list[Any]] = {}
        where = _lazy_location(eqn)
        avals = [getattr(a, "aval", None) for a in eqn.invars]

        def op(env: list[Any], ctx: Ctx) -> None:
            vals = [env[x] if is_var else x for is_var, x in ins]
            if self.outer:
                vals = [_outer_array(v, a) for v, a in zip(vals, avals)]
            known = small and all(
                isinstance(v, (int, float, bool, np.ndarray, np.generic)) for v in vals
            )
            if known:
                key = tuple(_key(v) for v in vals)
                res = memo.get(key)
                if res is None:
                    try:
                        res = _jax.bind_concrete_arrays(eqn, vals)
                    except Exception:
                        res = [VECTOR] * len(outs)
                    memo[key] = res
                for s, v in zip(outs, res):
                    env[s] = v
                return
            partly = small and _partly_known(name, vals)
            if partly:
                for s, v in zip(outs, _partial_results(eqn, vals)):
                    env[s] = v
                return
            why = lost_by(name, where, unknown_result(name, vals))
            for s in outs:
                env[s] = why

        return op

    # --- calls and control flow

    def call(self, eqn: Any, key: str = "jaxpr") -> Op:
        jaxpr, consts = _jax.jaxpr_of(eqn.params[key])
        # what this program reads of the call's results reaches the kernels inside it
        reads = tuple((self.is_read(o), self.read_boxes(o)) for o in eqn.outvars)
        out_reads = None if all(r and b is None for r, b in reads) else reads
        body = compile_jaxpr(jaxpr, consts, self.outer, out_reads=out_reads)
        ins = [self.atom(a) for a in eqn.invars]
        outs = self.outs(eqn)
        pure = (
            not self.outer
            and all(_is_scalar(v.aval) for v in eqn.outvars)
            and not _has_effects(jaxpr)
        )
        memo: dict[tuple[Any, ...], list[Any]] = {}

        def op(env: list[Any], ctx: Ctx) -> Gen | None:
            vals = [env[x] if is_var else x for is_var, x in ins]
            if pure:
                try:
                    k = tuple(vals)
                    hit = memo.get(k)
                except TypeError:
                    k, hit = None, None
                if hit is not None:
                    for s, v in zip(outs, hit):
                        env[s] = v
                    return None
                res = run_plain(body, vals, ctx)
                if k is not None and all(not isinstance(v, (Unknown, RefVal)) for v in vals):
                    memo[k] = res
                for s, v in zip(outs, res):
                    env[s] = v
                return None
            return _call_then(body, vals, outs, env, ctx, eqn, where)

        where: list[str] = []  # the call's line, found when first needed
        return op

    def cond(self, eqn: Any) -> Op:
        branches = [compile_jaxpr(*_jax.jaxpr_of(b)) for b in eqn.params["branches"]]
        index = self.reader(eqn.invars[0])
        ins = [self.reader(a) for a in eqn.invars[1:]]
        outs = self.outs(eqn)
        where = location(eqn)

        def op(env: list[Any], ctx: Ctx) -> Gen:
            i = index(env)
            if isinstance(i, Unknown) or i is None:
                raise _data_dependent("a lax.cond / pl.when predicate", i, where)
            i = max(0, min(int(i), len(branches) - 1))
            return _call_gen(branches[i], [r(env) for r in ins], outs, env, ctx)

        return op

    def scan(self, eqn: Any) -> Op:
        jaxpr, consts = _jax.jaxpr_of(eqn.params["jaxpr"])
        body = compile_jaxpr(jaxpr, consts)
        nconsts, ncarry = _jax.scan_split(eqn.params)
        length = int(eqn.params["length"])
        ins = [self.reader(a) for a in eqn.invars]
        outs = self.outs(eqn)
        nys = len(outs) - ncarry
        where = location(eqn)

        def gen(env: list[Any], ctx: Ctx) -> Gen:
            vals = [r(env) for r in ins]
            cs, carry, xs = (
                vals[:nconsts],
                vals[nconsts : nconsts + ncarry],
                vals[nconsts + ncarry :],
            )
            xs_each = [VECTOR if not isinstance(x, RefVal) else x for x in xs]
            budget = ctx.engine.budget
            for k in range(length):
                budget.check(ctx.engine.labels[ctx.p], where, "loop", k)
                res = yield from run(body, [*cs, *carry, *xs_each], ctx)
                carry = res[:ncarry]
            for s, v in zip(outs, [*carry, *([VECTOR] * nys)]):
                env[s] = v
            return None

        return gen

    def while_(self, eqn: Any) -> Op:
        p = eqn.params
        cond = compile_jaxpr(*_jax.jaxpr_of(p["cond_jaxpr"]))
        body = compile_jaxpr(*_jax.jaxpr_of(p["body_jaxpr"]))
        nc, nb = int(p["cond_nconsts"]), int(p["body_nconsts"])
        ins = [self.reader(a) for a in eqn.invars]
        outs = self.outs(eqn)
        where = location(eqn)
        # a loop whose condition and next state are functions of its state alone: the
        # same state after an iteration means it never ends (model/termination.py)
        stateless = memory_free(_jax.jaxpr_of(p["cond_jaxpr"])[0]) and memory_free(
            _jax.jaxpr_of(p["body_jaxpr"])[0]
        )

        def gen(env: list[Any], ctx: Ctx) -> Gen:
            vals = [r(env) for r in ins]
            cc, bc, carry = vals[:nc], vals[nc : nc + nb], vals[nc + nb :]
            budget = ctx.engine.budget
            k = 0
            while True:
                budget.check(ctx.engine.labels[ctx.p], where, "while loop", k)
                (pred,) = yield from run(cond, [*cc, *carry], ctx)
                if isinstance(pred, Unknown) or pred is None:
                    raise _data_dependent("a while/fori_loop condition (trip count)", pred, where)
                if not pred:
                    break
                before = carry
                carry = yield from run(body, [*bc, *carry], ctx)
                if stateless and same_state(before, carry):
                    raise VerifyKernelError(
                        f"the while loop at {where} never ends on {ctx.engine.labels[ctx.p]}: "
                        f"its condition holds and an iteration leaves its state as it was "
                        f"({_carry_text(carry)}), and nothing it depends on is read from "
                        "memory, so every later iteration is the same (on a TPU the kernel "
                        "hangs). Fix: advance the loop's counter in its body (a fori_loop "
                        "does it for you), or make the condition reach False."
                    )
                k += 1
            for s, v in zip(outs, carry):
                env[s] = v
            return None

        return gen

    def run_scoped(self, eqn: Any) -> Op:
        jaxpr, _ = _jax.jaxpr_of(eqn.params["jaxpr"])
        body = compile_jaxpr(jaxpr, consts_are_args=True)
        ins = [self.reader(a) for a in eqn.invars]
        outs = self.outs(eqn)
        every = [*jaxpr.constvars, *jaxpr.invars]
        avals = [v.aval for v in every[len(eqn.invars) :]]
        key = id(eqn)
        where = location(eqn)

        def gen(env: list[Any], ctx: Ctx) -> Gen:
            n = ctx.scoped_counts.get(key, 0)
            ctx.scoped_counts[key] = n + 1
            kernel = kernel_of(ctx, "pl.run_scoped", where)
            allocs = [
                RefVal(kernel.scoped_buffer(ctx, (key, n, i), aval, where))
                for i, aval in enumerate(avals)
            ]
            res = yield from run(body, [*[r(env) for r in ins], *allocs], ctx)
            sems = [a.buffer for a in allocs if a.buffer.sem_kind is not None]
            if sems:
                kernel.check_scoped_sems(ctx, sems)
            for s, v in zip(outs, res):
                env[s] = v
            return None

        return gen

    # --- indices

    def axis_index(self, eqn: Any) -> Op:
        name: object = eqn.params["axis_name"]
        (out,) = self.outs(eqn)
        names: tuple[str, ...] = (
            tuple(str(n) for n in cast("tuple[object, ...]", name))
            if isinstance(name, tuple)
            else (str(name),)
        )

        def op(env: list[Any], ctx: Ctx) -> None:
            if len(names) == 1 and names[0] in ctx.grid_names:
                env[out] = ctx.grid_point[ctx.grid_names.index(names[0])]
                return
            value = 0
            for n in names:
                size = ctx.engine.axis_sizes.get(n) or ctx.core_sizes.get(n, ctx.engine.cores)
                if n not in ctx.axis_index:
                    raise VerificationUnsupportedError(
                        f"axis {n!r} is neither a mesh axis nor an axis of the running "
                        "pl.kernel mesh"
                    )
                value = value * size + ctx.axis_index[n]
            env[out] = value

        return op

    def program_id(self, eqn: Any) -> Op:
        axis = int(eqn.params["axis"])
        (out,) = self.outs(eqn)

        def op(env: list[Any], ctx: Ctx) -> None:
            axes = ctx.grid_axes
            env[out] = ctx.grid_point[axis if axes is None else axes[axis]]

        return op

    def num_programs(self, eqn: Any) -> Op:
        axis = int(eqn.params["axis"])
        (out,) = self.outs(eqn)

        def op(env: list[Any], ctx: Ctx) -> None:
            axes = ctx.grid_axes
            env[out] = ctx.grid[axis if axes is None else axes[axis]]

        return op

    # --- refs

    def ref_operand(self, x: Any) -> Callable[[list[Any]], RefVal | None]:
        """Resolver for a DMA/semaphore operand: a ref, possibly a TransformedRef."""
        if x is None:
            return lambda env: None
        selected = _jax.select_parts(x)
        if selected is not None:
            return self._selected_ref(*selected)
        base, transforms = _jax.split_transformed(x)
        get_base = self.reader(base)
        steps = [self.transform(t) for t in transforms]

        if not steps:

            def plain_ref(env: list[Any]) -> RefVal | None:
                r = get_base(env)
                return r if isinstance(r, RefVal) else None

            return plain_ref

        def resolve_ref(env: list[Any]) -> RefVal | None:
            r = get_base(env)
            if not isinstance(r, RefVal):
                return None
            return RefVal(r.buffer, r.steps + tuple([s(env) for s in steps]))

        return resolve_ref

    def _selected_ref(
        self, candidates: tuple[Any, ...], index: Any, transforms: tuple[Any, ...]
    ) -> Callable[[list[Any]], RefVal | None]:
        """``pl.select_ref(i, *refs)``: the i-th candidate, i computed per device.

        Mosaic lowers the choice to a chain of ``i == 0`` tests on ``i``, ``i - 1``,
        ... whose last else is the last ref (``_select_to_ifop`` in jax's TPU
        lowering), so an index outside ``[0, len(refs) - 1)`` picks the last ref.
        """
        getters = [self.ref_operand(r) for r in candidates]
        get_index = self.value_getter(index)
        steps = [self.transform(t) for t in transforms]

        def resolve(env: list[Any]) -> RefVal | None:
            i = need_int(get_index(env), "the index of a pl.select_ref")
            r = getters[i if 0 <= i < len(getters) else -1](env)
            if r is None or not steps:
                return r
            return RefVal(r.buffer, r.steps + tuple([s(env) for s in steps]))

        return resolve

    def transform(self, t: Any) -> Callable[[list[Any]], tuple[str, object]]:
        kind, arg = _jax.transform_parts(t)
        if kind == "index":
            indices, int_shape = arg
            parts: list[Callable[[list[Any]], tuple[str, int, int, int]]] = []
            if int_shape:

                def gather(env: list[Any]) -> tuple[str, object]:
                    raise VerificationUnsupportedError(
                        "a ref indexed by an array (gather) in a copy or ref access; the "
                        "verifier models slices and scalar indices only"
                    )

                return gather
            for idx in indices:
                parts.append(self.index_entry(idx))

            def index(env: list[Any]) -> tuple[str, object]:
                return ("index", tuple([p(env) for p in parts]))

            return index
        if kind == "bitcast":
            size = int(arg.itemsize)
            return lambda env: ("bitcast", size)
        if kind in ("reshape", "transpose"):
            return lambda env: (kind, arg)

        def other(env: list[Any]) -> tuple[str, object]:
            raise VerificationUnsupportedError(f"the ref transform {arg}")

        return other

    def index_entry(self, idx: Any) -> Callable[[list[Any]], tuple[str, int, int, int]]:
        if _jax.is_slice(idx):
            start, size, stride = _jax.slice_parts(idx)
            gs, gz = self.value_getter(start), self.value_getter(size)
            st = int(stride) if stride is not None else 1

            def sl(env: list[Any]) -> tuple[str, int, int, int]:
                a, n = gs(env), gz(env)
                if type(a) is not int:
                    a = need_int(a, "a slice start")
                if type(n) is not int:
                    n = need_int(n, "a slice size")
                return ("slice", a, n, st)

            return sl
        g = self.value_getter(idx)

        def it(env: list[Any]) -> tuple[str, int, int, int]:
            i = g(env)
            if type(i) is not int:
                i = need_int(i, "an index")
            return ("int", i, 1, 1)

        return it

    def value_getter(self, x: Any) -> Callable[[list[Any]], Any]:
        if isinstance(x, (int,)) or x is None:
            return lambda env: x
        if hasattr(x, "aval") and not _jax.is_literal(x):
            slot = self.slot(x)
            return lambda env: env[slot]
        if hasattr(x, "aval") or _jax.is_literal(x):
            return self.reader(x)
        try:
            v = int(x)
        except (TypeError, ValueError):
            v = VECTOR  # type: ignore[assignment]
        return lambda env: v


_PLAIN = frozenset((int, bool, float))


def cast_to(dtype: Any) -> Callable[[Any], Any]:
    """The Python conversion to a result of ``dtype`` (truncating to integers like XLA)."""
    if dtype is None:
        return _same
    k = dtype.kind if hasattr(dtype, "kind") else "f"
    if k == "b":
        return bool
    if k in "iu":
        return int
    return float


def _same(v: Any) -> Any:
    return v


def _fast_scalar(
    rule: Callable[..., Any],
    conv: Callable[[Any], Any],
    ins: list[tuple[bool, Any]],
    out: int,
    slow: Op,
) -> Op:
    """A unary or binary scalar op on plain Python numbers, without the general path.

    Why: scalar arithmetic (indices, slots, predicates) is most of the equations a
    device runs per copy. Anything that is not a plain int/bool/float (an Unknown, a
    ref, an error in the rule) goes to ``slow``, the general op, which computes the
    same result it always did.
    """
    if len(ins) == 1:
        ((va, a),) = ins

        def unary(env: list[Any], ctx: Ctx) -> Gen | None:
            x = env[a] if va else a
            if type(x) in _PLAIN:
                try:
                    env[out] = conv(rule(x))
                    return None
                except (TypeError, ValueError, ArithmeticError):
                    pass
            return slow(env, ctx)

        return unary
    (va, a), (vb, b) = ins

    def binary(env: list[Any], ctx: Ctx) -> Gen | None:
        x = env[a] if va else a
        y = env[b] if vb else b
        if type(x) in _PLAIN and type(y) in _PLAIN:
            try:
                env[out] = conv(rule(x, y))
                return None
            except (TypeError, ValueError, ArithmeticError):
                pass
        return slow(env, ctx)

    return binary


def _is_array(a: Any) -> bool:
    return not _jax.is_literal(a) and bool(getattr(a.aval, "shape", ()))


def _outside_reads(
    eqn: Any, slots: list[tuple[int, int]], starts: list[tuple[bool, Any]], op: Op
) -> Op:
    """``op`` that first reads, as an access, each kernel output it takes outside any kernel.

    Why: a kernel that returns its semaphores (a DMA future) returns arrays copies may
    still be writing (or reading); an XLA operation that uses such an array before the
    kernel that waits the copies runs is a race. Inside a kernel, refs are accessed by
    their own primitives; outside, an operation on an array reads it (a ``slice`` only
    its window)."""
    where: list[str] = []

    def reads(env: list[Any], ctx: Ctx) -> Gen | None:
        # a kernel that left copies in flight on its own semaphores is reported as that
        # leftover (its return is not checked either: _kernels._returns)
        if ctx.kernel is None and not ctx.machine.leftovers:
            for k, x in slots:
                v = env[x]
                if not isinstance(v, RefVal) or v.steps or v.buffer.sem_kind is not None:
                    continue
                at = [env[x] if is_var else x for is_var, x in starts]
                box = _read_box(eqn, k, v.buffer.shape, at)
                if isinstance(v, InFlight):
                    # XLA orders this read after the start kernel only (by data), so it
                    # races with the copy wherever the program lists the done kernel
                    for b, copy in v.boxes:
                        if overlaps(box, b):
                            raise _in_flight_read(ctx, v, box, copy, eqn, location(eqn))
                    continue
                if not where:
                    where.append(
                        f"{location(eqn)} ({eqn.primitive.name} outside any kernel: "
                        "run the kernel that waits its copies before using the array)"
                    )
                shape = tuple(hi - lo for lo, hi in box)
                view = View(v.buffer, box, shape, v.buffer.itemsize)
                ctx.machine.access(ctx.p, view, False, "reads", where[0])
        return op(env, ctx)

    return reads


def _keeps_garbage(
    eqn: Any, maps: list[DimMap | None] | None, slots: list[tuple[int, int]], out: int, op: Op
) -> Op:
    """``op``, whose result keeps the garbage of its operands in place (element-wise)
    or moves it (slice, transpose, reshape): a :class:`Patchy` value when some part
    of it holds garbage from a kernel's output (``patchy``)."""
    where: list[str] = []

    def keeps(env: list[Any], ctx: Ctx) -> Gen | None:
        g = op(env, ctx)
        if g is not None:
            return g  # not an XLA operation after all (never for these primitives)
        ins: list[tuple[tuple[int, ...], list[Box] | None]] = []
        arrays: list[DimMap | None] = []
        first: Patchy | None = None
        for k, x in slots:
            v = env[x]
            shape = tuple(int(d) for d in eqn.invars[k].aval.shape)
            written = _written(ctx.machine, v)
            if written is not None and first is None:
                if isinstance(v, Patchy):
                    first = v
                else:
                    if not where:
                        # "<mul>" inside a jax function (silu): its call names the line
                        where.append(location(eqn))
                    m, buf = ctx.machine, v.buffer
                    made = m.made_by.get(buf.ident, "a kernel")
                    root = m.garbage_root.get(buf.ident) or f"{buf.name} of {made}"
                    origin = f"{made} left in its output {buf.name}"
                    first = Patchy((), [], origin, eqn.primitive.name, where[0], root)
            ins.append((shape, written))
            arrays.append(None if maps is None else maps[k])
        if first is not None:
            written = carry(eqn, None if maps is None else arrays, ins)
            if written is not None:
                shape = tuple(int(d) for d in eqn.outvars[0].aval.shape)
                env[out] = Patchy(shape, written, first.origin, first.prim, first.where, first.root)
        return None

    return keeps


def _written(m: Machine, v: Any) -> list[Box] | None:
    """The written boxes of an outer array (a kernel's output or a Patchy value);
    None when all of it is written."""
    if isinstance(v, Patchy):
        return v.written
    if type(v) is not RefVal or v.steps or v.buffer.sem_kind is not None:
        return None
    buf = v.buffer
    history = m.histories.get(buf.ident)
    if history is None:
        return []
    if history.coverage.covers(buf.full_box()):
        return None
    return list(history.coverage.boxes)


def _in_flight_read(
    ctx: Ctx, v: InFlight, box: Box, copy: str, eqn: Any, where: str
) -> VerifiedRaceError:
    buf = v.buffer
    window = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"
    return VerifiedRaceError(
        f"data race on {ctx.engine.labels[buf.owner]}'s buffer {buf.name}{window}: "
        f"{eqn.primitive.name} at {where} reads it outside any kernel while the copy "
        f"started at {copy} is still writing it: kernel {v.kernel} returned it with the "
        "copy's semaphore (a DMA future), and XLA may run this read as soon as that kernel "
        "returns, before the copy is waited, wherever the program lists the kernel that "
        "waits it. Fix: read what the kernel that waits the copy returns (finish_async's "
        "result, or the done kernel's aliased output) instead."
    )


def _read_box(eqn: Any, k: int, shape: tuple[int, ...], starts: list[Any]) -> Box:
    """What operand ``k`` of ``eqn`` reads: a ``slice``'s window, a ``dynamic_slice``'s
    when its starts are known (clamped into the array, as XLA does), else all of it."""
    whole = tuple((0, n) for n in shape)
    name = eqn.primitive.name
    if name == "slice" and k == 0:
        lo, hi = eqn.params["start_indices"], eqn.params["limit_indices"]
        return tuple((int(a), int(b)) for a, b in zip(lo, hi))
    if name == "dynamic_slice" and k == 0:
        sizes = [int(n) for n in eqn.params["slice_sizes"]]
        known = [_known_int(x) for x in starts]
        if len(known) != len(shape) or any(x is None for x in known):
            return whole
        first = [min(max(cast(int, x), 0), n - z) for x, n, z in zip(known, shape, sizes)]
        return tuple((a, a + z) for a, z in zip(first, sizes))
    return whole


def _known_int(x: Any) -> int | None:
    """``x`` as an int when it is a known integer scalar (Python, numpy or 0-d array)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if kind is not None and kind in "iu" and getattr(x, "shape", None) == ():
        return int(x)
    return None


def _carry_text(carry: list[Any]) -> str:
    shown = ", ".join(str(int(v)) for v in carry[:4])
    return f"carry ({shown}{', ...' if len(carry) > 4 else ''})"


def _key(v: Any) -> object:
    if hasattr(v, "tobytes") and hasattr(v, "shape"):  # a numpy array
        return (v.tobytes(), v.shape, str(v.dtype))
    return v


def kernel_of(ctx: Ctx, what: str, where: str) -> Any:
    """The kernel call ``ctx`` runs in; a clear error for ``what`` outside any kernel."""
    kernel = ctx.kernel
    if kernel is None:
        raise VerificationUnsupportedError(
            f"{what} at {where} runs outside any Pallas kernel (a pallas_call or pl.kernel "
            "body): verify models DMAs, semaphores and scoped allocations inside kernels "
            "only. Move it into a kernel, or check this program with "
            "safedma.testing.simulate."
        )
    return kernel


def need_int(v: Any, what: str) -> int:
    if isinstance(v, Unknown) or v is None or isinstance(v, RefVal):
        raise VerificationUnsupportedError(
            f"{what} in a copy or ref access depends on {getattr(v, 'why', 'vector data')}; "
            f"the verifier needs it as a scalar. {_FIX}"
        )
    return int(v)


_FIX = (
    "verify computes such values exactly from the function's arguments when they are "
    "given as concrete arrays, through vector code, code between kernels and earlier "
    "kernels' outputs (up to a few thousand elements a buffer); a value it cannot follow "
    "(a buffer too large, data from another device) needs "
    "safedma.testing.simulate (docs/verify.md, values computed by the program)."
)


def _data_dependent(what: str, v: Any, where: str) -> VerificationUnsupportedError:
    why = v.why if isinstance(v, Unknown) else "vector data"
    return VerificationUnsupportedError(
        f"{what} at {where} depends on {why}; the verifier needs it as a scalar. {_FIX}"
    )


def _call_gen(body: Compiled, vals: list[Any], outs: list[int], env: list[Any], ctx: Ctx) -> Gen:
    res = yield from run(body, vals, ctx)
    for s, v in zip(outs, res):
        env[s] = v
    return None


def _call_then(
    body: Compiled,
    vals: list[Any],
    outs: list[int],
    env: list[Any],
    ctx: Ctx,
    eqn: Any,
    where: list[str],
) -> Gen:
    """A call's body, then its garbage-holding results named at the call's line when
    the body's own lines are not the user's (``patchy.Patchy.located``)."""
    yield from _call_gen(body, vals, outs, env, ctx)
    for s in outs:
        v = env[s]
        if isinstance(v, Patchy) and v.where.startswith("<"):
            if not where:
                where.append(location(eqn))
            env[s] = v.located(where[0])
    return None


def _has_effects(jaxpr: Any) -> bool:
    if getattr(jaxpr, "effects", None):
        return True
    for e in jaxpr.eqns:
        if e.primitive.name in _BUILDERS and e.primitive.name not in ("pjit", "jit", "closed_call"):
            if e.primitive.name not in (
                "cond",
                "scan",
                "while",
                "axis_index",
                "program_id",
                "num_programs",
            ):
                return True
        for sub in _jax.sub_jaxprs(e.params):
            if _has_effects(_jax.jaxpr_of(sub)[0]):
                return True
    return False


# What a view covers depends on the root's shape and element size and the steps,
# not on which buffer it is: every device's counterpart buffer shares one entry.
_VIEWS: dict[
    tuple[tuple[int, ...], int, tuple[tuple[str, object], ...]],
    tuple[Box, tuple[int, ...], int],
] = {}


def _plain_window(buf: Buffer, steps: tuple[tuple[str, object], ...]) -> View | None:
    """The view of one in-range index with unit strides on the root (most copy windows
    and semaphore slots), computed directly; None for anything else, which
    :func:`resolve` handles (and reports when out of range)."""
    if len(steps) != 1 or steps[0][0] != "index":
        return None
    entries = cast("tuple[tuple[str, int, int, int], ...]", steps[0][1])
    shape = buf.shape
    if len(entries) != len(shape):
        return None
    box: list[tuple[int, int]] = []
    kept: list[int] = []
    elements = 1
    for (kind, start, size, stride), extent in zip(entries, shape):
        if stride != 1 or size <= 0 or start < 0 or start + size > extent:
            return None
        box.append((start, start + size))
        if kind == "slice":
            kept.append(size)
            elements *= size
    return View.window(buf, tuple(box), tuple(kept), buf.itemsize, elements)


def view_of(ref: RefVal, where: str, what: str, p_label: str) -> View:
    buf = ref.buffer
    if not ref.steps:
        return View(buf, buf.full_box(), buf.shape, buf.itemsize)
    plain = _plain_window(buf, ref.steps)
    if plain is not None:
        return plain
    key = (buf.shape, buf.itemsize, ref.steps)
    hit = _VIEWS.get(key)
    if hit is not None:
        return View(buf, *hit)
    try:
        view = resolve(buf, ref.steps)
        if len(_VIEWS) > 200_000:
            _VIEWS.clear()
        _VIEWS[key] = (view.box, view.shape, view.itemsize)
        return view
    except RegionError as err:
        buf = ref.buffer
        if buf.sem_kind is not None:
            raise SemaphoreIndexError(
                f"semaphore index out of range (R5) on {p_label}: {what} {buf.name} at "
                f"{where}: {err} (the array holds {buf.shape}); on a TPU this silently "
                "uses another semaphore's memory. Allocate enough semaphores or fix the "
                "index."
            ) from None
        raise OutOfBoundsDmaError(
            f"out-of-range window on {p_label}: {what} {buf.name} (shape {buf.shape}) at "
            f"{where}: {err}. Keep the window inside the buffer."
        ) from None
    except UnsupportedView as err:
        raise VerificationUnsupportedError(
            f"{what} {ref.buffer.name} at {where} uses {err}, which the verifier does not "
            "model; check this kernel with safedma.testing.simulate"
        ) from None


_BUILDERS: dict[str, Callable[[Compiler, Any], Op]] = {
    "pjit": lambda c, e: c.call(e),
    "jit": lambda c, e: c.call(e),
    "closed_call": lambda c, e: c.call(e, "call_jaxpr"),
    "core_call": lambda c, e: c.call(e, "call_jaxpr"),
    # jax.checkpoint / jax.remat bind ``remat2`` (jax 0.10 and 0.12): its kernels run
    "remat2": lambda c, e: c.call(e),
    "remat": lambda c, e: c.call(e),
    "checkpoint": lambda c, e: c.call(e),
    "custom_jvp_call": lambda c, e: c.call(e, "call_jaxpr"),
    "custom_vjp_call": lambda c, e: c.call(e, "call_jaxpr"),
    "cond": Compiler.cond,
    "scan": Compiler.scan,
    "while": Compiler.while_,
    "run_scoped": Compiler.run_scoped,
    "axis_index": Compiler.axis_index,
    "program_id": Compiler.program_id,
    "num_programs": Compiler.num_programs,
}


# Operations whose result elements each come from known places of their operands: on a
# partly known vector (a Partial) they are computed on the known elements, which the
# same operation applied to the operands' known-masks finds.
_MOVES_ELEMENTS = frozenset(
    {"slice", "squeeze", "reshape", "transpose", "rev", "broadcast_in_dim", "expand_dims",
     "concatenate", "dynamic_slice", "copy"}
)  # fmt: skip
_ELEMENTWISE = frozenset(
    {"convert_element_type", "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs",
     "sign", "and", "or", "not", "xor", "eq", "ne", "lt", "le", "gt", "ge", "select_n",
     "shift_left", "shift_right_logical", "shift_right_arithmetic", "clamp"}
)  # fmt: skip


def _partly_known(name: str, vals: list[Any]) -> bool:
    """Every operand known or partly known (at least one partly), and ``name`` moves or
    combines elements one by one."""
    if name not in _MOVES_ELEMENTS and name not in _ELEMENTWISE:
        return False
    plain = (int, float, bool, np.ndarray, np.generic)
    if name == "dynamic_slice" and any(isinstance(v, Partial) for v in vals[1:]):
        return False  # a start that is not known: where the slice lands is not known
    return any(isinstance(v, Partial) for v in vals) and all(
        isinstance(v, (Partial, *plain)) for v in vals
    )


def _partial_results(eqn: Any, vals: list[Any]) -> list[Any]:
    """The results of ``eqn`` on partly known operands: exact arrays where every element
    comes from known ones, else :class:`Partial` (unknown elements keep their origin)."""
    why = next(v.why for v in vals if isinstance(v, Partial))
    try:
        values = _jax.bind_concrete_arrays(
            eqn, [v.values if isinstance(v, Partial) else v for v in vals]
        )
        masks = [v.known if isinstance(v, Partial) else np.ones(np.shape(v), bool) for v in vals]
        name = eqn.primitive.name
        if name in _MOVES_ELEMENTS:
            if name == "dynamic_slice":  # the starts are operands: known scalars
                masks = [masks[0], *[np.asarray(v) for v in vals[1:]]]
            known = _jax.bind_concrete_arrays(eqn, masks)
        else:
            out_shape = np.shape(np.asarray(values[0]))
            combined = np.ones(out_shape, bool)
            for m in masks:
                combined &= np.broadcast_to(m, out_shape) if np.ndim(m) else bool(m)
            known = [combined] * len(values)
    except Exception:
        return [Unknown(why)] * len(eqn.outvars)
    out: list[Any] = []
    for v, k in zip(values, known):
        k_arr = np.asarray(k, dtype=bool)
        out.append(
            v
            if k_arr.all()
            else Partial(why, np.asarray(v), k_arr)
            if k_arr.any()
            else Unknown(why)
        )
    return out


def register(name: str, builder: Callable[[Compiler, Any], Op]) -> None:
    _BUILDERS[name] = builder
