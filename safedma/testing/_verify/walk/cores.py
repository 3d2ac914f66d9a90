"""``pl.kernel`` (jaxpr primitive ``mpmd_map``) over a ``TensorCoreMesh`` or a SparseCore
mesh (``VectorSubcoreMesh``: core x subcore): each core is a participant.

Core 0 of each device runs the program around the kernels; at a multi-core
kernel it launches the body on the device's other cores (they acquire its
clock: the launch happens before their bodies), runs core 0's body, and
joins them (their exits happen before it continues). HBM operands are shared
by the cores of a device; scratch (VMEM, semaphores) belongs to each core.
"""

from __future__ import annotations

import math
from typing import Any, cast

from safedma._compat import auto_collective_ids
from safedma._errors import MissingCollectiveIdError
from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import VerificationUnsupportedError
from safedma.testing._verify.model.regions import Buffer, View
from safedma.testing._verify.model.semantics import Blocked
from safedma.testing._verify.program.compiler import (
    Compiler,
    compile_jaxpr,
    location,
    register,
    run,
)
from safedma.testing._verify.program.context import Ctx, Gen, Op, RefVal
from safedma.testing._verify.program.scalars import Unknown
from safedma.testing._verify.walk import contents as _contents
from safedma.testing._verify.walk.engine import engine_of
from safedma.testing._verify.naming import parameter_names
from safedma.testing._verify.walk.kernel_desc import body_end
from safedma.testing._verify.walk.kernels import describe_leftover

__all__ = ["mesh_cores"]


def core_axes(mesh: Any) -> tuple[tuple[str, int], ...]:
    """The (name, size) axes of a pl.kernel mesh in row-major order: one for a
    TensorCoreMesh or ScalarSubcoreMesh, (core, subcore) for a VectorSubcoreMesh."""
    shape = getattr(mesh, "shape", None)
    try:
        return tuple((str(k), int(v)) for k, v in dict(shape).items()) if shape else ()
    except (TypeError, ValueError):
        return ()


def _place(ctx: Ctx, axes: tuple[tuple[str, int], ...], k: int) -> None:
    """Set the core-mesh axis indices of flat core k (row-major over ``axes``)."""
    for name, size in reversed(axes):
        ctx.axis_index[name] = k % size
        k //= size
    ctx.core_sizes = dict(axes)


def mesh_cores(mesh: Any) -> tuple[str, int]:
    """(first axis name, number of cores) of a pl.kernel mesh, from either jax version's
    fields; a SparseCore ``VectorSubcoreMesh`` counts every (core, subcore) pair."""
    axes = core_axes(mesh)
    if len(axes) > 1:
        return axes[0][0], math.prod(n for _, n in axes)
    axis = getattr(mesh, "axis_name", None)
    if axis is None:
        names = tuple(getattr(mesh, "axis_names", ()) or ())
        axis = names[0] if names else "core"
    n = getattr(mesh, "num_cores", None)
    if n is None:
        devices = getattr(mesh, "devices", None)
        n = len(cast("list[object]", list(devices))) if devices is not None else 1
    return str(axis), int(n)


class _CoreKernel:
    def __init__(self, eqn: Any) -> None:
        p: dict[str, Any] = eqn.params
        jaxprs = tuple(p["jaxprs"])
        meshes = tuple(p["meshes"])
        if len(jaxprs) != 1 or len(meshes) != 1:
            kinds = ", ".join(type(m).__name__ for m in meshes)
            raise VerificationUnsupportedError(
                f"pl.kernel with {len(jaxprs)} bodies over meshes ({kinds}) at "
                f"{location(eqn)}: the verifier models one body per pl.kernel (over a "
                "TensorCoreMesh or one SparseCore mesh), not bodies that run "
                "concurrently on different meshes and share semaphores; verify each "
                "body's protocol as its own pl.kernel, or test this one on hardware"
            )
        jaxpr, consts = _jax.jaxpr_of(jaxprs[0])
        self.body = compile_jaxpr(jaxpr, consts, kernel_body=True)
        self.axis, self.cores = mesh_cores(meshes[0])
        self.axes = core_axes(meshes[0]) or ((self.axis, self.cores),)
        self.where = location(eqn)
        self.ends_at = body_end(_jax.kernel_def_line(eqn))
        self.name = str(p.get("name") or "pl.kernel")
        self.avals: list[Any] = [v.aval for v in jaxpr.invars]
        self.n_in = len(eqn.invars)
        self.n_out = len(tuple(p.get("out_avals", ())))
        roles = (
            ("input", self.n_in),
            ("output", self.n_out),
            ("scratch", len(self.avals) - self.n_in - self.n_out),
        )
        self.param_names, self.param_named = parameter_names(
            _jax.kernel_param_names(jaxpr), self.avals, roles
        )
        aliases = dict(cast("dict[int, int]", p.get("input_output_aliases") or {}))
        self.aliases = {int(o): int(i) for i, o in aliases.items()}
        cp = _jax.tpu_compiler_params(p)
        self.collective_id: object = getattr(cp, "collective_id", None)
        # pl.kernel lowers to the same Mosaic custom call as pallas_call, with the same
        # compiler parameters: without a collective_id, Mosaic's default device barrier
        # runs before it (unless skip_device_barrier).
        self.barrier = self.collective_id is None and not bool(
            getattr(cp, "skip_device_barrier", False)
        )
        self.grid: tuple[int, ...] = ()


class _Run:
    """KernelRun's interface for one core's body (scoped buffers, barrier semaphore)."""

    def __init__(self, desc: _CoreKernel, instance: int) -> None:
        self.desc = desc
        self.instance = instance
        self.name = desc.name
        self.sems: list[Buffer] = []

    def scoped_buffer(self, ctx: Ctx, key: object, aval: Any, where: str) -> Buffer:
        name = f"a run_scoped buffer at {where}"
        buf = engine_of(ctx).buffer(ctx.p, ("s", self.instance, key), aval, name)
        _contents.track_scoped(buf, f"{name} before the kernel writes it")
        return buf

    def check_scoped_sems(self, ctx: Ctx, sems: list[Buffer]) -> None:
        ctx.machine.leave_scope(ctx.p, sems, lambda s: describe_leftover(ctx, s))

    def barrier_semaphore(self, ctx: Ctx, where: str, tagged: bool) -> Buffer:
        """Each core has its barrier semaphore (``{'core': j}`` signals reach core j's);
        like a pallas_call's, it is shared by every call with the same collective_id
        and must be back to zero once all calls are over."""
        cid = self.desc.collective_id
        if cid is None and not tagged and not auto_collective_ids():
            raise MissingCollectiveIdError.in_raw_kernel(where, entry="pl.kernel")
        return engine_of(ctx).barrier_buffer(ctx.p, cid)


def _core_body(ctx: Ctx, desc: _CoreKernel, instance: int, shared: list[RefVal]) -> Gen:
    eng, m, p = engine_of(ctx), ctx.machine, ctx.p
    run_ = _Run(desc, instance)
    saved = (ctx.kernel, ctx.grid, ctx.grid_point, ctx.grid_names, ctx.scoped_counts)
    ctx.kernel, ctx.grid, ctx.grid_point, ctx.grid_names, ctx.scoped_counts = (
        run_,
        (),
        (),
        (),
        dict[int, int](),
    )
    if p % eng.cores != 0:
        m.enter(p, instance)
    args: list[Any] = list(shared)
    for pos in range(len(shared), len(desc.avals)):
        buf = eng.buffer(p, ("k", instance, pos), desc.avals[pos], desc.param_names[pos])
        if buf.space == "SMEM" and buf.sem_kind is None:
            # scratch SMEM holds the scalars the body stores (offsets, tables)
            unset: object = Unknown(f"scratch {buf.name} before the kernel writes it")
            buf.values = list[object]([unset] * math.prod(buf.shape))
        elif buf.values is None or buf.followed:
            # small VMEM scratch: followed as a pallas_call's is (a row count a core
            # copies in from HBM and loads as a vector stays exact)
            _contents.track(buf, f"scratch {buf.name} before the kernel writes it")
        args.append(RefVal(buf))
        if buf.sem_kind is not None:
            run_.sems.append(buf)
    yield from run(desc.body, args, ctx)
    m.leave(p, run_.sems, lambda s: describe_leftover(ctx, s), instance)
    ctx.kernel, ctx.grid, ctx.grid_point, ctx.grid_names, ctx.scoped_counts = saved
    return None


def _mpmd_map(c: Compiler, eqn: Any) -> Op:
    desc = _CoreKernel(eqn)
    ins = [c.reader(a) for a in eqn.invars]
    outs = c.outs(eqn)

    def op(env: list[Any], ctx: Ctx) -> Gen:
        return _run(ctx, desc, [r(env) for r in ins], outs, env)

    return op


def _run(ctx: Ctx, desc: _CoreKernel, operands: list[Any], outs: list[int], env: list[Any]) -> Gen:
    eng, m, p = engine_of(ctx), ctx.machine, ctx.p
    if eng.cores != desc.cores:
        raise VerificationUnsupportedError(
            f"pl.kernel meshes with different core counts in one program ({desc.where})"
        )
    instance = m.enter(p)
    shared: list[RefVal] = []
    outputs: list[Buffer] = []
    for pos in range(desc.n_in + desc.n_out):
        is_out = pos >= desc.n_in
        src: Any = operands[pos] if not is_out else None
        if is_out and (pos - desc.n_in) in desc.aliases:
            src = operands[desc.aliases[pos - desc.n_in]]
        buf = eng.operand_buffer(ctx, instance, pos, desc, src, smem=False, output=is_out)
        shared.append(RefVal(buf))
        if is_out:
            outputs.append(buf)
    if desc.barrier and eng.devices > 1:
        # each device's core 0 meets the others before the kernel starts on its cores
        yield from eng.entry_barrier(ctx, instance, desc.where, eng.devices)
    launch = m.clocks.release(p)
    helpers = [p + k for k in range(1, desc.cores)]
    done = {q: False for q in helpers}

    def finished(q: int) -> None:
        done[q] = True
        m.wake(p)

    for k, q in enumerate(helpers, start=1):
        m.clocks.acquire(q, launch)
        core_ctx = eng.core_ctx(q, desc.axis, k)
        _place(core_ctx, desc.axes, k)
        eng.launch(
            q,
            _helper_job(core_ctx, desc, instance, shared, lambda q=q: finished(q)),
        )
    own, own_sizes = dict(ctx.axis_index), ctx.core_sizes
    _place(ctx, desc.axes, 0)
    yield from _core_body(ctx, desc, instance, shared)
    ctx.axis_index.clear()
    ctx.axis_index.update(own)
    ctx.core_sizes = own_sizes
    while not all(done.values()):
        yield Blocked(p, None, 0, desc.where, "the other cores of the pl.kernel to finish")
    for q in helpers:
        m.clocks.acquire(p, m.clocks.rows[q].copy())
    for buf in outputs:
        view = View(buf, buf.full_box(), buf.shape, buf.itemsize)
        m.check_written(
            p,
            view,
            "the kernel returns output",
            desc.where,
            "Write (or copy into) every part of each output before the kernel returns.",
        )
        end = f"; its body ends at {desc.ends_at}" if desc.ends_at else ""
        m.access(p, view, False, "returns", f"the end of kernel {desc.name} ({desc.where}{end})")
    for s, buf in zip(outs, outputs):
        env[s] = RefVal(buf)
    return None


def _helper_job(ctx: Ctx, desc: _CoreKernel, instance: int, shared: list[RefVal], done: Any) -> Gen:
    yield from _core_body(ctx, desc, instance, shared)
    ctx.machine.clocks.release(ctx.p)
    done()
    return None


register("mpmd_map", _mpmd_map)
