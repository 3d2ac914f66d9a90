"""The rules of verify's lockstep walk: memory and semaphore effects, control flow.

Each rule takes the walk, the equation and its operand values (arrays over the
devices) and returns its results; anything it cannot decide the way the per-device
rules (``walk/ops.py``, ``program/compiler.py``) would raises ``Bail``.
:func:`handler` picks each equation's rule for the walk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.lockstep.model import Bail, SemBuf
from safedma.testing._verify.lockstep.values import (
    SCALAR,
    VEC,
    Ref,
    Vec,
    as_dtype,
    is_scalar,
    literal,
)
from safedma.testing._verify.lockstep.scoped import run_scoped
from safedma.testing._verify.lockstep.walker import Handler, LockstepWalk, callee

__all__ = ["CONTROL", "EFFECTS", "HARMLESS", "handler"]

Rule = Handler


def _reader(eqn: Any, ins: list[Any]) -> Callable[[Any], Any]:
    """Values of the atoms jax's operand trees are rebuilt from (by identity)."""
    by_id = {id(a): x for a, x in zip(eqn.invars, ins)}

    def read(a: Any) -> Any:
        if a is None:
            return None
        if isinstance(a, (bool, int, np.integer)):
            return np.asarray(cast(int, a))
        if id(a) in by_id:
            return by_id[id(a)]
        if _jax.is_literal(a):
            return literal(_jax.literal_value(a))
        raise Bail("an operand the lockstep path cannot find")

    return read


def _with(w: LockstepWalk, base: Any, transforms: Any, read: Callable[[Any], Any]) -> Ref:
    return w.ref(base, read, tuple(transforms or ()))


def _dma_start(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    if eqn.params.get("add", False):
        raise Bail("a copy with add=True")
    read = _reader(eqn, ins)
    src, dst, dst_sem, src_sem, dev = _jax.unflatten(eqn.params["tree"], eqn.invars)
    m, devs = w.model, w.devs
    target = w.target(dev, eqn.params.get("device_id_type"), read)
    inv = np.empty_like(target)
    inv[target] = devs
    sbuf, s_starts, s_sizes, s_view = w.data_ref(w.ref(src, read))
    dbuf, d_starts, d_sizes, d_view = w.data_ref(w.ref(dst, read))
    s_bytes, d_bytes = math.prod(s_view) * sbuf.itemsize, math.prod(d_view) * dbuf.itemsize
    if s_bytes != d_bytes or (s_view != d_view and sbuf.itemsize == dbuf.itemsize):
        raise Bail("a copy whose source and destination differ")
    remote = target != devs
    if remote.any():
        m.check_entered(devs[remote], target[remote], "a remote copy")
    if dst_sem is None:
        raise Bail("a copy with no semaphore")
    dsem, d_slot = w.sem_ref(w.ref(dst_sem, read))
    ssem: SemBuf | None = None
    s_slot = d_slot
    if src_sem is not None:
        ssem, s_slot = w.sem_ref(w.ref(src_sem, read))
        same = ~remote & (ssem is dsem) & (s_slot == d_slot)
        if same.all():
            ssem = None
        elif same.any():
            raise Bail("a copy local on some devices and remote on others")
    clock = m.release()
    src_rec = m.new_record(None)
    m.access(sbuf, s_starts, s_sizes, devs, False, src_rec, True)
    dst_rec = m.new_record(None)
    m.access(dbuf, [s[inv] for s in d_starts], d_sizes, inv, True, dst_rec, False)
    recv = np.full(w.n, d_bytes if dsem.kind == "DMA" else int(d_bytes > 0), dtype=np.int64)
    landed = [(dst_rec, devs), (src_rec, inv)]
    if ssem is None:
        m.contribute(dsem, d_slot[inv], recv, clock, landed, inv, inv)
    else:
        sent = np.full(w.n, s_bytes if ssem.kind == "DMA" else int(s_bytes > 0), dtype=np.int64)
        m.contribute(ssem, s_slot, sent, clock, [(src_rec, devs)], devs, devs)
        m.contribute(dsem, d_slot[inv], recv, clock, landed, inv, inv)
    m.dmas += w.n
    m.remote_dmas += int(remote.sum())
    return []


def _dma_wait(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    read = _reader(eqn, ins)
    ref, _, sem, _, _ = _jax.unflatten(eqn.params["tree"], eqn.invars)
    buf, _, _, view = w.data_ref(w.ref(ref, read), check=False)
    s, slot = w.sem_ref(w.ref(sem, read))
    amount = math.prod(view) * buf.itemsize if s.kind == "DMA" else 1
    w.model.wait(s, slot, np.full(w.n, amount, dtype=np.int64))
    return []


def _semaphore_signal(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    read = _reader(eqn, ins)
    sem, transforms, inc, dev, core = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    if core is not None:
        raise Bail("a signal to a core")
    m, devs = w.model, w.devs
    s, slot = w.sem_ref(_with(w, sem, transforms, read))
    target = w.target(dev, eqn.params.get("device_id_type"), read)
    inv = np.empty_like(target)
    inv[target] = devs
    remote = target != devs
    if remote.any() and not s.barrier:
        m.check_entered(devs[remote], target[remote], "a remote signal")
    amount = w.ints(read(inc), "a signal increment")
    clock = m.release()
    m.contribute(s, slot[inv], amount[inv], clock, [], inv, inv)
    m.signals += w.n
    return []


def _semaphore_wait(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    read = _reader(eqn, ins)
    parts = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    sem, transforms, value = parts[0], parts[1], parts[2]
    if len(parts) > 3 and not w.uniform(read(parts[3]), "a wait's decrement"):
        raise Bail("a wait that does not decrement")
    s, slot = w.sem_ref(_with(w, sem, transforms, read))
    w.model.wait(s, slot, w.ints(read(value), "a wait value"))
    return []


def _barrier_semaphore(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    cid = None if w.desc is None else w.desc.collective_id
    if cid is None:
        raise Bail("a barrier semaphore with no collective_id")
    sem = w.barrier_sems.get(cid)
    if sem is None:
        sem = SemBuf(f"the barrier semaphore (collective_id={cid})", (), "BARRIER", True, w.n)
        w.barrier_sems[cid] = sem
        w.all_sems.append(sem)
    return [Ref(sem)]


def _access(
    w: LockstepWalk, eqn: Any, ins: list[Any], index_atoms: list[Any], read_: bool, write: bool
) -> None:
    read = _reader(eqn, ins)
    r = ins[0]
    if not isinstance(r, Ref):
        raise Bail("an access to a ref the lockstep path does not know")
    tree = eqn.params.get("tree")
    transforms = _jax.unflatten(tree, index_atoms) if tree is not None else ()
    if transforms:
        r = w.apply(r, tuple(transforms), read)
    buf, starts, sizes, _ = w.data_ref(r)
    m = w.model
    if read_:
        m.access(buf, starts, sizes, w.devs, False, m.new_record(w.devs), True)
    if write:
        m.access(buf, starts, sizes, w.devs, True, m.new_record(w.devs), False)


def _get(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    _access(w, eqn, ins, list(eqn.invars[1:]), True, False)
    return [VEC for _ in eqn.outvars]


def _swap(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    _access(w, eqn, ins, list(eqn.invars[2:]), False, True)
    return [VEC for _ in eqn.outvars]


def _addupdate(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    _access(w, eqn, ins, list(eqn.invars[2:]), True, True)
    return [VEC for _ in eqn.outvars]


EFFECTS: dict[str, Rule] = {
    "dma_start": _dma_start,
    "dma_wait": _dma_wait,
    "semaphore_signal": _semaphore_signal,
    "semaphore_wait": _semaphore_wait,
    "get_barrier_semaphore": _barrier_semaphore,
    "get": _get,
    "swap": _swap,
    "addupdate": _addupdate,
    "run_scoped": run_scoped,
}

# effects with no bearing on the protocol
HARMLESS = frozenset({"debug_callback", "debug_print"})


# ---------------------------------------------------------------------- control flow


def _cond(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    branches = eqn.params["branches"]
    i = w.uniform(ins[0], "a branch predicate")
    return w.sub(branches[min(max(i, 0), len(branches) - 1)], ins[1:])


def _scan(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    p = eqn.params
    n_consts, n_carry = _jax.scan_split(p)
    consts, carry = ins[:n_consts], ins[n_consts : n_consts + n_carry]
    if len(ins) > n_consts + n_carry:
        raise Bail("a scan over arrays")
    n_ys = len(eqn.outvars) - n_carry
    for _ in range(int(p["length"])):
        w.check_time()
        carry = w.sub(p["jaxpr"], [*consts, *carry])[:n_carry]
    return [*carry, *[VEC] * n_ys]


def _while(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    p = eqn.params
    cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
    c_consts, b_consts, carry = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
    while w.uniform(w.sub(p["cond_jaxpr"], [*c_consts, *carry])[0], "a loop condition"):
        w.check_time()
        before = carry
        carry = w.sub(p["body_jaxpr"], [*b_consts, *carry])
        if all(_same_value(a, b) for a, b in zip(before, carry)):
            # the per-device walk reports a loop that can never end at once, by name
            raise Bail("a while loop whose state does not change")
    return list(carry)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (Vec, Ref)) or isinstance(b, (Vec, Ref)):
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _call(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    return w.sub(callee(eqn), ins)


def _axis_index(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    named: object = eqn.params["axis_name"]
    axes = (
        [str(a) for a in cast("tuple[object, ...]", named)]
        if isinstance(named, tuple)
        else [str(named)]
    )
    if len(axes) == 1 and w.desc is not None and axes[0] in w.desc.params["grid_names"]:
        # a named grid axis (the per-device walk reads these first too)
        at = list(w.desc.params["grid_names"]).index(axes[0])
        return [as_dtype(np.asarray(w.point[at]), eqn.outvars[0].aval)]
    flat = np.zeros(w.n, dtype=np.int64)
    sizes = dict(zip(w.names, w.sizes))
    for a in axes:
        if a not in sizes:
            raise Bail(f"axis_index of {a!r}")
        flat = flat * sizes[a] + w.coords[a]
    return [as_dtype(flat, eqn.outvars[0].aval)]


def _program_id(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    """The grid step's index along an axis: the same on every device."""
    axis = int(eqn.params["axis"])
    if axis >= len(w.point):
        raise Bail("program_id outside a grid")
    return [as_dtype(np.asarray(w.point[axis]), eqn.outvars[0].aval)]


def _num_programs(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    axis = int(eqn.params["axis"])
    if w.desc is None or axis >= len(w.desc.grid):
        raise Bail("num_programs outside a grid")
    return [as_dtype(np.asarray(w.desc.grid[axis]), eqn.outvars[0].aval)]


CONTROL: dict[str, Rule] = {
    "cond": _cond,
    "scan": _scan,
    "while": _while,
    "pjit": _call,
    "jit": _call,
    "closed_call": _call,
    "core_call": _call,
    "remat": _call,
    "checkpoint": _call,
    "custom_jvp_call": _call,
    "custom_vjp_call": _call,
    "axis_index": _axis_index,
    "program_id": _program_id,
    "num_programs": _num_programs,
}


# ---------------------------------------------------------------------- dispatch


def handler(eqn: Any) -> Handler:
    """The rule the walk applies to ``eqn``: its own, a scalar rule, vector data, or a
    refusal (``Bail`` when reached) for what the path does not model."""
    name = eqn.primitive.name
    rule = EFFECTS.get(name) or CONTROL.get(name)
    if rule is not None:
        return rule
    if eqn.effects and name not in HARMLESS:
        return _refused(f"the primitive {name}")
    outs = eqn.outvars
    if any(_jax.is_ref_aval(v.aval) for v in outs):
        return _refused(f"the primitive {name} making a ref")
    if not all(is_scalar(v.aval) for v in outs):
        return _vector
    fn = SCALAR.get(name)
    if fn is None:
        return _refused(f"the scalar primitive {name}")
    aval = outs[0].aval

    def scalar(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
        for x in ins:
            if isinstance(x, (Vec, Ref)):
                return _vector(w, eqn, ins)
        return [as_dtype(fn(eqn, ins), aval)]

    return scalar


def _vector(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
    """Vector results (never computed); a ref among the operands is a use not modelled."""
    for x in ins:
        if isinstance(x, Ref):
            raise Bail(f"the primitive {eqn.primitive.name} on a ref")
    return [VEC for _ in eqn.outvars]


def _refused(why: str) -> Handler:
    def refuse(w: LockstepWalk, eqn: Any, ins: list[Any]) -> list[Any]:
        raise Bail(why)

    return refuse
