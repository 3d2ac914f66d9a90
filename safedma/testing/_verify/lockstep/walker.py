"""verify's lockstep path: one walk of the device program for every device at once.

Why: most collective kernels are SPMD programs whose control flow is the same on
every device (loop bounds and branch predicates depend on the step, not on the
device). Such a kernel is walked once, each scalar a numpy array over the devices
and each DMA, wait and signal one array operation of ``lockstep/model.py``. The path
proves a protocol clean or gives up (``Bail``), and verify then walks the program per
device as before; so it decides nothing the per-device walk would decide otherwise,
and every message still comes from the per-device walk.

It walks the kernels of the device program in program order (XLA operations between
them need no model: see :class:`LockstepWalk`), each kernel's body once per grid point
with the pipeline's block copies around it (``pipeline.py``), and gives up on: kernels
inside control flow, dynamic or vmapped grids, SMEM scratch, operands that live in
VMEM/SMEM between kernels, TensorCore meshes or megacore splits, DMA futures, control
flow or block indices that differ between devices, remote targets that are not a
permutation of the devices, ref views other than slices and indices, and every
primitive it does not list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.lockstep.model import Bail, DataBuf, Ints, Model, SemBuf
from safedma.testing._verify.lockstep.pipeline import Block, Pipeline
from safedma.testing._verify.lockstep.values import (
    Ref,
    Vec,
    literal,
)
from safedma.testing._verify.walk.blocks import grid_points
from safedma.testing._verify.walk.kernel_desc import KernelDesc

__all__ = ["Handler", "LockstepWalk", "callee", "itemsize"]


# primitives that call a jaxpr once, as a function: their kernels run in program order
_CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call")
_KERNELS = ("pallas_call", "mpmd_map")


class LockstepWalk:
    """The device program evaluated once for every device (values are arrays over devices).

    Between kernels nothing needs modelling: every kernel must leave every output written
    and every access settled on its own device before it returns (or the path gives up),
    so the XLA operations around the kernels read defined data, and a later kernel's
    remote accesses are ordered after its target entered it (R10), hence after that
    target left the earlier kernels. Each kernel call gets fresh buffers.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        sizes: tuple[int, ...],
        deadline: float,
        handler_of: Callable[[Any], Handler],
    ) -> None:
        self.names, self.sizes = names, sizes
        self.handler_of = handler_of  # each equation's rule (``rules.handler``)
        self.n = math.prod(sizes)
        self.model = Model(self.n)
        self.devs: Ints = self.model.devs
        self.coords = dict(zip(names, np.unravel_index(self.devs, sizes)))
        self.deadline = deadline
        self.all_sems: list[SemBuf] = []  # every call's, for the report
        self.sems: list[SemBuf] = []  # the current call's
        self.barrier_sems: dict[object, SemBuf] = {}  # by collective id: they outlive calls
        self._descs: dict[int, KernelDesc] = {}  # per pallas_call equation (by id)
        self._plans: dict[int, _Plan] = {}  # per jaxpr walked (by id; the plan keeps it)
        self.desc: KernelDesc | None = None  # the kernel being walked
        self.consts: list[object] = []  # its jaxpr's own constants
        self.point: tuple[int, ...] = ()  # the grid point being walked
        self.scoped_where: dict[int, str] = {}  # run_scoped equation (by id) -> its line

    def run_program(self, jaxpr: Any) -> None:
        """The kernels of ``jaxpr`` in program order; other operations are skipped."""
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "pallas_call":
                self.run_kernel(self._desc(eqn))
            elif name in _CALLS:
                self.run_program(_jax.jaxpr_of(callee(eqn))[0])
            elif name in _KERNELS or any(
                e.primitive.name in _KERNELS
                for sub in _jax.sub_jaxprs(eqn.params)
                for e in _jax.all_eqns(_jax.jaxpr_of(sub)[0])
            ):
                raise Bail(f"kernels inside {name}")
            elif eqn.effects:
                raise Bail(f"the program's {name}")

    def _desc(self, eqn: Any) -> KernelDesc:
        desc = self._descs.get(id(eqn))
        if desc is None:
            desc = KernelDesc(eqn)
            for unmodelled, why in (
                (desc.n_dynamic, "a dynamic grid"),
                (desc.params["vmapped_dims"], "a vmapped grid"),
                (desc.n_consts, "a ref the kernel closes over"),
                (desc.core_axes, "a core mesh"),
            ):
                if unmodelled:
                    raise Bail(why)
            self._descs[id(eqn)] = desc
        return desc

    # ------------------------------------------------------------------ kernel

    def run_kernel(self, desc: KernelDesc) -> None:
        """One call of a kernel: fresh buffers and semaphores (a barrier semaphore is the
        program's, by collective id), its body run at each grid point in row-major order
        (the per-device walk's), with the pipeline's block copies around each."""
        m = self.model
        self.desc = desc
        self.consts = [literal(c) for c in _jax.jaxpr_of(desc.params["jaxpr"])[1]]
        args, data, outputs, sems, blocks, prefetch = self._operands(desc)
        m.enter(desc.barrier)
        self.sems = sems
        pipe = Pipeline(self, blocks, prefetch)
        points = grid_points(desc.grid)
        nxt = next(points, None)
        with np.errstate(all="ignore"):  # int32 wrap-around, as on the TPU's scalar unit
            while nxt is not None:
                point, nxt = nxt, next(points, None)
                self.check_time()
                self.point = point
                pipe.before(point)
                self.eval_jaxpr(desc.jaxpr, self.consts, args)
                pipe.after(point, nxt)
        self.point = ()
        barrier = self.barrier_sems.get(desc.collective_id)
        if barrier is not None:
            sems.append(barrier)
        for sem in sems:
            m.empty_at_exit(sem)
        for buf in data:
            m.settled_for_owner(buf)
        for buf in outputs:
            if not buf.written.all():
                raise Bail(f"output {buf.name} not written everywhere")
        pipe.finish()
        m.release()  # leaving the kernel is a point of its own (the per-device walk's too)

    def _operands(
        self, desc: KernelDesc
    ) -> tuple[list[Any], list[DataBuf], list[DataBuf], list[SemBuf], list[Block], list[Ref]]:
        """The kernel's arguments (scalar prefetch, inputs, outputs, scratch, as Refs), its
        data buffers, the outputs it writes in place, its semaphores, its blocked operands
        and its scalar-prefetch refs."""
        args: list[Any] = []
        data: list[DataBuf] = []
        outputs: list[DataBuf] = []
        sems: list[SemBuf] = []
        blocks: list[Block] = []
        prefetch: list[Ref] = []
        in_place: dict[int, DataBuf] = {}  # input operands left in HBM, by position
        first_in = desc.n_index
        first_out = first_in + desc.n_in
        first_scratch = first_out + desc.n_out
        for k, aval in enumerate(desc.avals):
            name = desc.param_names[k]
            kind = _jax.semaphore_kind(aval)
            shape = tuple(int(d) for d in getattr(aval, "shape", ()))
            if kind is not None:
                if k < first_scratch:
                    raise Bail("a semaphore operand (a DMA future)")
                sem = SemBuf(name, shape, kind, False, self.n)
                sems.append(sem)
                self.all_sems.append(sem)
                args.append(Ref(sem))
                continue
            if k < first_in:  # scalar prefetch: SMEM the caller filled
                buf = DataBuf(name, shape, itemsize(aval), "SMEM", True, self.n)
                prefetch.append(Ref(buf))
            elif k >= first_scratch:
                space = _jax.memory_space(aval)
                if space not in ("VMEM", "ANY", "HBM"):
                    raise Bail(f"scratch in {space}")
                buf = DataBuf(name, shape, itemsize(aval), space, False, self.n)
            else:
                buf = self._operand(desc, k, aval, shape, in_place, blocks)
                blocked = bool(blocks) and blocks[-1].buf is buf
                if not blocked and k >= first_out:
                    outputs.append(buf)
                    if any(buf is b for b in in_place.values()):
                        args.append(Ref(buf))  # aliased to an input left in place: its memory
                        continue
                elif not blocked:
                    in_place[k] = buf
            data.append(buf)
            args.append(Ref(buf))
        return args, data, outputs, sems, blocks, prefetch

    def _operand(
        self,
        desc: KernelDesc,
        k: int,
        aval: Any,
        shape: tuple[int, ...],
        in_place: dict[int, DataBuf],
        blocks: list[Block],
    ) -> DataBuf:
        """Input or output ``k``'s buffer: the operand itself (HBM, ANY), or its block
        (VMEM, SMEM: added to ``blocks``); an output aliased to an input is that input's
        memory (in place) or starts as it (blocked)."""
        j = k - desc.n_index
        block = desc.blocks[j]
        is_out = j >= desc.n_in
        name = desc.param_names[k]
        if str(block["array_space"]) not in ("ANY", "HBM"):
            raise Bail("an operand that lives in VMEM/SMEM between kernels")
        alias = desc.aliases.get(j - desc.n_in) if is_out else None
        space = str(block["space"])
        if space in ("ANY", "HBM"):
            if alias is None:
                return DataBuf(name, shape, itemsize(aval), space, not is_out, self.n)
            source = in_place.get(alias)
            if source is None:
                raise Bail("an output aliased to an operand not left in place")
            return source
        if space not in ("VMEM", "SMEM"):
            raise Bail(f"an operand in {space}")
        buf = DataBuf(name, shape, itemsize(aval), space, not is_out, self.n)
        result: DataBuf | None = None
        if is_out:
            if alias is not None and (
                alias < desc.n_index or str(desc.blocks[alias - desc.n_index]["space"]) != space
            ):
                raise Bail("an output block aliased to an operand that is not a block")
            dims = tuple(int(d) for d in block["array_shape"])
            result = DataBuf(name, dims, buf.itemsize, "HBM", alias is not None, self.n)
        blocks.append(Block(desc, j, buf, result))
        return buf

    # ------------------------------------------------------------------ jaxprs

    def eval_jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        plan = self._plans.get(id(jaxpr))
        if plan is None:
            plan = self._plans[id(jaxpr)] = _Plan(jaxpr, self.handler_of)
        env: dict[Any, Any] = dict(zip(plan.constvars, consts))
        env.update(zip(plan.invars, args))
        for eqn, operands, handler, outvars in plan.steps:
            ins = [env[a] if var else a for var, a in operands]
            outs = handler(self, eqn, ins)
            for v, x in zip(outvars, outs):
                env[v] = x
        return [env[a] if var else a for var, a in plan.outvars]

    def sub(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        inner, consts = _jax.jaxpr_of(closed)
        return self.eval_jaxpr(inner, [literal(c) for c in consts], args)

    # ------------------------------------------------------------------ values

    def uniform(self, x: Any, what: str) -> int:
        if isinstance(x, (Vec, Ref)):
            raise Bail(f"{what} depends on data the lockstep path does not compute")
        a = np.asarray(x)
        if a.ndim and not (a == a.flat[0]).all():
            raise Bail(f"{what} differs between devices")
        return int(a.flat[0])

    def ints(self, x: Any, what: str) -> Ints:
        if isinstance(x, (Vec, Ref)) or x is None:
            raise Bail(f"{what} is not a known scalar")
        a = np.asarray(x)
        if a.shape == (self.n,):
            same: Ints = a.astype(np.int64, copy=False)  # callers never write into it
            return same
        return np.full(self.n, int(a), dtype=np.int64)  # 0-d: the same on every device

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise Bail("over the time budget")

    # ------------------------------------------------------------------ refs

    def ref(self, x: Any, env_read: Callable[[Any], Any], extra: Sequence[Any] = ()) -> Ref:
        """Resolve a (transformed) ref operand whose leaves are jaxpr atoms."""
        if _jax.select_parts(x) is not None:
            raise Bail("pl.select_ref")
        base, transforms = _jax.split_transformed(x)
        r = env_read(base)
        if not isinstance(r, Ref):
            raise Bail("a ref the lockstep path does not know")
        return self.apply(r, [*transforms, *extra], env_read)

    def apply(self, r: Ref, transforms: Sequence[Any], env_read: Callable[[Any], Any]) -> Ref:
        """``r`` seen through ref transforms (only indexing: slices and scalar indices)."""
        steps = list(r.steps)
        for t in transforms:
            kind, arg = _jax.transform_parts(t)
            if kind != "index":
                raise Bail(f"a ref view ({kind})")
            indices, int_shape = arg
            if int_shape:
                raise Bail("a gather")
            entries: list[tuple[str, Ints, int]] = []
            for idx in indices:
                if _jax.is_slice(idx):
                    start, size, stride = _jax.slice_parts(idx)
                    if stride not in (None, 1):
                        raise Bail("a strided slice")
                    entries.append(
                        (
                            "slice",
                            self.ints(env_read(start), "a slice start"),
                            self.uniform(env_read(size), "a slice size"),
                        )
                    )
                else:
                    entries.append(("int", self.ints(env_read(idx), "an index"), 1))
            steps.append(tuple(entries))
        return Ref(r.buf, tuple(steps))

    def window(self, r: Ref, check: bool) -> tuple[list[Ints], list[int], list[int]]:
        """(start per buffer dimension, size per buffer dimension, the view's shape)."""
        shape = r.buf.shape if isinstance(r.buf, DataBuf) else _sem_shape(r.buf)
        zero = np.zeros(self.n, dtype=np.int64)
        starts = [zero for _ in shape]
        sizes = list(shape)
        view = list(range(len(shape)))  # the buffer dimension of each view dimension
        for entries in r.steps:
            if len(entries) > len(view):
                raise Bail("more indices than dimensions")
            kept: list[int] = []
            for j, (kind, a, size) in enumerate(entries):
                d = view[j]
                if check and ((a < 0).any() or (a + size > sizes[d]).any()):
                    raise Bail("a window outside its buffer")
                starts[d] = starts[d] + a
                sizes[d] = size
                if kind == "slice":
                    kept.append(d)
            view = kept + view[len(entries) :]
        return starts, sizes, [sizes[d] for d in view]

    def data_ref(
        self, r: Ref, check: bool = True
    ) -> tuple[DataBuf, list[Ints], list[int], list[int]]:
        """(buffer, window start and size per buffer dimension, the view's shape)."""
        if not isinstance(r.buf, DataBuf):
            raise Bail("a semaphore used as data")
        starts, sizes, view = self.window(r, check)
        if not r.buf.shape:
            starts, sizes = [np.zeros(self.n, dtype=np.int64)], [1]
        return r.buf, starts, sizes, view

    def sem_ref(self, r: Ref) -> tuple[SemBuf, Ints]:
        if not isinstance(r.buf, SemBuf):
            raise Bail("data used as a semaphore")
        shape = _sem_shape(r.buf)
        starts, _, view = self.window(r, True)
        if view:
            raise Bail("a semaphore array where one semaphore is needed")
        if not shape:
            return r.buf, np.zeros(self.n, dtype=np.int64)
        slot = np.ravel_multi_index(tuple(starts), shape)
        return r.buf, np.asarray(slot, dtype=np.int64)

    def target(self, dev: Any, id_type: Any, env_read: Callable[[Any], Any]) -> Ints:
        """The device each device addresses (a permutation of the devices, or Bail)."""
        if dev is None:
            return self.devs
        coords = {n: c.astype(np.int64) for n, c in self.coords.items()}
        sizes = dict(zip(self.names, self.sizes))
        logical = "LOGICAL" in str(id_type)
        if isinstance(dev, dict):
            items = cast("dict[object, object]", dev).items()
            for k, raw in items:
                keys = (
                    tuple(str(a) for a in cast("tuple[object, ...]", k))
                    if isinstance(k, tuple)
                    else (str(k),)
                )
                v = self.ints(env_read(raw), "a device id").copy()
                if any(key not in sizes for key in keys):
                    raise Bail(f"a device id naming an axis of none of {keys!r}")
                span = sizes[keys[0]]  # one axis: no wrap-around (see walk/ops.py)
                if len(keys) == 1 and ((v < 0).any() or (v >= span).any()):
                    raise Bail("a device id off the mesh")  # the walk reports where
                for key in reversed(keys):
                    coords[key] = v % sizes[key]
                    v = v // sizes[key]
            flat = np.ravel_multi_index(tuple(coords[n] for n in self.names), self.sizes)
        else:
            parts: tuple[object, ...] = (
                tuple(cast("tuple[object, ...]", dev)) if isinstance(dev, (tuple, list)) else (dev,)
            )
            vals = [self.ints(env_read(v), "a device id") for v in parts]
            if logical or (len(vals) == 1 and len(self.names) != 1):
                flat = vals[0]
                if (flat < 0).any() or (flat >= self.n).any():
                    raise Bail("a device id off the mesh")
            else:
                if len(vals) != len(self.names):
                    raise Bail("a device id with the wrong number of coordinates")
                for v, s in zip(vals, self.sizes):
                    if (v < 0).any() or (v >= s).any():
                        raise Bail("a device id off the mesh")
                flat = np.ravel_multi_index(tuple(vals), self.sizes)
        target = np.asarray(flat, dtype=np.int64)
        hit = np.zeros(self.n, dtype=bool)  # (a mask, not np.unique: this runs per copy)
        hit[target] = True
        if not hit.all():
            raise Bail("remote targets that are not a permutation of the devices")
        return target


# ---------------------------------------------------------------------- helpers


def callee(eqn: Any) -> Any:
    """The jaxpr a call-like equation (jit, closed_call, custom_jvp/vjp, remat) runs."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    raise Bail(f"the call {eqn.primitive.name}")


def itemsize(aval: Any) -> int:
    dtype = getattr(getattr(aval, "inner_aval", aval), "dtype", None)
    if dtype is None:
        raise Bail("an operand with no dtype")
    return int(np.dtype(dtype).itemsize)


def _sem_shape(sem: SemBuf) -> tuple[int, ...]:
    return sem.shape


Handler = Callable[[LockstepWalk, Any, list[Any]], list[Any]]


class _Plan:
    """A jaxpr prepared once for the walk: each equation's handler and its operands
    (literals already converted), so a loop body costs one dict lookup per operand."""

    def __init__(self, jaxpr: Any, handler_of: Callable[[Any], Handler]) -> None:
        self.jaxpr = jaxpr  # kept alive: plans are cached by id
        self.constvars = list(jaxpr.constvars)
        self.invars = list(jaxpr.invars)
        self.steps = [
            (eqn, _operands(eqn.invars), handler_of(eqn), list(eqn.outvars)) for eqn in jaxpr.eqns
        ]
        self.outvars = _operands(jaxpr.outvars)


def _operands(atoms: Sequence[Any]) -> list[tuple[bool, Any]]:
    return [
        (False, literal(_jax.literal_value(a))) if _jax.is_literal(a) else (True, a) for a in atoms
    ]
