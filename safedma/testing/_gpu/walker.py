"""Walk one kernel program's jaxpr with exact scalars, feeding the protocol its operations.

Scalars are evaluated exactly where the program knows them (literals, loop
counters, program ids); everything read from memory or computed from vectors
is :data:`~safedma.testing._gpu.regions.UNKNOWN`. Loops run iteration by
iteration; a branch on an unknown value runs every branch and goes on only if
they leave the protocol in one state (else the checker refuses).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from safedma.testing._gpu import jax_seam
from safedma.testing._gpu.errors import VerificationUnsupportedError
from safedma.testing._gpu.protocol import Protocol
from safedma.testing._gpu.regions import UNKNOWN, Buffer, Region, region_of
from safedma.testing._verify import jax_internals as ji
from safedma.testing._verify.program.scalars import scalar_rule

__all__ = ["RefVal", "Walker"]

_MAX_STEPS = 5_000_000


@dataclasses.dataclass(frozen=True)
class RefVal:
    """A ref in the walked program: a buffer and the transforms applied to it so far."""

    buffer: Buffer
    transforms: tuple[Any, ...] = ()


# equations that take refs and hand them to a body the walker enters
_CALLS = (
    "pjit",
    "jit",
    "closed_call",
    "core_call",
    "remat",
    "checkpoint",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "custom_lin",
)
# equations with no effect on the protocol even though they take refs
_IGNORED = ("debug_callback", "debug_print", "print_layout", "set_max_registers")
# memory an unknown operation must not touch: the checker tracks who reads and writes it
# (tensor memory, Blackwell's, is not modelled at all). GMEM and the registers of WGMMA
# accumulators are not tracked.
_MODELLED_SPACES = frozenset({"smem", "tmem"})
# primitives that read SMEM operands asynchronously (the tensor core), issued by the thread
_MMA = ("wgmma_ref", "wgmma")


class Walker:
    """Walks jaxprs of one kernel program for ``protocol``."""

    def __init__(
        self,
        protocol: Protocol,
        axes: dict[str, tuple[int, int]],
        program_ids: Sequence[int],
        grid: Sequence[int],
        names: Callable[[Any, int], str],
    ) -> None:
        self.p = protocol
        self.axes = axes
        self.program_ids = tuple(program_ids)
        self.grid = tuple(grid)
        self.steps = 0
        self._ids = itertools.count(1000)
        self._name = names

    # -- values ------------------------------------------------------------------

    @staticmethod
    def _read(env: dict[Any, Any], atom: Any) -> Any:
        if ji.is_literal(atom):
            return _scalar(ji.literal_value(atom))
        return env.get(atom, UNKNOWN)

    def new_buffer(self, aval: Any, name: str) -> Buffer:
        barrier = jax_seam.barrier_arrivals(aval)
        inner = getattr(aval, "inner_aval", aval)
        shape = tuple(int(d) for d in getattr(inner, "shape", ()))
        return Buffer(
            next(self._ids),
            name,
            jax_seam.memory_space_name(aval),
            shape,
            getattr(inner, "dtype", None),
            barrier,
        )

    # -- jaxprs ------------------------------------------------------------------

    def run(
        self, jaxpr: Any, args: Sequence[Any], frames: list[Any], consts: Sequence[Any] = ()
    ) -> list[Any]:
        jaxpr, closed = ji.jaxpr_of(jaxpr)
        env: dict[Any, Any] = {}
        constvals = list(consts) or [_scalar(c) for c in closed]
        for v, val in zip(jaxpr.constvars, constvals):
            env[v] = val
        for v, val in zip(jaxpr.invars, args):
            env[v] = val
        for eqn in jaxpr.eqns:
            self.steps += 1
            if self.steps > _MAX_STEPS:
                raise VerificationUnsupportedError(
                    f"{self.p.where}: the walk took more than {_MAX_STEPS} operations; "
                    "check the kernel with smaller shapes (fewer loop iterations)."
                )
            outs = self.eqn(eqn, [self._read(env, a) for a in eqn.invars], frames)
            for v, val in zip(eqn.outvars, outs):
                env[v] = val
        return [self._read(env, a) for a in jaxpr.outvars]

    def line(self, eqn: Any, frames: list[Any]) -> str:
        here = ji.traceback_frames(eqn.source_info) + frames
        return ji.user_frame_of(here) or "an unknown line"

    def _unsupported(self, eqn: Any, frames: list[Any], why: str) -> VerificationUnsupportedError:
        return VerificationUnsupportedError(
            f"{self.p.where}: `{eqn.primitive.name}` at {self.line(eqn, frames)}: {why}"
        )

    def eqn(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        handler = getattr(self, "_op_" + name, None)
        if handler is not None:
            out: list[Any] = handler(eqn, vals, frames)
            return out
        inner = frames_of(eqn) + frames
        if name in _CALLS:
            sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr")))
            if sub is not None:
                return self.run(sub, vals, inner)
        if name in _IGNORED:
            return [UNKNOWN] * len(eqn.outvars)
        if name in _MMA:
            return self._mma(eqn, vals, frames)
        spaces = {v.buffer.space for v in vals if isinstance(v, RefVal)}
        if any(isinstance(v, RefVal) and v.buffer.barrier is not None for v in vals):
            raise self._unsupported(
                eqn, frames, "an operation on a barrier the checker does not model"
            )
        if spaces & _MODELLED_SPACES:
            raise self._unsupported(
                eqn,
                frames,
                f"an operation on {'/'.join(sorted(spaces & _MODELLED_SPACES)).upper()} "
                "the checker does not model",
            )
        return self._pure(eqn, vals)

    def _pure(self, eqn: Any, vals: list[Any]) -> list[Any]:
        outs = eqn.outvars
        if not all(getattr(o.aval, "shape", None) == () for o in outs) or any(
            v is UNKNOWN or isinstance(v, RefVal) or isinstance(v, np.ndarray) for v in vals
        ):
            return [UNKNOWN] * len(outs)
        rule = scalar_rule(eqn.primitive.name, eqn.params)
        try:
            if rule is not None and not eqn.primitive.multiple_results:
                result = rule(*vals)
                return [_convert(result, outs[0].aval)]
            got = ji.bind_concrete(eqn, vals)
            return [_convert(g, o.aval) for g, o in zip(got, outs)]
        except Exception:
            return [UNKNOWN] * len(outs)

    # -- refs --------------------------------------------------------------------

    def _view(self, ref: Any, tree: Any, leaves: Sequence[Any]) -> tuple[Buffer, Region] | None:
        if not isinstance(ref, RefVal):
            return None
        extra: tuple[Any, ...] = ()
        if tree is not None:
            extra = tuple(ji.unflatten(tree, [_leaf(x) for x in leaves]))
        return ref.buffer, region_of(ref.buffer, ref.transforms + extra)

    def _barrier_index(self, eqn: Any, frames: list[Any], region: Region) -> int:
        buf = region.buffer
        if not region.exact or any(hi != lo + 1 for lo, hi in region.box) or region.frame:
            raise self._unsupported(
                eqn,
                frames,
                f"cannot tell which barrier of {buf.name} it uses (an index "
                "the checker could not evaluate)",
            )
        index = 0
        for (lo, _), dim in zip(region.box, buf.shape):
            index = index * dim + lo
        return index

    def _barrier_name(self, region: Region) -> str:
        return region.text()

    def _ref_access(
        self, eqn: Any, vals: list[Any], frames: list[Any], write: bool, n_values: int
    ) -> None:
        ref = vals[0]
        if not isinstance(ref, RefVal):
            return
        tree = eqn.params.get("tree")
        leaves = vals[1 + n_values :]
        view = self._view(ref, tree, leaves)
        assert view is not None
        buf, region = view
        if buf.barrier is not None:
            raise self._unsupported(eqn, frames, f"reads or writes barrier {buf.name} as data")
        if buf.space != "smem":
            return
        what = "a write" if write else "a read"
        self.p.access(region, write, what, self.line(eqn, frames))

    def _op_get(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        self._ref_access(eqn, vals, frames, False, 0)
        return [UNKNOWN] * len(eqn.outvars)

    _op_load = _op_get

    def _op_swap(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        self._ref_access(eqn, vals, frames, True, 1)
        return [UNKNOWN] * len(eqn.outvars)

    _op_addupdate = _op_swap
    _op_store = _op_swap

    # -- copies and barriers -----------------------------------------------------

    def _split(self, vals: list[Any], *trees: Any) -> list[list[Any]]:
        parts: list[list[Any]] = []
        at = 0
        for tree in trees:
            n = int(tree.num_leaves) if tree is not None else 0
            parts.append(vals[at : at + n])
            at += n
        parts.append(vals[at:])
        return parts

    def _predicate(self, eqn: Any, vals: list[Any], frames: list[Any]) -> bool:
        if not eqn.params.get("has_user_predicate", False):
            return True
        pred = vals[-1]
        if pred is UNKNOWN or isinstance(pred, np.ndarray):
            raise self._unsupported(
                eqn, frames, "its predicate is a value the checker cannot evaluate"
            )
        return bool(pred)

    def _op_copy_gmem_to_smem(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        p = eqn.params
        if p.get("collective_axes") or p.get("leader_tracked") is not None:
            raise self._unsupported(
                eqn, frames, "a collective (multicast or cluster) copy; clusters are not modelled"
            )
        if not p.get("has_barrier", True):
            raise self._unsupported(
                eqn, frames, "a copy without a barrier (cp.async, pre-Hopper) is not modelled"
            )
        src, dst, bar = vals[0], vals[1], vals[2]
        s_leaves, d_leaves, b_leaves, _ = self._split(
            vals[3:],
            p["src_transforms_treedef"],
            p["dst_transforms_treedef"],
            p["barrier_transforms_treedef"],
        )
        if not self._predicate(eqn, vals, frames):
            return []
        del src, s_leaves
        dview = self._view(dst, p["dst_transforms_treedef"], d_leaves)
        bview = self._view(bar, p["barrier_transforms_treedef"], b_leaves)
        if dview is None or bview is None:
            raise self._unsupported(eqn, frames, "its destination or barrier is not a kernel ref")
        bbuf, bregion = bview
        if bbuf.barrier is None or bbuf.barrier[1]:
            raise self._unsupported(eqn, frames, "a cluster barrier; clusters are not modelled")
        index = self._barrier_index(eqn, frames, bregion)
        self.p.copy_in(dview[1], bbuf, index, self._barrier_name(bregion), self.line(eqn, frames))
        return []

    def _barrier_op(self, eqn: Any, vals: list[Any], frames: list[Any]) -> tuple[Buffer, int, str]:
        tree = eqn.params["transforms_treedef"]
        view = self._view(vals[0], tree, self._split(vals[1:], tree)[0])
        if view is None:
            raise self._unsupported(eqn, frames, "its barrier is not a kernel ref")
        buf, region = view
        if buf.barrier is None or buf.barrier[1]:
            raise self._unsupported(eqn, frames, "a cluster barrier; clusters are not modelled")
        return buf, self._barrier_index(eqn, frames, region), self._barrier_name(region)

    def _op_barrier_arrive(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        buf, index, name = self._barrier_op(eqn, vals, frames)
        if self._predicate(eqn, vals, frames):
            self.p.arrive(buf, index, name, self.line(eqn, frames))
        return []

    def _op_barrier_wait(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        buf, index, name = self._barrier_op(eqn, vals, frames)
        self.p.wait(buf, index, name, self.line(eqn, frames))
        return []

    def _op_copy_smem_to_gmem(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        p = eqn.params
        src = vals[0]
        s_leaves, _, _ = self._split(
            vals[2:], p["src_transforms_treedef"], p["dst_transforms_treedef"]
        )
        if not self._predicate(eqn, vals, frames):
            if p.get("commit_group", True):
                self.p.commit_group()
            return []
        view = self._view(src, p["src_transforms_treedef"], s_leaves)
        if view is None:
            raise self._unsupported(eqn, frames, "its source is not a kernel ref")
        self.p.copy_out(view[1], bool(p.get("commit_group", True)), self.line(eqn, frames))
        return []

    def _op_commit_group(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        self.p.commit_group()
        return []

    def _op_wait_smem_to_gmem(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        self.p.wait_stores(int(eqn.params["n"]), bool(eqn.params.get("wait_read_only", False)))
        return []

    def _op_commit_smem(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        self.p.commit_smem()
        return []

    def _mma(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        line = self.line(eqn, frames)
        p = eqn.params
        trees = [p.get("a_transforms_tree"), p.get("b_transforms_tree")]
        refs = [v for v in vals if isinstance(v, RefVal) and v.buffer.space == "smem"]
        leaves = [v for v in vals if not isinstance(v, RefVal)]
        at = 0
        for ref in refs:
            tree = trees.pop(0) if trees and len(refs) == 2 else None
            n = int(tree.num_leaves) if tree is not None else 0
            view = self._view(ref, tree, leaves[at : at + n])
            at += n
            assert view is not None
            region = view[1]
            if tree is None and len(refs) != 2:
                region = dataclasses.replace(region, exact=False)
            self.p.async_read(region, f"the MMA `{eqn.primitive.name}`", line)
        return [UNKNOWN] * len(eqn.outvars)

    # -- program ids -------------------------------------------------------------

    def _op_axis_index(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        axis = eqn.params.get("axis_name")
        names = cast("Sequence[Any]", axis) if isinstance(axis, (tuple, list)) else (axis,)
        index = 0
        for n in names:
            if n not in self.axes:
                raise self._unsupported(
                    eqn, frames, f"the index along axis {n!r}, which the checker does not model"
                )
            at, size = self.axes[n]
            index = index * size + at
        return [index]

    def _op_program_id(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        axis = int(eqn.params["axis"])
        return [self.program_ids[axis] if axis < len(self.program_ids) else 0]

    def _op_num_programs(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        axis = int(eqn.params["axis"])
        return [self.grid[axis] if axis < len(self.grid) else 1]

    # -- control flow ------------------------------------------------------------

    def _op_run_scoped(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        p = eqn.params
        if p.get("collective_axes"):
            raise self._unsupported(eqn, frames, "memory shared across a cluster is not modelled")
        jaxpr, _ = ji.jaxpr_of(p["jaxpr"])
        inner = frames_of(eqn) + frames
        transforms = p.get("ref_transforms") or ((),) * len(jaxpr.invars)
        buffers: list[Buffer] = []
        args: list[Any] = []
        for i, (v, ts) in enumerate(zip(jaxpr.invars, transforms)):
            buf = self.new_buffer(v.aval, self._name(jaxpr, i))
            buffers.append(buf)
            args.append(RefVal(buf, tuple(ts or ())))
        if len(jaxpr.constvars) == len(vals):
            outs = self.run(jaxpr, args, inner, consts=vals)
        else:
            outs = self.run(jaxpr, [*vals, *args], inner)
        line = ji.user_frame_of(frames_of(eqn) + frames)
        self.p.scope_end(buffers, line)
        return outs

    def _op_cond(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        branches = eqn.params["branches"]
        index, ops = vals[0], vals[1:]
        inner = frames_of(eqn) + frames
        if index is not UNKNOWN and not isinstance(index, np.ndarray):
            i = min(max(int(index), 0), len(branches) - 1)
            return self.run(branches[i], ops, inner)
        start = self.p.clone()
        results: list[tuple[Protocol, list[Any]]] = []
        for branch in branches:
            self.p.adopt(start.clone())
            outs = self.run(branch, ops, inner)
            results.append((self.p.clone(), outs))
        self.p.adopt(results[0][0])
        if not self.p.join([r for r, _ in results[1:]]):
            raise self._unsupported(
                eqn,
                frames,
                "a branch on a value the checker cannot evaluate (data read from memory) "
                "changes the barrier protocol or the copies in flight",
            )
        merged: list[Any] = []
        for outs_i in zip(*(o for _, o in results)):
            a = outs_i[0]
            same = all(_same(a, b) for b in outs_i[1:])
            merged.append(a if same else UNKNOWN)
        return merged

    def _op_scan(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        p = eqn.params
        n_consts, n_carry = ji.scan_split(p)
        consts, carry, xs = (
            vals[:n_consts],
            vals[n_consts : n_consts + n_carry],
            vals[n_consts + n_carry :],
        )
        length = int(p["length"])
        inner = frames_of(eqn) + frames
        order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
        for i in order:
            x = [_index(v, i) for v in xs]
            outs = self.run(p["jaxpr"], [*consts, *carry, *x], inner)
            carry = outs[:n_carry]
        return [*carry] + [UNKNOWN] * (len(eqn.outvars) - n_carry)

    def _op_while(self, eqn: Any, vals: list[Any], frames: list[Any]) -> list[Any]:
        p = eqn.params
        nc, nb = int(p["cond_nconsts"]), int(p["body_nconsts"])
        cconsts, bconsts, carry = vals[:nc], vals[nc : nc + nb], vals[nc + nb :]
        inner = frames_of(eqn) + frames
        while True:
            (go,) = self.run(p["cond_jaxpr"], [*cconsts, *carry], inner)
            if go is UNKNOWN or isinstance(go, np.ndarray):
                raise self._unsupported(
                    eqn, frames, "a while loop whose condition the checker cannot evaluate"
                )
            if not bool(go):
                return list(carry)
            carry = self.run(p["body_jaxpr"], [*bconsts, *carry], inner)


def frames_of(eqn: Any) -> list[Any]:
    return ji.traceback_frames(eqn.source_info)


def _scalar(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    try:
        a = np.asarray(value)
    except Exception:
        return UNKNOWN
    if a.shape == () and a.dtype.kind in "biuf":
        return a.item()
    if a.size <= 64 and a.dtype.kind in "biuf":
        return a
    return UNKNOWN


def _convert(value: Any, aval: Any) -> Any:
    if value is UNKNOWN:
        return UNKNOWN
    try:
        kind = np.dtype(aval.dtype).kind
    except TypeError:
        return UNKNOWN
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return int(value)
    if kind == "f":
        return float(value)
    return UNKNOWN


def _leaf(value: Any) -> Any:
    if value is UNKNOWN or isinstance(value, RefVal):
        return UNKNOWN
    return value


def _index(value: Any, i: int) -> Any:
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return _scalar(value[i])
    return UNKNOWN


def _same(a: Any, b: Any) -> bool:
    if a is UNKNOWN or b is UNKNOWN:
        return a is b
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and bool(np.array_equal(cast("NDArray[Any]", a), cast("NDArray[Any]", b)))
        )
    if isinstance(a, RefVal) or isinstance(b, RefVal):
        return bool(a == b)
    return bool(a == b) and type(a) is type(b)
