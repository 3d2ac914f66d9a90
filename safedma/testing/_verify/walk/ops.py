"""Ops that touch memory and semaphores: ref loads/stores, DMAs, signals, waits."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import (
    VerifiedDeviceOutsideMeshError,
    OutOfBoundsDmaError,
    VerificationUnsupportedError,
    VerifyKernelError,
)
from safedma.testing._verify.model.device_ids import origin_lines
from safedma.testing._verify.model.regions import View
from safedma.testing._verify.model.semantics import Blocked, Machine, SemState
from safedma.testing._verify.program.compiler import (
    Compiler,
    kernel_of,
    location,
    need_int,
    register,
    view_of,
)
from safedma.testing._verify.program.context import Ctx, Gen, Op, RefVal
from safedma.testing._verify.program.scalars import VECTOR, Garbage, Unknown
from safedma.testing._verify.walk import contents as _contents
from safedma.testing._verify.walk.engine import engine_of

__all__: list[str] = []


def _sem_index(view: View) -> int:
    idx = 0
    for (lo, _), n in zip(view.box, view.buffer.shape):
        idx = idx * n + lo
    return idx


def _need_ref(r: Any, what: str, where: str) -> RefVal:
    if not isinstance(r, RefVal):
        raise VerificationUnsupportedError(f"{what} at {where} is not a ref the verifier tracks")
    return r


def _target(ctx: Ctx, device_id: Any, id_type: Any, where: str) -> int:
    """The participant a remote op addresses (mesh dict/tuple form, or logical id)."""
    eng = engine_of(ctx)
    if device_id is None:
        return ctx.p
    names = eng.axis_names
    if type(device_id) is dict and eng.cores == 1:
        flat = _mesh_target(ctx, cast("dict[object, object]", device_id))
        if flat is not None:
            return flat
    coords = dict(ctx.axis_index)
    logical = "LOGICAL" in str(id_type)
    core = ctx.p % eng.cores
    if isinstance(device_id, dict):
        for k, raw in cast("dict[object, object]", device_id).items():
            keys = (
                tuple(str(a) for a in cast("tuple[object, ...]", k))
                if isinstance(k, tuple)
                else (str(k),)
            )
            v = need_int(raw, "a device id")
            if keys == (eng.core_axis,) and eng.cores > 1:
                if not 0 <= v < eng.cores:
                    raise VerifyKernelError(
                        f"core index {v} at {where} is outside the {eng.cores} cores"
                    )
                core = v
                continue
            for name in keys:
                if name not in eng.axis_sizes:
                    raise VerifyKernelError(f"device id at {where} names unknown axis {name!r}")
            # Pallas turns one axis's coordinate into a device by the axis's stride, with
            # no wrap-around: a neighbour computed without a modulo is off the mesh (or,
            # on a mesh of several axes, another row's device). A key of several axes is
            # split into coordinates with a wrap-around, as Pallas splits it.
            span = math.prod(eng.axis_sizes[name] for name in keys)
            if len(keys) == 1 and not 0 <= v < span:
                axes = "x".join(keys)
                raise VerifiedDeviceOutsideMeshError(
                    f"device id at {where}: {axes}={v} is outside the mesh ({axes} has "
                    f"{span} devices); a ring neighbour needs the modulo, e.g. "
                    f"(lax.axis_index(axis) + 1) % size"
                )
            for name in reversed(keys):
                coords[name] = v % eng.axis_sizes[name]
                v //= eng.axis_sizes[name]
    else:
        ids: tuple[object, ...] = (
            tuple(cast("tuple[object, ...]", device_id))
            if isinstance(device_id, (tuple, list))
            else (device_id,)
        )
        vals = [need_int(v, "a device id") for v in ids]
        if logical or len(vals) == 1 and len(names) != 1:
            flat = vals[0]
            if not 0 <= flat < eng.devices:
                raise VerifiedDeviceOutsideMeshError(
                    f"device id {flat} at {where} is outside the mesh of {eng.devices} devices"
                )
            return flat * eng.cores + ctx.p % eng.cores
        if len(vals) != len(names):
            raise VerifyKernelError(
                f"device id {tuple(vals)} at {where} has {len(vals)} coordinates for a mesh "
                f"with axes {names}"
            )
        coords = dict(zip(names, vals))
    for name in names:
        if not 0 <= coords[name] < eng.axis_sizes[name]:
            raise VerifiedDeviceOutsideMeshError(
                f"device id at {where}: {name}={coords[name]} is outside the mesh "
                f"({name} has {eng.axis_sizes[name]} devices)"
            )
    return eng.participant(coords, core)


def _on_core(ctx: Ctx, target: int, core: int, where: str) -> int:
    """``semaphore_signal(..., core_index=core)``: that core of the target device (jax's
    lowering and interpret mode treat it as the core axis of a ``device_id`` dict)."""
    cores = ctx.engine.cores
    if not 0 <= core < cores:
        hint = (
            " (name a TPU with two TensorCores per device, e.g. abstract_mesh(..., "
            "tpu='v5p'), to model the cores)"
            if cores == 1
            else ""
        )
        raise VerifyKernelError(
            f"core index {core} at {where} is outside the {cores} core(s) of a device{hint}"
        )
    return target - target % cores + core


def _mesh_target(ctx: Ctx, device_id: dict[object, object]) -> int | None:
    """The common remote address, ``{axis: int}`` on a one-core mesh, computed directly
    (the general path in :func:`_target` gives the same device); None for any other form,
    and for a coordinate outside its axis, which the general path reports."""
    sizes = ctx.engine.axis_sizes
    for k, raw in device_id.items():
        if type(k) is not str or type(raw) is not int or k not in sizes:
            return None
        if not 0 <= raw < sizes[k]:
            return None
    flat = 0
    here = ctx.axis_index
    for n in engine_of(ctx).axis_names:
        size = sizes[n]
        v = device_id.get(n)
        flat = flat * size + (here[n] if v is None else cast(int, v))
    return flat


def _sem_state(ctx: Ctx, ref: RefVal, owner: int, where: str, what: str) -> SemState:
    key = (ref.buffer.ident, ref.steps, owner)
    cache = engine_of(ctx).sem_cache
    hit = cache.get(key)
    if hit is not None:
        return hit
    state = _sem_state_uncached(ctx, ref, owner, where, what)
    cache[key] = state
    return state


def _sem_state_uncached(ctx: Ctx, ref: RefVal, owner: int, where: str, what: str) -> SemState:
    buf = ref.buffer
    if owner != buf.owner:
        buf = engine_of(ctx).counterpart(buf, owner)
        ref = RefVal(buf, ref.steps)
    view = view_of(ref, where, what, ctx.engine.labels[ctx.p])
    if view.shape != ():
        raise VerifyKernelError(
            f"{what} at {where} is a semaphore array of shape "
            f"{view.shape}; index one semaphore with .at[i]"
        )
    return ctx.machine.sem(buf, _sem_index(view))


def _dma_start(c: Compiler, eqn: Any) -> Op:
    src, dst, dst_sem, src_sem, dev = _jax.unflatten(eqn.params["tree"], eqn.invars)
    g_src, g_dst = c.ref_operand(src), c.ref_operand(dst)
    g_dsem, g_ssem = c.ref_operand(dst_sem), c.ref_operand(src_sem)
    g_dev = _device_getter(c, dev)
    id_type = eqn.params.get("device_id_type")
    where = location(eqn, guard=True)
    adds = bool(eqn.params.get("add", False))
    dev_atoms = _device_atoms(dev)

    def op(env: list[Any], ctx: Ctx) -> None:
        if adds:
            # dst += src reads the destination: modelled as a plain write it would
            # hide an add into a buffer nothing wrote (SparseCore only; Mosaic's
            # TensorCore lowering refuses it).
            raise VerificationUnsupportedError(
                f"a copy started with add=True (it adds its source into the destination) "
                f"at {where}; the verifier models copies that overwrite only"
            )
        eng = engine_of(ctx)
        label = eng.labels[ctx.p]
        target = _addressed_target(ctx, eqn, g_dev(env), id_type, where, dev_atoms)
        s = _need_ref(g_src(env), "the copy source", where)
        d = _need_ref(g_dst(env), "the copy destination", where)
        sv = view_of(s, where, "the copy source", label)
        if target != ctx.p:
            d = RefVal(eng.counterpart(d.buffer, target), d.steps)
        dv = view_of(d, where, "the copy destination", label)
        dsem_ref = g_dsem(env)
        if dsem_ref is None:
            raise VerifyKernelError(f"copy at {where} has no semaphore")
        ssem_ref = g_ssem(env)
        kernel = ctx.kernel
        if target != ctx.p:
            kernel = kernel_of(ctx, "a remote copy", where)
            ctx.machine.check_reach(
                ctx.p,
                target,
                kernel.instance,
                f"a remote copy into {d.buffer.name}",
                where,
                barrier=False,
                # a DMA future: the semaphore (and the buffer) outlive this call
                outlives=any(b is dsem_ref.buffer for b in eng.futures),
                copy=True,
                receive=lambda: _sem_state(ctx, dsem_ref, target, where, "the copy's semaphore"),
            )
        dsem = _sem_state(ctx, dsem_ref, target, where, "the copy's semaphore")
        ssem = (
            _sem_state(ctx, ssem_ref, ctx.p, where, "the copy's send semaphore")
            if ssem_ref is not None
            else None
        )
        if target == ctx.p and ssem is not None and ssem is dsem:
            ssem = None
        if dev_atoms:
            # the messages of a copy sent to the wrong device name where its id was computed
            addressing = ctx.machine.addressing
            if not addressing.knows(where):
                addressing.learn(where, _id_origin(ctx, eqn, dev_atoms))
            addressing.note(where, ctx.p, target, dsem.label)
        ctx.machine.dma_start(ctx.p, target, sv, dv, dsem, ssem, where, kernel.name)
        if dv.buffer.values is not None:
            _copy_values(sv, dv, where)

    return op


def _device_atoms(dev: Any) -> list[Any]:
    """The jaxpr atoms of a copy's device-id operand (a dict's values, a tuple's items)."""
    if dev is None:
        return []
    if isinstance(dev, dict):
        return list(cast("dict[object, object]", dev).values())
    if isinstance(dev, (tuple, list)):
        return list(cast("tuple[object, ...]", dev))
    return [dev]


def _addressed_target(
    ctx: Ctx, eqn: Any, device_id: Any, id_type: Any, where: str, atoms: list[Any]
) -> int:
    """``_target``, with the line that computed a device id outside the mesh added to
    its error: the mistake (a neighbour without its modulo) is written there, not at
    the copy or signal that uses it."""
    try:
        return _target(ctx, device_id, id_type, where)
    except VerifyKernelError as err:
        try:
            computed = _id_origin(ctx, eqn, atoms)()
        except Exception:  # noqa: BLE001 - a hint only: the error itself stands
            computed = list[str]()
        if computed:
            err.args = (f"{err.args[0]} (the device id is computed at {computed[0]})",)
        raise


def _id_origin(ctx: Ctx, eqn: Any, atoms: list[Any]) -> Callable[[], list[str]]:
    """The lines that computed a copy's device id, found when a message asks: data flow
    back from ``atoms`` in the body of the kernel running the copy."""
    root = getattr(getattr(getattr(ctx, "kernel", None), "desc", None), "jaxpr", None)
    if root is None:
        return list
    return lambda: origin_lines(root, eqn, atoms)


def _copy_values(src: View, dst: View, where: str) -> None:
    """A copy into SMEM: the scalars it lands are the source's where known (SMEM to
    SMEM), else data the verifier does not compute (vector data, HBM contents)."""
    values = dst.buffer.values
    if values is None:
        return
    known = src.buffer.values if src.itemsize == dst.itemsize else None
    s_idx = _flat_indices(src) if known is not None else None
    d_idx = _flat_indices(dst)
    if d_idx is None:  # a reshaped/bitcast view: every element may change
        d_idx = list(range(len(values)))
        known = None
    origin = src.buffer.origin or "data the verifier does not follow"
    why = Unknown(
        f"the contents of {dst.buffer.name}, which the copy at {where} fills from "
        f"{src.buffer.name} ({origin})"
    )
    for n, flat in enumerate(d_idx):
        if known is not None and s_idx is not None and len(s_idx) == len(d_idx):
            values[flat] = known[s_idx[n]]
        else:
            values[flat] = why


def _flat_indices(view: View) -> list[int] | None:
    """Row-major flat element indices of a view's box; None when the box is not in the
    buffer's own element coordinates."""
    import itertools

    if len(view.box) != len(view.buffer.shape) or view.itemsize != view.buffer.itemsize:
        return None
    out: list[int] = []
    for idx in itertools.product(*[range(lo, hi) for lo, hi in view.box]):
        flat = 0
        for i, size in zip(idx, view.buffer.shape):
            flat = flat * size + i
        out.append(flat)
    return out


def _device_getter(c: Compiler, dev: Any) -> Callable[[list[Any]], Any]:
    if dev is None:
        return lambda env: None
    if isinstance(dev, dict):
        items = [(k, c.value_getter(v)) for k, v in cast("dict[object, object]", dev).items()]

        def as_dict(env: list[Any]) -> object:
            return {k: g(env) for k, g in items}

        return as_dict
    if isinstance(dev, (tuple, list)):
        gs = [c.value_getter(v) for v in cast("tuple[object, ...]", dev)]

        def as_tuple(env: list[Any]) -> object:
            return tuple(g(env) for g in gs)

        return as_tuple
    g = c.value_getter(dev)
    return g


def _wait_gen(ctx: Ctx, sem: SemState, amount: int, where: str, decrement: bool) -> Gen:
    m = ctx.machine
    while not m.try_wait(ctx.p, sem, amount, decrement, where):
        sem.waiters.append(ctx.p)
        yield Blocked(ctx.p, sem, amount, where, "")
    return None


def _dma_wait(c: Compiler, eqn: Any) -> Op:
    src, _, sem, _, _ = _jax.unflatten(eqn.params["tree"], eqn.invars)
    g_ref, g_sem = c.ref_operand(src), c.ref_operand(sem)
    where = location(eqn)

    def op(env: list[Any], ctx: Ctx) -> Gen:
        label = ctx.engine.labels[ctx.p]
        ref = _need_ref(g_ref(env), "the waited copy", where)
        if ref.buffer.owner != ctx.p:
            ref = RefVal(engine_of(ctx).counterpart(ref.buffer, ctx.p), ref.steps)
        view: View | None = None
        try:
            view = view_of(ref, where, "the waited copy's buffer", label)
            nbytes = view.nbytes
        except OutOfBoundsDmaError:
            # A wait uses only its descriptor's size: kernels wait several copies with
            # one descriptor sized by their total, whose window may overrun the ref.
            nbytes = _window_bytes(ref)
        sem_ref = _need_ref(g_sem(env), "the waited semaphore", where)
        s = _sem_state(ctx, sem_ref, ctx.p, where, "the waited semaphore")
        amount = nbytes if s.kind == "DMA" else 1
        if view is not None:
            ctx.machine.note_wait(ctx.p, view, s, where, amount)
        return _wait_gen(ctx, s, amount, where, True)

    return op


def _window_bytes(ref: RefVal) -> int:
    """The size in bytes of a ref view's window, whether or not it fits its buffer."""
    buf = ref.buffer
    shape: list[int] = list(buf.shape)
    itemsize = buf.itemsize
    for kind, arg in ref.steps:
        if kind == "index":
            entries = cast("tuple[tuple[str, int, int, int], ...]", arg)
            shape = [e[2] for e in entries if e[0] == "slice"]
        elif kind == "reshape":
            shape = list(cast("tuple[int, ...]", arg))
        elif kind == "bitcast":
            total = math.prod(shape) * itemsize
            itemsize = cast(int, arg)
            shape = [total // itemsize]
    return math.prod(shape) * itemsize


def _semaphore_signal(c: Compiler, eqn: Any) -> Op:
    sem, transforms, inc, dev, core = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    g_sem = _transformed(c, sem, transforms)
    g_inc, g_dev = c.value_getter(inc), _device_getter(c, dev)
    g_core = c.value_getter(core) if core is not None else None
    id_type = eqn.params.get("device_id_type")
    where = location(eqn)
    dev_atoms = _device_atoms(dev)

    def op(env: list[Any], ctx: Ctx) -> None:
        device_id = g_dev(env)
        target = _addressed_target(ctx, eqn, device_id, id_type, where, dev_atoms)
        if g_core is not None:
            if isinstance(device_id, dict) and engine_of(ctx).core_axis in device_id:
                raise VerifyKernelError(
                    f"signal at {where} names a core both by core_index and by the "
                    f"{engine_of(ctx).core_axis!r} axis of its device_id (jax refuses both)"
                )
            target = _on_core(ctx, target, need_int(g_core(env), "a core index"), where)
        ref = _need_ref(g_sem(env), "the signalled semaphore", where)
        barrier = ref.buffer.sem_kind == "BARRIER"
        if target != ctx.p:
            eng = engine_of(ctx)
            # A semaphore passed between kernels exists from the call that returned
            # it: the signal needs the target inside that call or after it.
            future = any(b is ref.buffer for b in eng.futures)
            call: int = kernel_of(ctx, "a remote semaphore signal", where).instance
            if future:
                call = eng.born.get(ref.buffer.ident, call)
            ctx.machine.check_reach(
                ctx.p,
                target,
                call,
                f"a signal on semaphore {ref.buffer.name}",
                where,
                barrier=barrier,
                outlives=future,
            )
        s = _sem_state(ctx, ref, target, where, "the signalled semaphore")
        if dev_atoms:
            # a wait no signal reaches names where the signals' device ids were computed
            addressing = ctx.machine.addressing
            if not addressing.knows(where):
                addressing.learn(where, _id_origin(ctx, eqn, dev_atoms), "signal")
            addressing.note(where, ctx.p, target, s.label)
        ctx.machine.signal(ctx.p, s, need_int(g_inc(env), "a signal increment"), where)

    return op


def _semaphore_wait(c: Compiler, eqn: Any) -> Op:
    parts = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    sem, transforms, value = parts[0], parts[1], parts[2]
    decrement = parts[3] if len(parts) > 3 else True
    g_sem, g_val = _transformed(c, sem, transforms), c.value_getter(value)
    g_dec = c.value_getter(decrement)
    where = location(eqn)

    def op(env: list[Any], ctx: Ctx) -> Gen:
        ref = _need_ref(g_sem(env), "the waited semaphore", where)
        s = _sem_state(ctx, ref, ctx.p, where, "the waited semaphore")
        dec = g_dec(env)
        return _wait_gen(
            ctx,
            s,
            need_int(g_val(env), "a wait value"),
            where,
            True if isinstance(dec, Unknown) else bool(dec),
        )

    return op


def _semaphore_read(c: Compiler, eqn: Any) -> Op:
    (out,) = c.outs(eqn)

    def op(env: list[Any], ctx: Ctx) -> None:
        env[out] = Unknown("a semaphore_read (its value depends on the schedule)")

    return op


def _transformed(c: Compiler, ref: Any, transforms: Any) -> Callable[[list[Any]], Any]:
    base = c.ref_operand(ref)
    steps = [c.transform(t) for t in (transforms or ())]

    def get(env: list[Any]) -> Any:
        r = base(env)
        if not isinstance(r, RefVal) or not steps:
            return r
        return RefVal(r.buffer, r.steps + tuple(s(env) for s in steps))

    return get


def _barrier_semaphore(c: Compiler, eqn: Any) -> Op:
    (out,) = c.outs(eqn)
    where = location(eqn)
    tagged = eqn.params.get("tag") is not None  # jax 0.12: jax gives a tagged barrier its id

    def op(env: list[Any], ctx: Ctx) -> None:
        kernel = kernel_of(ctx, "pltpu.get_barrier_semaphore()", where)
        env[out] = RefVal(kernel.barrier_semaphore(ctx, where, tagged))

    return op


def _access(
    c: Compiler,
    eqn: Any,
    ref_atom: Any,
    index_atoms: list[Any],
    tree: Any,
    write: bool,
    read: bool,
    value_atom: Any = None,
) -> Op:
    g_ref = c.reader(ref_atom)
    transforms = _jax.unflatten(tree, index_atoms) if tree is not None else ()
    steps = [c.transform(t) for t in transforms]
    outs = c.outs(eqn)
    scalar_out = bool(outs) and getattr(eqn.outvars[0].aval, "shape", None) == ()
    g_val = c.reader(value_atom) if value_atom is not None else None
    out_aval = eqn.outvars[0].aval if outs else None
    where = location(eqn)
    loaded: dict[str, Unknown] = {}  # the origin of vector loads, per buffer name

    def op(env: list[Any], ctx: Ctx) -> None:
        r = g_ref(env)
        if not isinstance(r, RefVal):
            for s in outs:
                env[s] = VECTOR
            return
        ref = RefVal(r.buffer, r.steps + tuple(s(env) for s in steps)) if steps else r
        m = ctx.machine
        label = ctx.engine.labels[ctx.p]
        view = view_of(ref, where, "the access to", label)
        buf = view.buffer
        old: Any = VECTOR
        garbage: Garbage | None = None
        if read:
            # No R6 check on vector loads: kernels load scratch and mask the value
            # away on the first step (jnp.where(init, ...)); R6 is checked where data
            # leaves: copy sources, pipeline copy-out, kernel outputs. Data loaded from
            # a region nothing wrote is followed as Garbage to where it is stored.
            garbage = _garbage_loaded(m, view, where)
            m.access(ctx.p, view, False, "reads", where)
            if scalar_out and buf.values is not None:
                old = _smem_get(buf, view)
            elif scalar_out:
                old = Unknown(f"the contents of {buf.name} (not known to the verifier)")
            elif garbage is not None:
                old = garbage
            elif (known := _contents.load(view, out_aval, _contents.LIMIT)) is not None:
                old = known  # elements the verifier knows: vector code on them is exact
            else:
                old = loaded.get(buf.name)
                if old is None:
                    old = loaded[buf.name] = Unknown(
                        f"vector data loaded from {buf.name} at {where}"
                    )
        if write:
            m.access(ctx.p, view, True, "writes", where)
            stored = g_val(env) if g_val is not None else None
            # ref[...] = garbage, or ref[...] += x where nothing wrote ref (an
            # accumulator never initialised): the region holds garbage again
            _garbage_stored(m, view, where, stored if isinstance(stored, Garbage) else garbage)
            if buf.values is not None:
                val = stored if g_val is not None else VECTOR
                if read and eqn.primitive.name == "addupdate":
                    val = VECTOR
                if view.shape != () and any(n != 1 for n in view.shape):
                    _contents.store(view, val, f"the contents of {buf.name}, stored at {where}")
                else:
                    _smem_set(buf, view, val)
        for s in outs:
            env[s] = old

    return op


def _garbage_loaded(m: Machine, view: View, where: str) -> Garbage | None:
    """What a vector load of ``view`` at ``where`` gives when nothing wrote any of it
    (followed to where it is stored: docs/verify-model.md, rule 12)."""
    buf = view.buffer
    if (buf.values is not None and not buf.followed) or not m.unwritten(view):
        return None
    return Garbage(
        f"vector data loaded from {buf.name} at {where}",
        f"data loaded at {where} from {buf.name}{_box_text(view)}, which "
        f"nothing wrote{m.partly_from.get(buf.ident, '')}",
        m.root_of(buf),
    )


def _garbage_stored(m: Machine, view: View, where: str, value: Garbage | None) -> None:
    """A store of ``value`` into ``view``: garbage makes the region unwritten again."""
    buf = view.buffer
    if value is not None and (buf.values is None or buf.followed):
        m.store_garbage(view, f" (the store at {where} filled it with {value.note})", value.root)


def _box_text(view: View) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in view.box) + "]"


def _flat(view: View) -> int:
    return _sem_index(view)


def _smem_get(buf: Any, view: View) -> Any:
    if view.shape != () and any(n != 1 for n in view.shape):
        return VECTOR
    v = buf.values[_flat(view)]
    return v


def _smem_set(buf: Any, view: View, val: Any) -> None:
    if view.shape != () and any(n != 1 for n in view.shape):
        n = 1
        for lo, hi in view.box:
            n *= hi - lo
        # a vector store into SMEM: its elements become unknown
        import itertools

        for idx in itertools.product(*[range(lo, hi) for lo, hi in view.box]):
            flat = 0
            for i, size in zip(idx, buf.shape):
                flat = flat * size + i
            buf.values[flat] = Unknown(f"the contents of {buf.name}")
        return
    buf.values[_flat(view)] = val if not isinstance(val, type(None)) else VECTOR


def _get(c: Compiler, eqn: Any) -> Op:
    return _access(
        c, eqn, eqn.invars[0], list(eqn.invars[1:]), eqn.params.get("tree"), write=False, read=True
    )


def _store(c: Compiler, eqn: Any, *, read: bool) -> Op:
    """``ref[idx] = v`` (swap) or ``ref[idx] += v`` (addupdate, which also reads)."""
    ref, value, *indices = eqn.invars
    tree = eqn.params.get("tree")
    return _access(c, eqn, ref, indices, tree, write=True, read=read, value_atom=value)


def _swap(c: Compiler, eqn: Any) -> Op:
    return _store(c, eqn, read=False)


def _addupdate(c: Compiler, eqn: Any) -> Op:
    return _store(c, eqn, read=True)


def _masked_load(c: Compiler, eqn: Any) -> Op:
    parts = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    ref, transforms = parts[0], parts[1]
    whole = parts[2] is None and parts[3] is None  # pl.load / pltpu.load without a mask
    return _access_tr(c, eqn, ref, transforms, write=False, read=True, whole=whole)


def _masked_swap(c: Compiler, eqn: Any) -> Op:
    parts = _jax.unflatten(eqn.params["args_tree"], eqn.invars)
    ref, transforms, val = parts[0], parts[1], parts[2]
    whole = parts[3] is None  # pl.store / pltpu.store without a mask
    return _access_tr(c, eqn, ref, transforms, write=True, read=False, value=val, whole=whole)


def _access_tr(
    c: Compiler,
    eqn: Any,
    ref: Any,
    transforms: Any,
    write: bool,
    read: bool,
    value: Any = None,
    whole: bool = False,
) -> Op:
    """``pl.load`` / ``pl.store`` (masked_load / masked_swap). Without a mask they move
    every element, so garbage is followed as for ``ref[...]`` (docs/verify-model.md,
    rule 12); with one, only some elements move and the value is plain vector data."""
    g = _transformed(c, ref, transforms)
    outs = c.outs(eqn)
    g_val = c.value_getter(value) if value is not None else None
    where = location(eqn)

    def op(env: list[Any], ctx: Ctx) -> None:
        r = g(env)
        out: Unknown = VECTOR
        if isinstance(r, RefVal):
            m = ctx.machine
            view = view_of(r, where, "the access to", ctx.engine.labels[ctx.p])
            buf = view.buffer
            if whole and read:
                out = _garbage_loaded(m, view, where) or VECTOR
            m.access(ctx.p, view, write, "writes" if write else "reads", where)
            stored = g_val(env) if g_val is not None else None
            if write and whole and isinstance(stored, Garbage):
                _garbage_stored(m, view, where, stored)
            if write and buf.values is not None and g_val is not None:
                if whole and view.shape != () and any(n != 1 for n in view.shape):
                    _contents.store(view, stored, f"the contents of {buf.name}, stored at {where}")
                else:
                    _smem_set(buf, view, stored)
        for s in outs:
            env[s] = out

    return op


def _nothing(c: Compiler, eqn: Any) -> Op:
    outs = c.outs(eqn)

    def op(env: list[Any], ctx: Ctx) -> None:
        for s in outs:
            env[s] = VECTOR

    return op


register("dma_start", _dma_start)
register("dma_wait", _dma_wait)
register("semaphore_signal", _semaphore_signal)
register("semaphore_wait", _semaphore_wait)
register("semaphore_read", _semaphore_read)
register("get_barrier_semaphore", _barrier_semaphore)
register("get", _get)
register("swap", _swap)
register("addupdate", _addupdate)
register("masked_load", _masked_load)
register("masked_swap", _masked_swap)
for _name in (
    "delay",
    "trace_value",
    "prng_seed",
    "add_dependency",
    "debug_print",
    "debug_callback",
    "trace_start",
    "trace_stop",
):
    register(_name, _nothing)
