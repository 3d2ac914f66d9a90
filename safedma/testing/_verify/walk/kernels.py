"""One ``pallas_call`` on one participant: operands, grid steps, entry barrier, exit checks."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any, cast


from safedma._compat import auto_collective_ids
from safedma._errors import MissingCollectiveIdError
from safedma.testing._missing_waits import where_the_wait_belongs
from safedma.testing._verify.errors import (
    VerificationUnsupportedError,
    VerifiedRaceError,
)
from safedma.testing._verify.model.leftovers import Kind, kind_of, partial_wait, phrase
from safedma.testing._verify.model.regions import Buffer, Coverage, View
from safedma.testing._verify.model.semantics import Blocked, SemState
from safedma.testing._verify.program.compiler import (
    Compiler,
    register,
    run,
)
from safedma.testing._verify.program.context import Ctx, Gen, InFlight, Op, RefVal
from safedma.testing._verify.program.output_reads import kernel_inputs
from safedma.testing._verify.program.patchy import Patchy, materialize
from safedma.testing._verify.program.scalars import Unknown
from safedma.testing._verify.walk.write_sites import written_at
from safedma.testing._verify.walk import contents as _contents
from safedma.testing._verify.walk import megacore as _megacore
from safedma.testing._verify.walk.block_garbage import (
    copy_in,
    copy_out,
    keep_input,
    kept_dims,
    never_read,
)
from safedma.testing._verify.walk.blocks import (
    block_box,
    block_changes,
    check_revisit,
    fill_block,
    grid_points,
    ints,
    known_values,
)
from safedma.testing._verify.walk.engine import engine_of, operand_origin
from safedma.testing._verify.walk.kernel_desc import KernelDesc

__all__ = ["KernelRun", "describe_leftover"]


class KernelRun:
    """One call of a kernel on one participant."""

    def __init__(self, desc: KernelDesc, instance: int) -> None:
        self.desc = desc
        self.instance = instance
        self.name = desc.name
        self.sems: list[Buffer] = []
        self.barrier_buf: Buffer | None = None

    def scoped_buffer(self, ctx: Ctx, key: object, aval: Any, where: str) -> Buffer:
        name = f"a run_scoped buffer at {where}"
        buf = engine_of(ctx).buffer(ctx.p, ("s", self.instance, key), aval, name)
        _contents.track_scoped(buf, f"{name} before the kernel writes it")
        return buf

    def check_scoped_sems(self, ctx: Ctx, sems: list[Buffer]) -> None:
        ctx.machine.leave_scope(ctx.p, sems, lambda s: describe_leftover(ctx, s))

    def barrier_semaphore(self, ctx: Ctx, where: str, tagged: bool) -> Buffer:
        if self.desc.collective_id is None and not tagged and not auto_collective_ids():
            raise MissingCollectiveIdError.in_raw_kernel(where)
        buf = engine_of(ctx).barrier_buffer(ctx.p, self.desc.collective_id)
        self.barrier_buf = buf
        return buf


def describe_leftover(ctx: Ctx, s: SemState) -> str:
    eng = engine_of(ctx)
    label = eng.labels[s.buffer.owner]
    unit = " bytes" if s.kind == "DMA" else ""
    total = s.total()
    # the copies that carry the count first: a zero-length copy (a row that stayed
    # home in a scatter) is pending too, but it is not what the count is made of.
    # Contributions from one line of one issuer with one size are one item ("2 copies
    # ..."): a loop's copies would otherwise repeat the same words.
    groups: dict[Kind, int] = {}
    for c in sorted(s.pending, key=lambda c: c.amount == 0):
        key = kind_of(eng.labels, s, c)
        groups[key] = groups.get(key, 0) + 1
    if any(key[4] for key in groups):
        # zero-length contributions are not what the count is made of: "and N more"
        shown = [kv for kv in groups.items() if kv[0][4]][:3]
    else:
        shown = list(groups.items())[:3]
    items = [phrase(kind, n, unit) for kind, n in shown]
    plural = [n > 1 for _, n in shown]
    hidden = [n for kv, n in groups.items() if (kv, n) not in shown]
    zero = sum(n for kv, n in groups.items() if not kv[4] and (kv, n) not in shown)
    rest = sum(hidden) - zero
    more = f"; and {rest} more" if rest else ""
    if zero:
        more += f"; and {zero} of zero length"
    brought = sum(c.amount for c in s.pending)
    if items and brought > total:
        # A wait counted these without knowing which landed first (R9): say what is
        # left over, not that each one was never waited.
        fix = (
            f"its waits took {brought - total}{unit} of the {brought}{unit} brought by "
            f"{'; '.join(items)}{more}, whichever landed first, and left the rest "
            "(sizes of the waits must add up to the copies' and signals')"
        )
    elif items:
        fix = (
            "; ".join(
                f"{item} {'were' if many else 'was'} never waited"
                + (where_the_wait_belongs(kind[3]) if kind[0] else "")
                for item, many, (kind, _) in zip(items, plural, shown)
            )
            + more
        )
    elif total > 0:
        partial = partial_wait(eng.labels, s, unit)
        fix = (
            f"its waits took {total}{unit} less than its copies and signals brought"
            f"{partial}{ctx.machine.short_wait_note(s, partial)} (sizes of the waits must add "
            "up to the copies')"
        )
    else:
        fix = "more was waited than it received"
    kernel = getattr(ctx, "kernel", None)
    desc = getattr(kernel, "desc", None)
    if desc is not None:
        fix += f" [kernel {desc.name} at {desc.where}]"
    if s.kind == "DMA":
        fix += (
            ". Wait for every copy before the kernel returns (in a loop, the last "
            "iteration's copy too: R4)"
        )
    else:
        fix += ". Every signal needs a matching wait"
    return f"{label}: {s.kind} semaphore {eng.sem_name(s)} holds {total}{unit}: {fix}"


def _pallas_call(c: Compiler, eqn: Any) -> Op:
    desc = KernelDesc(eqn)
    # what the program around the kernel reads of each output (None: all of it)
    desc.out_read = [c.read_boxes(v) for v in eqn.outvars]
    desc.out_dropped = [not c.is_read(v) for v in eqn.outvars]
    desc.out_read_by = [c.read_by(v) for v in eqn.outvars]
    ins = [c.reader(a) for a in eqn.invars]
    outs = c.outs(eqn)
    inputs = kernel_inputs(eqn)
    first = len(eqn.invars) - desc.n_index - desc.n_in

    def op(env: list[Any], ctx: Ctx) -> Gen:
        operands = [r(env) for r in ins]
        for k in inputs:
            v = operands[k]
            if isinstance(v, Patchy):
                # an input that holds garbage from an earlier kernel: the kernel's own
                # rules judge its reads of it (docs/verify-model.md, rule 12)
                pos = k - first
                ref = engine_of(ctx).input_value(
                    ctx.p, eqn.invars[k].aval, None, desc.param_names[pos]
                )
                materialize(ctx.machine, ref.buffer, v)
                operands[k] = ref
        _check_in_flight_operands(desc, operands, ctx.engine.labels)
        return _run_kernel(ctx, desc, operands, outs, env)

    return op


class _Shared:
    """What the cores of one device share in a kernel call: operands left in place
    (HBM, ANY, arrays resident in VMEM/SMEM) and the arrays blocked outputs are
    copied out into."""

    def __init__(self) -> None:
        self.in_place: dict[int, RefVal] = {}
        self.results: dict[int, Buffer] = {}
        self.outer_out: list[Buffer] = []
        # blocked outputs aliased to an input left in place: their copy-outs write the
        # memory the kernel's own copies address through that input
        self.shared_results: set[int] = set()


class _Frame:
    """One core's side of a kernel call: the kernel's arguments, its pipeline buffers."""

    def __init__(self) -> None:
        self.args: list[Any] = []
        self.blocked: list[tuple[int, Buffer, bool]] = []
        self.smem_blocks: list[tuple[int, Buffer, list[object] | None]] = []
        self.prefetch: list[Any] = []
        # megacore: blocked output j -> (box, grid step) of each block copied out
        self.copied_out: dict[int, list[tuple[tuple[tuple[int, int], ...] | None, Any]]] = {}
        # blocked output j -> block box -> (first, last) grid point of its visit
        self.visits: dict[int, dict[tuple[tuple[int, int], ...], tuple[Any, Any]]] = {}
        self.leftover = False  # a semaphore of this core's was not back to zero at its exit
        # blocked input j -> the array its blocks are copied from (garbage moves with them)
        self.sources: dict[int, Buffer] = {}
        # blocked outputs whose block's contents are followed (contents.py)
        self.known_blocks: set[int] = set()
        # blocked operand j -> why its contents may be unknown (engine.operand_origin)
        self.origins: dict[int, str] = {}


def _frame(
    ctx: Ctx,
    desc: KernelDesc,
    run_: KernelRun,
    operands: list[Any],
    shared: _Shared | None,
    cores: list[int],
) -> tuple[_Frame, _Shared]:
    """Build participant ``ctx.p``'s arguments. The first core of a device builds the
    shared operands (``shared`` None) and registers them for the device's other
    ``cores``; each core gets its own scalar-prefetch copies, pipeline buffers and
    scratch."""
    eng, m, p = engine_of(ctx), ctx.machine, ctx.p
    instance = run_.instance
    first = shared is None
    sh = _Shared() if shared is None else shared
    fr = _Frame()
    args = fr.args
    for k, captured in enumerate(operands[: desc.n_consts]):
        if not isinstance(captured, RefVal):
            raise VerificationUnsupportedError(
                f"kernel {desc.name} at {desc.where} closes over a value that is not a "
                f"ref (captured operand {k}); pass it as an input"
            )
        args.append(captured)  # the ref itself, in place
    operands = operands[desc.n_consts + desc.n_dynamic :]
    # scalar prefetch operands: SMEM with known values
    for i in range(desc.n_index):
        args.append(RefVal(eng.operand_buffer(ctx, instance, i, desc, operands[i], smem=True)))
    fr.prefetch = args[desc.n_consts :]
    for j in range(desc.n_in + desc.n_out):
        pos = desc.n_index + j
        block = desc.blocks[j]
        is_out = j >= desc.n_in
        if is_out:
            # input_output_aliases counts every operand, scalar prefetch included
            alias = desc.aliases.get(j - desc.n_in)
            src = operands[alias] if alias is not None else None
        else:
            src = operands[pos]
        # An operand whose array already lives in VMEM/SMEM (an out_shape made with
        # pltpu.VMEM(...), or such an output passed on) is the buffer itself:
        # Pallas copies nothing in or out of it.
        resident = block["space"] in ("VMEM", "SMEM") and (
            (is_out and block["array_space"] in ("VMEM", "SMEM"))
            or (isinstance(src, RefVal) and src.buffer.ident in eng.resident)
        )
        if block["space"] in ("ANY", "HBM", "HOST", "SEMAPHORE") or resident:
            if not first:
                args.append(sh.in_place[pos])
                continue
            buf = eng.operand_buffer(ctx, instance, pos, desc, src, smem=False, output=is_out)
            if is_out and src is None and buf.values is None:
                # a small output in HBM: its contents are followed, so a value the kernel
                # copies out to it by DMA (a schedule's step count flushed from SMEM)
                # reaches the kernel that reads it next
                why = f"output {buf.name} where the kernel does not write it"
                _contents.track(buf, why, _contents.OUTPUT_LIMIT)
            for q in cores[1:]:
                # the device's other cores address the same memory
                eng.adopt(q, ("k", instance, pos), buf, desc.avals[pos], desc.param_names[pos])
            if resident:
                eng.resident.add(buf.ident)
            sh.in_place[pos] = RefVal(buf)
            args.append(sh.in_place[pos])
            if buf.sem_kind is not None:
                eng.futures.append(buf)  # a semaphore passed between kernels
            if is_out:
                sh.outer_out.append(buf)
            continue
        buf = eng.operand_buffer(
            ctx,
            instance,
            pos,
            desc,
            src,
            smem=bool(block["space"] == "SMEM"),
            output=is_out,
            block=True,
        )
        args.append(RefVal(buf))
        fr.blocked.append((j, buf, is_out))
        if buf.values is None:
            # a small VMEM block: its contents are followed (an input's filled from the
            # operand's at each step, as SMEM blocks are; an output's copied out)
            _contents.track(buf, f"the block of {buf.name} (not known to the verifier)")
        if is_out and buf.values is not None:
            fr.known_blocks.add(j)
        fr.origins[j] = operand_origin(desc.param_names[pos], src)
        if not is_out and isinstance(src, RefVal) and not src.steps:
            history = m.histories.get(src.buffer.ident)
            if history is None or not history.coverage.covers(src.buffer.full_box()):
                fr.sources[j] = src.buffer  # each block copied in carries its garbage
        if not is_out and buf.values is not None:
            # an SMEM block: each step holds its window of the operand's values
            fr.smem_blocks.append((j, buf, known_values(src, block["array_shape"])))
        if is_out and first:
            alias_pos = desc.aliases.get(j - desc.n_in)
            in_place = sh.in_place.get(alias_pos) if alias_pos is not None else None
            if in_place is not None:
                # aliased to an input the kernel sees in HBM: the output is that memory
                res = in_place.buffer
                sh.shared_results.add(j)
            else:
                res = eng.buffer(
                    p,
                    ("r", instance, pos),
                    desc.avals[pos],
                    desc.param_names[pos],
                    shape=ints(block["array_shape"]),
                )
            if type(src) is RefVal and not src.steps:
                # aliased: blocks never copied out keep the input, its garbage too (in
                # place, the output is the input's memory and holds what it holds)
                if src.buffer is not res:
                    keep_input(m, src.buffer, res)
            elif src is not None:
                m.mark_written(res)  # aliased: blocks never copied out keep the input
            sh.results[j] = res
            sh.outer_out.append(res)
    for k in range(desc.n_scratch):
        pos = desc.n_index + desc.n_in + desc.n_out + k
        buf = eng.operand_buffer(ctx, instance, pos, desc, None, smem=False)
        if buf.values is None:
            _contents.track(buf, f"scratch {buf.name} before the kernel writes it")
        if buf.values is not None:
            # scratch SMEM starts with nothing the caller could pass in
            unset: object = Unknown(f"scratch {buf.name} before the kernel writes it")
            buf.values = list[object]([unset] * len(buf.values))
        args.append(RefVal(buf))
        if buf.sem_kind is not None:
            run_.sems.append(buf)
    return fr, sh


def _steps(
    ctx: Ctx,
    desc: KernelDesc,
    fr: _Frame,
    sh: _Shared,
    points: Iterable[tuple[int, ...]],
    hint: str,
) -> Gen:
    """Run grid ``points`` in order on ``ctx.p`` with Pallas's pipeline around each:
    input blocks copied in before, output blocks copied out when the next point's
    block differs and after the last point (``hint``: what the core split adds to
    an unwritten-output message). ``points`` is consumed one point ahead (a grid
    may be too large to list)."""
    m, p = ctx.machine, ctx.p
    # blocked output j -> (its current block's box, the grid point its visit began at)
    visit: dict[int, tuple[tuple[tuple[int, int], ...] | None, tuple[int, ...]]] = {}
    budget, label = ctx.engine.budget, ctx.engine.labels[p]
    ahead = iter(points)
    nxt = next(ahead, None)
    n = -1
    while nxt is not None:
        point, nxt, n = nxt, next(ahead, None), n + 1
        budget.check(label, desc.where, f"grid of kernel {desc.name}", n)
        ctx.grid_point = point
        for j, buf, is_out in fr.blocked:
            if not is_out:
                box = block_box(desc, ctx, j, point, fr.prefetch)  # in bounds
                view = _full(buf)
                m.access(p, view, True, "copies the next input block into", desc.where)
                src = fr.sources.get(j)
                if src is not None:
                    copy_in(m, p, desc, j, src, box, buf)
            elif j not in visit:
                box = block_box(desc, ctx, j, point, fr.prefetch)
                check_revisit(ctx, desc, fr.visits, j, box, point)
                visit[j] = (box, point)
        for j, buf, values in fr.smem_blocks:
            fill_block(desc, ctx, j, buf, values, point, fr.prefetch, fr.origins.get(j))
        yield from run(desc.body, fr.args, ctx)
        last = nxt is None
        for j, buf, is_out in fr.blocked:
            if is_out and (nxt is None or block_changes(desc, ctx, j, point, nxt, fr.prefetch)):
                view = _full(buf)
                # a block the program never reads may carry garbage out (padding rows
                # a later kernel skips, sliced off at the end): judged where it is read
                block = visit[j][0]
                unread = never_read(desc, j, block) and kept_dims(desc, j, buf) is not None
                if not unread:
                    m.check_written(
                        p,
                        view,
                        "the pipeline copies out",
                        desc.where + written_at(desc.jaxpr, desc.n_index + j),
                        "Write every output block before the grid step ends." + hint,
                    )
                m.access(p, view, False, "copies the output block out of", desc.where)
                # the block index is the same at every point of the visit: so is the box
                box, began = visit.pop(j)
                if box is not None:
                    fr.visits.setdefault(j, {})[box] = (began, point)
                if j in sh.shared_results and box is not None:  # None: rows not known
                    res = sh.results[j]
                    block_view = View(res, box, tuple(hi - lo for lo, hi in box), res.itemsize)
                    m.access(p, block_view, True, "copies an output block into", desc.where)
                if j in fr.known_blocks and box is not None:
                    _block_out(buf, box, sh.results[j])
                if unread and box is not None:
                    copy_out(m, desc, j, buf, box, sh.results[j])
                else:
                    m.mark_written(sh.results[j], box)
                if hint:
                    fr.copied_out.setdefault(j, []).append((box, point))
                if not last:
                    _fresh_block(m, buf)
    return None


def _block_out(buf: Buffer, box: Any, res: Buffer) -> None:
    """The pipeline's copy of output block ``buf`` into ``box`` of the result ``res``:
    a small result keeps what the kernel wrote (the next kernel may read it as scalars)."""
    if res.values is None:
        if math.prod(res.shape) > _contents.LIMIT:
            return
        res.values = list[object](
            [Unknown(f"the parts of {res.name} no block of the kernel wrote")]
            * math.prod(res.shape)
        )
        res.followed = True
    _contents.copy_box(res.values, res.shape, box, buf, "", to_src=True)


def _split(
    ctx: Ctx, desc: KernelDesc, grid: tuple[int, ...]
) -> tuple[tuple[int, ...], list[_megacore.CorePart]] | None:
    """(split dimensions, each core's grid points) on a megacore chip, or None when
    the kernel runs on one core (no megacore, or no leading "parallel" dimension)."""
    chip = engine_of(ctx).chip
    if chip is None or chip.cores < 2:
        return None
    dims = _megacore.split_dims(desc.semantics, desc.name, desc.where)
    if not dims:
        return None
    if ctx.engine.cores != chip.cores:
        raise VerificationUnsupportedError(
            f"kernel {desc.name} at {desc.where} splits its 'parallel' grid dimensions "
            f"between the {chip.cores} TensorCores of a {chip.name}, and the program also "
            f"runs a pl.kernel over {ctx.engine.cores} cores; verify models one core "
            "count per program"
        )
    return dims, _megacore.core_parts(grid, len(dims), chip.cores)


def _run_kernel(
    ctx: Ctx, desc: KernelDesc, operands: list[Any], outs: list[int], env: list[Any]
) -> Gen:
    eng, m, p = engine_of(ctx), ctx.machine, ctx.p
    instance = m.enter(p)
    run_ = KernelRun(desc, instance)
    grid = _grid(desc, operands)
    saved = (ctx.kernel, ctx.grid, ctx.grid_point, ctx.grid_names, ctx.scoped_counts)
    saved_axes = ctx.grid_axes
    ctx.kernel, ctx.grid, ctx.grid_names, ctx.scoped_counts = (
        run_,
        grid,
        tuple(desc.params["grid_names"]),
        dict[int, int](),
    )
    ctx.grid_axes = desc.grid_axes
    split = _split(ctx, desc, grid)
    cores = [p + k for k in range(eng.cores)] if split is not None else [p]
    points: Iterable[tuple[int, ...]] = grid_points(grid)
    fr, sh = _frame(ctx, desc, run_, operands, None, cores)
    parties = eng.devices * len(cores)
    done: dict[int, _Frame | None] = {q: None for q in cores[1:]}
    hint = ""
    if split is not None:
        dims, parts = split
        points = parts[0]
        hint = _megacore.copy_out_hint(cast(_megacore.Chip, eng.chip), dims, parts)
        launch = m.clocks.release(p)
        for k, q in enumerate(cores[1:], start=1):
            m.clocks.acquire(q, launch)
            eng.launch(q, _core_part(ctx, q, desc, operands, sh, parts[k], hint, done, parties))
    if desc.barrier and eng.participants > 1:
        yield from eng.entry_barrier(ctx, instance, desc.where, parties)
    yield from _steps(ctx, desc, fr, sh, points, hint)
    if split is not None:
        while any(f is None for f in done.values()):
            yield Blocked(
                p, None, 0, desc.where, "the other TensorCore's part of the grid (megacore)"
            )
        for q in cores[1:]:
            m.clocks.acquire(p, m.clocks.rows[q].copy())
        assert eng.chip is not None
        _megacore.check_disjoint_outputs(
            m.labels,
            cores,
            [fr.copied_out, *[cast(_Frame, done[q]).copied_out for q in cores[1:]]],
            {
                # an output the program drops (jax 0.10's splash attention returns its
                # m/l/o accumulators as outputs it discards) may hold either core's block
                j: desc.param_names[desc.n_index + j]
                for j in sh.results
                if not _dropped(desc, j - desc.n_in)
            },
            eng.chip,
            desc.name,
            desc.where,
            split[0],
        )
    sems = list(run_.sems)
    before = len(m.leftovers)
    m.leave(p, sems, lambda s: describe_leftover(ctx, s), instance)
    helpers_left = any(f is not None and f.leftover for f in done.values())
    _returns(ctx, desc, sh, len(m.leftovers) == before and not helpers_left)
    returned = frozenset(b.ident for b in sh.outer_out if b.sem_kind is not None)
    for buf in sh.outer_out:
        m.made_by[buf.ident] = f"kernel {desc.name} at {desc.where}"
    for s, buf in zip(outs, sh.outer_out):
        writes = _in_flight_writes(m, buf) if returned else []
        env[s] = (
            RefVal(buf)
            if not writes
            else InFlight(
                buf,
                str(writes[0].dma.where),
                desc.name,
                writes[0],
                returned,
                tuple((w.box, str(w.dma.where)) for w in writes),
            )
        )
    ctx.kernel, ctx.grid, ctx.grid_point, ctx.grid_names, ctx.scoped_counts = saved
    ctx.grid_axes = saved_axes
    return None


def _core_part(
    ctx0: Ctx,
    q: int,
    desc: KernelDesc,
    operands: list[Any],
    sh: _Shared,
    points: Iterable[tuple[int, ...]],
    hint: str,
    done: dict[int, _Frame | None],
    parties: int,
) -> Gen:
    """Core ``q``'s part of a megacore-split kernel call: its own scratch, semaphores
    and pipeline over ``points``, the device's shared operands."""
    eng, m = engine_of(ctx0), ctx0.machine
    ctx = Ctx(q, eng, dict(ctx0.axis_index))
    instance = cast(KernelRun, ctx0.kernel).instance
    m.enter(q, instance)
    run_ = KernelRun(desc, instance)
    ctx.kernel, ctx.grid, ctx.grid_names, ctx.scoped_counts = (
        run_,
        ctx0.grid,
        ctx0.grid_names,
        dict[int, int](),
    )
    ctx.grid_axes = desc.grid_axes
    fr, _ = _frame(ctx, desc, run_, operands, sh, [])
    if desc.barrier and eng.participants > 1:
        yield from eng.entry_barrier(ctx, instance, desc.where, parties)
    yield from _steps(ctx, desc, fr, sh, points, hint)
    before = len(m.leftovers)
    m.leave(q, list(run_.sems), lambda s: describe_leftover(ctx, s), instance)
    fr.leftover = len(m.leftovers) != before
    done[q] = fr
    m.wake(ctx0.p)
    return None


def _in_flight_writes(m: Any, buf: Buffer) -> list[Any]:
    """The pending writes of the copies still writing ``buf`` (a DMA future's
    destination as its start kernel returns it), in the order they were recorded."""
    history = m.histories.get(buf.ident)
    seen: set[int] = set()
    out: list[Any] = []
    for bucket in history.buckets if history is not None else ():
        for rec in bucket:
            if rec.part < 0 and rec.write and rec.dma is not None and id(rec) not in seen:
                seen.add(id(rec))
                out.append(rec)
    return out


def _check_in_flight_operands(desc: KernelDesc, operands: list[Any], labels: list[str]) -> None:
    """A kernel that takes a DMA future's destination without its semaphore is not the
    kernel that waits it: XLA orders the two by data only, so this one may run before
    the wait even when the program lists it after (the walk then finds the copy settled
    and could not see the race)."""
    sems = {v.buffer.ident for v in operands if isinstance(v, RefVal)}
    for v in operands:
        if type(v) is InFlight and v.write.part >= 0 and not v.sems & sems:
            buf = v.buffer
            raise VerifiedRaceError(
                f"data race on {labels[buf.owner]}'s buffer {buf.name}: kernel {desc.name} "
                f"at {desc.where} takes it as kernel {v.kernel} returned it, with the copy "
                f"started at {v.copy} in flight (a DMA future), and not the copy's "
                "semaphore: XLA orders the two kernels by data only, so it may run before "
                "the kernel that waits the copy. Pass it what the waiting kernel returns "
                "(finish_async's result, or the done kernel's aliased output) instead."
            )


def _dropped(desc: KernelDesc, k: int) -> bool:
    return k < len(desc.out_dropped) and desc.out_dropped[k]


def _returns(ctx: Ctx, desc: KernelDesc, sh: _Shared, clean: bool) -> None:
    """The kernel returns its outputs: each is read, and must have been written."""
    eng, m, p = engine_of(ctx), ctx.machine, ctx.p
    # A copy left in flight is reported as the leftover semaphore it causes; a kernel
    # that returns semaphores returns copies in flight (DMA futures): their buffers
    # are checked where the kernel that waits them reads or returns them.
    future = any(b.sem_kind is not None for b in sh.outer_out)
    for k, buf in enumerate(sh.outer_out) if clean and not future else ():
        blocked_result = any(buf is r for r in sh.results.values())
        if (
            buf.space in ("ANY", "HBM", "HOST") or buf.ident in eng.resident or blocked_result
        ) and (buf.sem_kind is None):
            view = _full(buf)
            end = f"; its body ends at {desc.ends_at}" if desc.ends_at else ""
            m.access(
                p, view, False, "returns", f"the end of kernel {desc.name} ({desc.where}{end})"
            )
            if buf.ident in eng.resident:
                # VMEM/SMEM storage handed to the next kernel (a prefetch buffer, a
                # pipeline window): garbage in it is reported where something reads it
                continue
            if _dropped(desc, k):
                # an output the program never uses (HBM scratch passed as an output,
                # dropped by the wrapper): its garbage goes nowhere
                continue
            # Checked once every participant is done: a remote copy into this output
            # that arrives after the kernel returned is then reported as what it is
            # (R8, naming the copy) rather than as an output nothing wrote.
            read = desc.out_read[k] if k < len(desc.out_read) else None
            views = [view]
            if read is not None and all(len(box) == len(buf.shape) for box in read):
                # the program only slices this output: parts it drops may stay unwritten
                views = [
                    View(buf, box, tuple(hi - lo for lo, hi in box), buf.itemsize) for box in read
                ]
            reader = desc.out_read_by[k] if k < len(desc.out_read_by) else ""
            where = f"{desc.where}, read by {reader}" if reader else desc.where
            for part in views:
                eng.deferred.append(
                    functools.partial(
                        m.check_written,
                        p,
                        part,
                        "the kernel returns output",
                        where,
                        "Write (or copy into) every part of each output before the "
                        "kernel returns, or alias it to an input (a remote copy into it "
                        "must be waited, wait_recv, before the kernel returns).",
                    )
                )


def _grid(desc: KernelDesc, operands: list[Any]) -> tuple[int, ...]:
    """The grid of this call: dynamic sizes are the kernel's leading scalar operands."""
    if desc.n_dynamic == 0:
        return desc.grid
    bounds = iter(operands[desc.n_consts : desc.n_consts + desc.n_dynamic])
    grid: list[int] = []
    for g in desc.grid:
        if g >= 0:
            grid.append(g)
            continue
        value: Any = next(bounds, None)
        if getattr(value, "size", None) == 1 and hasattr(value, "item"):
            value = value.item()  # a known scalar computed outside the kernel (numpy)
        if not isinstance(value, int):
            why = str(getattr(value, "why", "data the verifier does not compute"))
            raise VerificationUnsupportedError(
                f"kernel {desc.name} at {desc.where} has a dynamic grid whose size depends "
                f"on {why}; give the function's arguments it is computed from as concrete arrays, or "
                "check this kernel with safedma.testing.simulate"
            )
        grid.append(int(value))
    return tuple(grid)


def _fresh_block(m: Any, buf: Buffer) -> None:
    """The output block after a copy-out holds no data of the next block: Pallas
    writes the next block into another pipeline buffer (stale, or garbage at the
    start) and never copies an output block in, so what the kernel wrote for the
    block just copied out does not count as written for the next one."""
    history = m.histories.get(buf.ident)
    if history is not None:
        history.coverage = Coverage()


def _full(buf: Buffer) -> Any:
    return View(buf, buf.full_box(), buf.shape, buf.itemsize)


register("pallas_call", _pallas_call)
