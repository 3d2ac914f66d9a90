"""``pl.run_scoped`` in verify's lockstep path: fresh buffers and semaphores per run.

Why: the per-device walk gives each run of a ``run_scoped`` region its own buffers
(the n-th run on every device addressing the same ones, so a neighbour's signal to a
scoped semaphore lands in the run it names) and checks the scoped semaphores back to
zero when the region ends. In lockstep every device runs the n-th region at once, so
one buffer per allocation and run is every device's; a count left at the region's end,
or an access to a scoped buffer not settled by then, gives up (the walk reports it).
"""

from __future__ import annotations

from typing import Any

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.lockstep.model import Bail, DataBuf, SemBuf
from safedma.testing._verify.lockstep.values import Ref
from safedma.testing._verify.lockstep.walker import LockstepWalk, itemsize
from safedma.testing._verify.program import compiler as _compiler

__all__ = ["run_scoped"]


def run_scoped(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    if eqn.params.get("collective_axes"):
        raise Bail("a run_scoped allocation shared across devices")
    jaxpr, _ = _jax.jaxpr_of(eqn.params["jaxpr"])
    every = [*jaxpr.constvars, *jaxpr.invars]
    # the name the per-device walk gives these buffers (its reports key peaks by name)
    name = f"a run_scoped buffer at {_where(w, eqn)}"
    allocs: list[Ref] = []
    sems: list[SemBuf] = []
    data: list[DataBuf] = []
    for var in every[len(eqn.invars) :]:
        aval = var.aval
        shape = tuple(int(d) for d in getattr(aval, "shape", ()))
        kind = _jax.semaphore_kind(aval)
        if kind is not None:
            sem = SemBuf(name, shape, kind, False, w.n)
            sems.append(sem)
            w.all_sems.append(sem)
            allocs.append(Ref(sem))
            continue
        space = _jax.memory_space(aval)
        if space not in ("VMEM", "ANY", "HBM"):
            raise Bail(f"a run_scoped buffer in {space}")
        buf = DataBuf(name, shape, itemsize(aval), space, False, w.n)
        data.append(buf)
        allocs.append(Ref(buf))
    operands = [*ins, *allocs]
    n_consts = len(jaxpr.constvars)
    outs = w.eval_jaxpr(jaxpr, operands[:n_consts], operands[n_consts:])
    for sem in sems:
        w.model.empty_at_exit(sem)
    for buf in data:
        w.model.settled_for_owner(buf)
    return outs


def _where(w: LockstepWalk, eqn: Any) -> str:
    """``eqn``'s line as the per-device walk names it: found with the frames of the
    equations that enclose it in the kernel body, as the walk's compiler finds it."""
    found = w.scoped_where.get(id(eqn))
    if found is not None:
        return found  # the walk's plans keep its equations alive: ids stay theirs
    if w.desc is None:
        raise Bail("run_scoped outside a kernel")
    with _compiler.locating_from_the_kernel_top():
        _visit(w.desc.jaxpr, w.scoped_where)
    found = w.scoped_where.get(id(eqn))
    if found is None:
        raise Bail("a run_scoped region the lockstep path cannot name")
    return found


def _visit(jaxpr: Any, where: dict[int, str]) -> None:
    for eqn in jaxpr.eqns:
        subs = list(_jax.sub_jaxprs(eqn.params))
        if not subs:
            continue
        # the walk's compiler keeps the frames of each equation with a body while it
        # compiles that body (``Compiler.op``), a run_scoped's own included
        with _compiler.inside_body_of(eqn):
            if eqn.primitive.name == "run_scoped":
                where[id(eqn)] = _compiler.location(eqn)
            for sub in subs:
                _visit(_jax.jaxpr_of(sub)[0], where)
