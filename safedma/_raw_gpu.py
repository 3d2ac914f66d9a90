"""Raw plgpu barrier and TMA-store mistakes, read from a GPU kernel body's jaxpr.

``safedma.checked`` on a Pallas GPU kernel body (``plgpu.kernel``, or ``pl.pallas_call``
with ``plgpu.CompilerParams``): once the body is traced, its equations (and those of every
branch, loop body, ``run_scoped`` and ``jax.jit`` helper inside) are read for what one
thread issues: barrier arrivals (``copy_gmem_to_smem(..., barrier=)``, ``barrier_arrive``),
``barrier_wait``, ``copy_smem_to_gmem`` and ``wait_smem_to_gmem``. A barrier completes a
phase once ``num_arrivals`` arrivals were issued to it; each wait waits for the next phase
by its parity. Only what is wrong on every path is reported, so correct code is never
rejected:

* a wait before which its own straight line (the body's, a loop body's or a branch's)
  surely issues enough arrivals on its slot (the same static slot, or the same index
  expression: ``bars.at[i % 2]`` twice in one iteration) to complete the phase after the
  one it waits, counting every wait that line may have made: that phase may complete
  first, the parity the wait tests comes round again, and it hangs or passes at the
  wrong phase: :class:`~safedma.gpu.BarrierPhaseError`. This holds wherever the line
  runs, whatever came before it: the thread passed its earlier waits, so their phases
  had their arrivals;
* a wait at the top of the body before which fewer arrivals than its phase needs can
  have been issued at all, on a barrier the kernel body allocates (scratch or
  ``run_scoped``) in a kernel of one warpgroup and one block per cluster: nothing else
  arrives while the thread waits, so it hangs: :class:`~safedma.WaitNeverSignalledError`
  when nothing arrives, :class:`~safedma.WaitExceedsCopiesError` otherwise (a second
  wait on one phase's arrivals among them);
* a raw ``copy_smem_to_gmem`` that no ``wait_smem_to_gmem`` can follow (none later in
  the kernel body, none in a loop around it): it may still read shared memory when the
  kernel ends: :class:`~safedma.CopyNeverWaitedError`.

A computed barrier index (``bars.at[i % 2]``) stands for every slot it can take
(``_slot_ranges``); an arrival or wait in a loop, a branch or under a predicate only
widens what may have happened before a later wait of the line around it. A barrier used
by anything else (an MMA, a collective copy, a cluster barrier, a block the reader does
not know) is left alone. Races on shared memory, a missing ``commit_smem`` and whatever depends on loop
counts are for ``safedma.testing.verify_gpu``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeAlias, cast

from safedma import _compat
from safedma._errors import CopyNeverWaitedError, WaitExceedsCopiesError, WaitNeverSignalledError
from safedma._raw_waits import block_inputs
from safedma._slot_ranges import Index, Ranges, Scope, flat_positions, index_of, top_scope

__all__ = ["check_raw_gpu"]

_COPY_IN = "copy_gmem_to_smem"
_ARRIVE = "barrier_arrive"
_WAIT = "barrier_wait"
_STORE = "copy_smem_to_gmem"
_STORE_WAIT = "wait_smem_to_gmem"
_GPU = frozenset({_COPY_IN, _ARRIVE, _WAIT, _STORE, _STORE_WAIT})
# Blocks that run once where they are called; cond runs one branch; any other block
# (loops included) is read as running any number of times.
_ONCE = frozenset({"run_scoped", "pjit", "jit", "closed_call", "core_call", "remat", "checkpoint"})
# Primitives that may wait for stores in ways not read here.
_MAY_WAIT_STORES = frozenset({"inline_mgpu"})
# What plgpu.kernel traces its body for: the run_scoped of its scratch.
_PLGPU_KERNEL = "pallas run_scoped"

Bound: TypeAlias = "int | None"
"""An upper bound; None: none known."""
Interval: TypeAlias = "tuple[int, Bound]"
Effect: TypeAlias = "dict[tuple[int, int], list[Interval]]"
"""Per (barrier, slot): [arrivals, waits] issued, each as (fewest, most)."""


@dataclasses.dataclass(frozen=True)
class _Barrier:
    arrivals: int  # per phase
    shape: tuple[int, ...]
    fresh: bool  # allocated by the kernel body: nothing arrived before it ran


@dataclasses.dataclass(frozen=True)
class _Op:
    kind: str  # "arrive", "wait", "store", "store_wait"
    root: int | None
    slots: frozenset[int] | None  # the slots it can be on; None: any
    sure: bool  # issued whenever its block runs (no user predicate)
    raw: bool  # not emitted by safedma
    line: tuple[str, int] | None
    order: int  # its place in the body, in reading order
    loops: frozenset[int]  # the loops around it
    # The index expression per dimension, where each is known: two ops of one straight
    # line with equal ones are on one slot, whatever value it has in this run.
    same: tuple[Hashable, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _Loop:
    items: list[_Item]


@dataclasses.dataclass(frozen=True)
class _Branches:
    arms: list[list[_Item]]


_Item: TypeAlias = "_Op | _Loop | _Branches"


def _has_gpu_ops(eqns: list[Any]) -> bool:
    for eqn in eqns:
        if eqn.primitive.name in _GPU:
            return True
        if any(_has_gpu_ops(j.eqns) for j in _compat.sub_jaxprs(eqn.params)):
            return True
    return False


class _Reader:
    def __init__(
        self,
        is_own_file: Callable[[str], bool],
        barrier_of: Callable[[object], tuple[int, bool] | None],
        fresh_inputs: set[int],
    ) -> None:
        self.is_own_file = is_own_file
        self.barrier_of = barrier_of
        self.fresh_inputs = fresh_inputs
        self.barriers: dict[int, _Barrier] = {}
        self.opaque: set[int] = set()
        self.lost = False  # a barrier reached a block by a way not followed
        self.ranges = Ranges()
        self.counter = itertools.count()
        self.ops: list[_Op] = []
        self.keep: list[object] = []  # ids are keys: keep what they name alive
        self.names: dict[int, str] = {}  # run_scoped allocations, by their parameter

    def named(self, var: object, jaxpr: Any) -> None:
        """Name a ``run_scoped`` allocation after the parameter of the function it was
        handed to, where jax recorded it."""
        names = getattr(getattr(jaxpr, "debug_info", None), "arg_names", None) or ()
        position = [id(v) for v in jaxpr.invars].index(id(var))
        if position < len(names) and str(names[position]).isidentifier():
            self.names[id(var)] = str(names[position])

    def is_barrier(self, var: object) -> bool:
        return _compat.is_jaxpr_var(var) and self.barrier_of(getattr(var, "aval", None)) is not None

    def root(self, var: object, env: Mapping[int, int]) -> int | None:
        base = _compat.view_base(var)
        if not _compat.is_jaxpr_var(base):
            return None
        key = env.get(id(base), id(base))
        if key == id(base) and key not in self.barriers and self.is_barrier(base):
            self.add_barrier(base, fresh=id(base) in self.fresh_inputs)
        return key

    def add_barrier(self, var: object, *, fresh: bool) -> None:
        self.keep.append(var)
        aval = getattr(var, "aval", None)
        found = self.barrier_of(aval)
        raw_shape: object = getattr(aval, "shape", None)
        dims = cast("tuple[object, ...]", raw_shape) if isinstance(raw_shape, tuple) else ()
        shape = tuple(d for d in dims if isinstance(d, int))
        if found is None or found[1] or len(shape) != len(dims):
            self.opaque.add(id(var))  # a cluster barrier, or one of unknown shape
            self.barriers[id(var)] = _Barrier(1, (), False)
            return
        self.barriers[id(var)] = _Barrier(found[0], shape, fresh)

    def read(self, scope: Scope, env: dict[int, int], loops: frozenset[int]) -> list[_Item]:
        items: list[_Item] = []
        for eqn in scope.eqns:
            operands = scope.operands_of(eqn)
            name = eqn.primitive.name
            if name in _GPU:
                op = self.op(eqn, operands, scope, env, loops)
                if op is not None:
                    items.append(op)
                    self.ops.append(op)
                continue
            bars = [self.root(v, env) for v in operands if self.is_barrier(v)]
            if name in _MAY_WAIT_STORES:
                self.ops.append(self.marker(eqn, loops))
            subs = list(_compat.sub_jaxprs(eqn.params))
            if not subs:
                self.opaque.update(b for b in bars if b is not None)
                continue
            blocks = block_inputs(eqn)
            if blocks is None:
                # Not followed: its barriers are left alone; its stores and waits are
                # read as if in a loop (any order).
                self.opaque.update(b for b in bars if b is not None)
                self.lost = True
                inner_loops = loops | {next(self.counter)}
                for jaxpr in subs:
                    self.read(Scope(jaxpr.eqns, lambda e: list(e.invars)), {}, inner_loops)
                continue
            arms: list[list[_Item]] = []
            inner_loops = loops if name in _ONCE or name == "cond" else loops | {next(self.counter)}
            for jaxpr, positions in blocks:
                inner = dict(env)
                inputs = [*jaxpr.constvars, *jaxpr.invars]
                for k, var in enumerate(inputs):
                    at = positions[k] if k < len(positions) else -1
                    if 0 <= at < len(operands) and _compat.is_jaxpr_var(operands[at]):
                        key = self.root(operands[at], env)
                        if key is not None:
                            inner[id(var)] = key
                    elif self.is_barrier(var):
                        allocated = name == "run_scoped" and var in jaxpr.invars
                        self.add_barrier(var, fresh=allocated)
                        if allocated:
                            self.named(var, jaxpr)
                        if not allocated:
                            self.opaque.add(id(var))
                            self.lost = True
                block = self.ranges.enter(eqn, scope, jaxpr)
                arms.append(self.read(block, inner, inner_loops))
            if name in _ONCE:
                items.extend(item for arm in arms for item in arm)
            elif name == "cond":
                items.append(_Branches(arms))
            else:
                items.append(_Loop([item for arm in arms for item in arm]))
        return items

    def marker(self, eqn: Any, loops: frozenset[int]) -> _Op:
        line = _compat.eqn_user_line(eqn)
        return _Op("store_wait", None, None, False, False, line, next(self.counter), loops)

    def op(
        self,
        eqn: Any,
        operands: list[Any],
        scope: Scope,
        env: Mapping[int, int],
        loops: frozenset[int],
    ) -> _Op | None:
        name, params = eqn.primitive.name, eqn.params
        line = _compat.eqn_user_line(eqn)
        raw = not _compat.emitted_from(eqn, self.is_own_file)
        sure = not params.get("has_user_predicate", False)
        order = next(self.counter)
        if name == _STORE:
            return _Op("store", None, None, sure, raw, line, order, loops)
        if name == _STORE_WAIT:
            return _Op("store_wait", None, None, sure, raw, line, order, loops)
        if name == _COPY_IN:
            if not params.get("has_barrier", True) or len(operands) < 3:
                return None
            barrier = operands[2]
            trees = [params.get(f"{p}_transforms_treedef") for p in ("src", "dst", "barrier")]
            if any(t is None for t in trees):
                self.give_up(barrier, env)
                return None
            skip = sum(int(t.num_leaves) for t in trees[:2])
            tree = trees[2]
            leaves = operands[3 + skip : 3 + skip + int(tree.num_leaves)]
            if params.get("collective_axes") or params.get("leader_tracked") is not None:
                self.give_up(barrier, env)
                return None
            kind = "arrive"
        else:
            if not operands:
                return None
            barrier = operands[0]
            tree = params.get("transforms_treedef")
            if tree is None:
                self.give_up(barrier, env)
                return None
            leaves = operands[1 : 1 + int(tree.num_leaves)]
            kind = "arrive" if name == _ARRIVE else "wait"
        key = self.root(barrier, env)
        if key is None or key not in self.barriers:
            return None
        slots, same = self.slots(tree, leaves, scope, self.barriers[key].shape)
        return _Op(kind, key, slots, sure, raw, line, order, loops, same)

    def give_up(self, barrier: object, env: Mapping[int, int]) -> None:
        key = self.root(barrier, env)
        if key is not None:
            self.opaque.add(key)

    def slots(
        self, tree: Any, leaves: list[Any], scope: Scope, shape: tuple[int, ...]
    ) -> tuple[frozenset[int] | None, tuple[Hashable, ...] | None]:
        """The slots a barrier view can be, and its index expressions (see ``_Op.same``)."""
        try:
            transforms = tree.unflatten(list(leaves))
        except Exception:
            return None, None
        indices = _compat.indexer_scalars(transforms)
        if indices is None or len(indices) != len(shape):
            return None, None
        axes: list[Index] = []
        keys: list[Hashable] = []
        for i, size in zip(indices, shape):
            if isinstance(i, int):
                span: tuple[int | None, int | None] = (i, i)
                keys.append(("const", i))
            else:
                span = self.ranges.span(i, scope)
                keys.append(self.ranges.key(i, scope))
            axes.append(index_of(i, size, span, literal=not _compat.is_jaxpr_var(i)))
        static = all(a.static for a in axes)
        same = tuple(("const", a.lo) for a in axes) if static else tuple(keys)
        return flat_positions(axes, shape), same


def _add(a: Interval, b: Interval) -> Interval:
    return (a[0] + b[0], None if a[1] is None or b[1] is None else a[1] + b[1])


class _Barriers:
    """The arrivals and waits issued so far, per barrier slot, and the rules at a wait."""

    def __init__(self, reader: _Reader, kernel_name: str, names: Mapping[int, str]) -> None:
        self.reader = reader
        self.kernel_name = kernel_name
        self.names = names
        self.single_thread = False

    def slots_of(self, op: _Op) -> frozenset[int]:
        if op.slots is not None:
            return op.slots
        assert op.root is not None
        return frozenset(range(math.prod(self.reader.barriers[op.root].shape)))

    def effect(self, items: list[_Item]) -> Effect:
        out: Effect = {}
        for item in items:
            _merge_into(out, self.item_effect(item))
        return out

    def item_effect(self, item: _Item) -> Effect:
        if isinstance(item, _Op):
            out: Effect = {}
            if item.kind not in ("arrive", "wait") or item.root is None:
                return out
            slots = self.slots_of(item)
            exact = item.sure and len(slots) == 1
            k = 0 if item.kind == "arrive" else 1
            for slot in slots:
                pair: list[Interval] = [(0, 0), (0, 0)]
                pair[k] = (1, 1) if exact else (0, 1)
                out[(item.root, slot)] = pair
            return out
        if isinstance(item, _Loop):
            inner = self.effect(item.items)
            return {
                key: [(0, 0 if hi == 0 else None) for _, hi in pair] for key, pair in inner.items()
            }
        arms = [self.effect(arm) for arm in item.arms]
        out = {}
        keys: set[tuple[int, int]] = set()
        for arm in arms:
            keys.update(arm)
        for key in keys:
            pairs = [arm.get(key, [(0, 0), (0, 0)]) for arm in arms]
            joined: list[Interval] = []
            for k in range(2):
                lo = min(p[k][0] for p in pairs)
                his = [p[k][1] for p in pairs]
                joined.append((lo, None if None in his else max(h for h in his if h is not None)))
            out[key] = joined
        return out

    def run(self, items: list[_Item], *, top: bool = True) -> None:
        """Read ``items`` in order, checking each wait against what came before it in
        them. Each loop body and branch is read the same way on its own, from nothing:
        what its own straight line surely issues is a lower bound wherever it runs."""
        state: Effect = {}
        lines: dict[tuple[int, Hashable], list[tuple[str, int] | None]] = {}
        for item in items:
            if isinstance(item, _Loop):
                self.run(item.items, top=False)
            elif isinstance(item, _Branches):
                for arm in item.arms:
                    self.run(arm, top=False)
            elif item.kind in ("arrive", "wait") and item.root is not None and item.sure:
                if item.same is not None:
                    key = (item.root, item.same)
                    if item.kind == "wait":
                        self.check(item, state, lines.get(key, []), top=top)
                    else:
                        lines.setdefault(key, []).append(item.line)
            _merge_into(state, self.item_effect(item))

    def check(
        self,
        wait: _Op,
        state: Effect,
        lines: list[tuple[str, int] | None],
        *,
        top: bool,
    ) -> None:
        """The rules at ``wait``: ``state`` holds what its straight line issued before it,
        ``lines`` the arrivals there surely on its slot (the same index expression)."""
        assert wait.root is not None
        if not wait.raw or wait.root in self.reader.opaque:
            return
        barrier = self.reader.barriers[wait.root]
        n = barrier.arrivals
        slots = sorted(self.slots_of(wait))
        pairs = [state.get((wait.root, slot), [(0, 0), (0, 0)]) for slot in slots]
        his = [pair[1][1] for pair in pairs]
        most_waits = None if None in his else max(h for h in his if h is not None)
        arrived, waited = pairs[0] if len(slots) == 1 else [(0, None), (0, None)]
        arrived = (max(arrived[0], len(lines)), arrived[1])
        waited = (waited[0], most_waits)
        name = self.barrier_name(wait.root, slots)
        at = _where(wait.line)
        if waited[1] is not None and arrived[0] >= (waited[1] + 2) * n:
            from safedma.gpu._errors import BarrierPhaseError  # noqa: PLC0415 (GPU only)

            started = ", ".join(sorted({_where(line) for line in lines})) or "before it"
            together = (
                f"; if they are meant to complete one phase together, use "
                f"plgpu.Barrier(num_arrivals={arrived[0]})"
                if waited[1] == 0
                else ""
            )
            if top:
                issued = (
                    f"waits for phase {waited[1]} of a barrier of num_arrivals={n}, but "
                    f"{arrived[0]} arrivals (copies or barrier_arrive, at {started}) are issued "
                    f"on it before this wait on every path, enough to complete phase "
                    f"{waited[1] + 1} too"
                )
            else:
                issued = (
                    f"waits on a barrier of num_arrivals={n}, but the loop body or branch "
                    f"around it issues {arrived[0]} arrivals on it (copies or barrier_arrive, "
                    f"at {started}) before this wait, with at most {waited[1]} other wait(s) "
                    "between, enough to complete the phase after the one it waits too"
                )
            raise BarrierPhaseError(
                f"kernel {self.kernel_name!r}: the barrier_wait({name}) at {at} {issued}: "
                "the parity the wait tests comes round again, so it hangs or passes at the "
                "wrong phase. Wait each phase before issuing the next phase's arrivals (one "
                f"barrier_wait per {n} arrival{'s' if n != 1 else ''}), or give each copy in "
                f"flight a barrier slot of its own (bars.at[slot]){together}."
            )
        if not (top and len(slots) == 1 and self.single_thread and barrier.fresh):
            return
        if self.reader.lost:
            return
        if arrived[1] is None or arrived[1] >= (waited[0] + 1) * n:
            return
        phase = waited[0]
        if arrived[1] == 0:
            raise WaitNeverSignalledError(
                f"kernel {self.kernel_name!r}: the barrier_wait({name}) at {at} waits for "
                f"phase 0 of a barrier of num_arrivals={n}, but no copy or barrier_arrive on "
                "it is issued before this wait on any path, and nothing else arrives while "
                "the thread waits, so the kernel hangs there. Issue the copy with "
                f"barrier={name} (or barrier_arrive({name})) before waiting, or wait the "
                "barrier slot the copy arrives on."
            )
        if phase >= 1 and arrived[1] <= phase * n:
            raise WaitExceedsCopiesError(
                f"kernel {self.kernel_name!r}: the barrier_wait({name}) at {at} is a second "
                f"wait on one completion: the {arrived[1]} arrival(s) issued on it before "
                f"(num_arrivals={n}) complete only the {phase} phase(s) the earlier waits "
                "took, and nothing else arrives while the thread waits, so the kernel hangs "
                "there. Keep one barrier_wait per phase: remove the extra wait, or issue the "
                "next phase's copies on the barrier before it."
            )
        missing = (phase + 1) * n - arrived[1]
        raise WaitExceedsCopiesError(
            f"kernel {self.kernel_name!r}: the barrier_wait({name}) at {at} waits for phase "
            f"{phase} of a barrier of num_arrivals={n}, but at most {arrived[1]} arrival(s) "
            f"are issued on it before this wait, {missing} short of completing that phase, "
            "and nothing else arrives while the thread waits, so the kernel hangs there. "
            f"Give the barrier the number of arrivals each phase gets "
            f"(plgpu.Barrier(num_arrivals=...)), or issue {missing} more cop"
            f"{'y' if missing == 1 else 'ies'} or barrier_arrive on it before the wait."
        )

    def barrier_name(self, root: int, slots: list[int]) -> str:
        base = self.names.get(root) or self.reader.names.get(root, "barrier")
        shape = self.reader.barriers[root].shape
        if not shape:
            return base
        if len(slots) > 1:
            return f"{base}.at[{slots[0]}..{slots[-1]}]" if len(shape) == 1 else base
        slot = slots[0]
        index: list[int] = []
        for size in reversed(shape):
            index.append(slot % size)
            slot //= size
        return f"{base}.at[{', '.join(map(str, reversed(index)))}]"


def _merge_into(out: Effect, more: Effect) -> None:
    for key, pair in more.items():
        now = out.get(key, [(0, 0), (0, 0)])
        out[key] = [_add(now[0], pair[0]), _add(now[1], pair[1])]


def _where(line: tuple[str, int] | None) -> str:
    return "an unknown line" if line is None else f"{line[0]}:{line[1]}"


def _never_waited_stores(kernel_name: str, ops: list[_Op]) -> None:
    waits = [op for op in ops if op.kind == "store_wait"]
    left = [
        op
        for op in ops
        if op.kind == "store"
        and op.raw
        and not any(w.order > op.order or (w.loops & op.loops) for w in waits)
    ]
    if not left:
        return
    listed = ", ".join(sorted({_where(op.line) for op in left}))
    raise CopyNeverWaitedError(
        f"kernel {kernel_name!r}: the TMA store copy_smem_to_gmem at {listed} is never "
        "waited: no plgpu.wait_smem_to_gmem follows it in the kernel body on any path, so "
        "the kernel may end while the store still reads shared memory. Call "
        "plgpu.wait_smem_to_gmem(0, wait_read_only=True) after the last store, before the "
        "kernel returns."
    )


def check_raw_gpu(
    frame: object,
    since: int,
    kernel_name: str,
    names: Mapping[int, str],
    is_own_file: Callable[[str], bool],
    *,
    whole_body: bool,
) -> None:
    """Check the raw plgpu barriers and stores traced into ``frame`` (from its ``since``-th
    equation on); nothing when the body issues none.

    ``names``: the kernel-level ref variables (by id) and the parameter text naming them;
    ``whole_body``: jax called the checked function itself to trace it (a kernel body,
    not a helper the body calls): under ``plgpu.kernel`` the barriers it is handed start
    fresh and its end is the kernel's."""
    eqns = _compat.traced_eqns(frame, since)
    if not _has_gpu_ops(eqns):
        return
    from safedma.gpu import _jax_seam  # noqa: PLC0415 (only for GPU bodies)

    kind = _compat.traced_for(frame)
    mesh = _jax_seam.enclosing_mesh()
    # Under plgpu.kernel the body runs once per block; a pl.pallas_call's body may run
    # once per sequential grid step, its scratch kept and its stores waited by jax's
    # pipeline around it: there only what holds whatever came before is checked.
    whole = whole_body and since == 0 and kind == _PLGPU_KERNEL and mesh is not None
    fresh: set[int] = {id(v) for v in _compat.frame_inputs(frame)} if whole else set()
    reader = _Reader(is_own_file, _jax_seam.barrier_of, fresh)
    try:
        items = reader.read(top_scope(eqns), {}, frozenset())
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return  # equations of a form not read here (another jax): nothing is said
    if whole:
        _never_waited_stores(kernel_name, reader.ops)
    barriers = _Barriers(reader, kernel_name, names)
    if mesh is not None:
        barriers.single_thread = mesh == (1, 1)
    else:
        entry, _ = _compat.enclosing_entry()
        barriers.single_thread = entry == "pallas_call"
    barriers.run(items)
