"""``run_state`` around kernels: refs made from arrays, used by stateful ``pallas_call``s.

jax's stateful API (``pl.run_state(body)(arrays)``) turns arrays into refs for the
duration of ``body``; a ``pallas_call`` or ``pl.core_map`` inside takes those refs
as operands (DMA futures between stateful calls, a core_map writing its output in
place). Each ref is one HBM buffer, initialised from its array; the results are
the buffers' final contents.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.program.compiler import (
    Compiler,
    compile_jaxpr,
    location,
    register,
    run,
)
from safedma.testing._verify.program.context import Ctx, Gen, Op, RefVal
from safedma.testing._verify.walk.engine import engine_of


def _host(x: object) -> np.ndarray[Any, Any] | None:
    """The values of an array computed outside the kernels, when known."""
    if not isinstance(x, np.ndarray):
        return None
    return np.asarray(cast(object, x))


def _run_state(c: Compiler, eqn: Any) -> Op:
    jaxpr, consts = _jax.jaxpr_of(eqn.params["jaxpr"])
    body = compile_jaxpr(jaxpr, consts, outer=c.outer)
    ins = [c.reader(a) for a in eqn.invars]
    avals = [a.aval for a in eqn.invars]
    outs = c.outs(eqn)

    def op(env: list[Any], ctx: Ctx) -> Gen:
        refs: list[RefVal] = []
        for k, (read, aval) in enumerate(zip(ins, avals)):
            x = read(env)
            if isinstance(x, RefVal):
                refs.append(x)  # an array a kernel returned: the ref starts as it
                continue
            refs.append(engine_of(ctx).input_value(ctx.p, aval, _host(x), f"run_state ref {k}"))
        yield from run(body, refs, ctx)
        for s, ref in zip(outs, refs):
            env[s] = ref
        return None

    return op


def _new_ref(c: Compiler, eqn: Any) -> Op:
    """A ref made from an array outside the kernels (``jax.new_ref``, what a ``core_map``
    wrapper does with its operands): one HBM buffer holding the array's values where
    they are known, so a row count the kernel copies in from it stays exact."""
    read = c.reader(eqn.invars[0])
    aval = eqn.invars[0].aval
    out = c.outs(eqn)[0]
    name = f"the ref made at {location(eqn)}"

    def op(env: list[Any], ctx: Ctx) -> None:
        x = read(env)
        env[out] = (
            x if isinstance(x, RefVal) else engine_of(ctx).input_value(ctx.p, aval, _host(x), name)
        )

    return op


register("run_state", _run_state)
# jax 0.12 names the primitive new_ref; earlier releases mutable_array
register("new_ref", _new_ref)
register("mutable_array", _new_ref)
