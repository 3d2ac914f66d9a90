"""Where a remote copy's device id was computed: the user's lines of its arithmetic.

Why: a copy sent to the wrong peer (an off-by-one ring neighbour, a device that sends
to itself, an id past the mesh) shows up as a consequence somewhere else: two copies
landing in one device's buffer, a receive wait no copy feeds, a count left over. The
line to fix is the one that computed the id. The kernel's jaxpr keeps it: every
equation records where it was traced, and data flows from the copy's device-id operand
back through the arithmetic (``axis_index``, ``+``, ``%``, ``lax.rem``,
``jnp.where``...), through control flow (a ``pl.when``'s operands, a loop's carry, a
nested call) and through scalar refs (a load reads back what a store put there). This
module follows that flow, only when a message needs it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from safedma.testing._verify import jax_internals as _jax

__all__ = ["origin_lines"]

# Primitives that read or write a ref (Pallas state): a load's value comes from the
# stores into the same ref.
_LOAD = "get"
_STORES = ("swap", "addupdate")
# Control flow whose results come out of its bodies (followed into them); every other
# primitive with a body (a nested jit, custom derivative rules) is one step of
# arithmetic at its user's call line.
_CONTROL = ("cond", "while", "scan")


class _Flow:
    """Producers, body bindings and ref stores of one kernel body, nested bodies included."""

    def __init__(self, root: Any) -> None:
        # var -> (equation that makes it, the equations enclosing that one, outermost first)
        self.producer: dict[Any, tuple[Any, tuple[Any, ...]]] = {}
        # var -> the atoms its value comes from (a body's operand, a loop's carry, a
        # control-flow result's body outputs)
        self.binds: dict[Any, list[Any]] = {}
        # ref var (outermost alias) -> stores into it: (equation, its enclosing ones)
        self.stores: dict[Any, list[tuple[Any, tuple[Any, ...]]]] = {}
        self.found: dict[int, tuple[Any, ...]] = {}  # id(eqn) -> enclosing equations
        self._walked: set[tuple[int, int]] = set()
        self._walk(root, ())

    def _walk(self, jaxpr: Any, path: tuple[Any, ...]) -> None:
        for eqn in jaxpr.eqns:
            self.found[id(eqn)] = path
            for v in eqn.outvars:
                self.producer[v] = (eqn, path)
            name = eqn.primitive.name
            if name in _STORES and eqn.invars:
                self.stores.setdefault(self.ref_root(eqn.invars[0]), []).append((eqn, path))
            for inner, operands, results in _bodies(eqn):
                for v, outer in zip(inner.invars, operands):
                    if outer is not None:
                        self.binds.setdefault(v, []).append(outer)
                if name in _CONTROL:
                    for out, inner_out in zip(eqn.outvars, results):
                        self.binds.setdefault(out, []).append(inner_out)
                if (id(inner), id(eqn)) not in self._walked:
                    self._walked.add((id(inner), id(eqn)))
                    self._walk(inner, (*path, eqn))

    def ref_root(self, v: Any) -> Any:
        """The outermost var a ref var is bound to (a body's ref operand is its caller's)."""
        seen = 0
        while v in self.binds and seen < 64:
            outer = self.binds[v][0]
            if _jax.is_literal(outer):
                break
            v, seen = outer, seen + 1
        return v


def _bodies(eqn: Any) -> Iterator[tuple[Any, list[Any], list[Any]]]:
    """Each body of ``eqn`` with, per body invar, the outer atom (or loop-carried body
    output) it takes, and per equation result the body outputs it comes from."""
    p = eqn.params
    name = eqn.primitive.name
    ins = list(eqn.invars)
    if name == "cond":
        for branch in p.get("branches", ()):
            inner = _jax.jaxpr_of(branch)[0]
            yield inner, ins[1:], list(inner.outvars)
        return
    if name == "while":
        cn, bn = int(p.get("cond_nconsts", 0)), int(p.get("body_nconsts", 0))
        body = _jax.jaxpr_of(p["body_jaxpr"])[0]
        cond = _jax.jaxpr_of(p["cond_jaxpr"])[0]
        carry = ins[cn + bn :]
        yield cond, [*ins[:cn], *carry], []
        yield body, [*ins[cn : cn + bn], *carry], list(body.outvars)
        # the carry also comes back from the previous iteration's body outputs
        yield body, [None] * bn + list(body.outvars), []  # (bindings only)
        return
    if name == "scan":
        nc, ncarry = int(p.get("num_consts", 0)), int(p.get("num_carry", 0))
        body = _jax.jaxpr_of(p["jaxpr"])[0]
        yield body, ins, list(body.outvars)
        yield body, [None] * nc + list(body.outvars[:ncarry]), []
        return
    for sub in _jax.sub_jaxprs(p):
        inner = _jax.jaxpr_of(sub)[0]
        if len(inner.invars) == len(ins):
            yield inner, ins, list(inner.outvars)
        elif len(inner.constvars) == len(ins):  # run_scoped's operands feed its constvars
            yield _ConstsAsInvars(inner), ins, list(inner.outvars)
        else:
            yield inner, [None] * len(inner.invars), list(inner.outvars)


class _ConstsAsInvars:
    """A body whose constvars its equation's operands feed, seen with them as invars."""

    def __init__(self, jaxpr: Any) -> None:
        self.invars = list(jaxpr.constvars)
        self.outvars = list(jaxpr.outvars)
        self.eqns = jaxpr.eqns


# The flows of the latest kernel bodies a message asked about (each holds its jaxpr).
_FLOWS: dict[int, tuple[Any, _Flow]] = {}
_FLOWS_KEPT = 8


def _flow(root: Any) -> _Flow:
    hit = _FLOWS.get(id(root))
    if hit is not None and hit[0] is root:
        return hit[1]
    flow = _Flow(root)
    if len(_FLOWS) >= _FLOWS_KEPT:
        _FLOWS.pop(next(iter(_FLOWS)))
    _FLOWS[id(root)] = (root, flow)
    return flow


def _location(eqn: Any, path: tuple[Any, ...]) -> str | None:
    """The user's line of ``eqn`` inside a kernel body (as ``location`` names it): its
    own frames, then those of the equations enclosing it, which jax cut off."""
    frames = _jax.traceback_frames(eqn.source_info)
    for outer in reversed(path):
        frames.extend(_jax.traceback_frames(outer.source_info))
    return _jax.user_frame_of(frames, whole_kernel=True)


def origin_lines(root: Any, eqn: Any, atoms: Iterable[Any], limit: int = 3) -> list[str]:
    """The user's lines that computed ``atoms`` (``eqn``'s device-id operands) in the
    kernel body ``root``, nearest first (at most ``limit``); empty when ``eqn`` is not in
    ``root`` or nothing computed them (a literal id)."""
    flow = _flow(root)
    if id(eqn) not in flow.found:
        return []
    lines: list[str] = []
    queue = [a for a in atoms if not _jax.is_literal(a)]
    seen: set[int] = set()
    while queue and len(lines) < limit:
        v = queue.pop(0)
        if _jax.is_literal(v) or id(v) in seen:
            continue
        seen.add(id(v))
        queue.extend(flow.binds.get(v, ()))
        made = flow.producer.get(v)
        if made is None:
            continue
        producer, path = made
        name = producer.primitive.name
        if name in _CONTROL:
            continue  # its results come from its bodies (bound above)
        if name == _LOAD:
            # a scalar read back from a ref: what the stores into that ref put there
            for store, _ in flow.stores.get(flow.ref_root(producer.invars[0]), ()):
                queue.append(store.invars[1])
            continue
        where = _location(producer, path)
        if where is not None and where not in lines:
            lines.append(where)
        queue.extend(a for a in producer.invars if not _jax.is_ref_aval(a.aval))
    return lines
