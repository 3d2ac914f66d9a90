"""Where a kernel body stores into one of its refs, and under which conditions: for the
message of an output block copied out unwritten, whose fix is usually a store's
condition (a ``pl.when`` that does not hold on the last step of the block)."""

from __future__ import annotations

from typing import Any

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.program.compiler import location

__all__ = ["written_at"]

_MAX_SITES = 3


def written_at(jaxpr: Any, index: int) -> str:
    """``"; the kernel stores into it at LINE (under the condition at LINE)"`` for the
    stores into the kernel's ``index``-th parameter (up to three), "" when none is
    found (stores by copy, or inside constructs not followed here)."""
    if index >= len(jaxpr.invars):
        return ""
    sites: list[tuple[str, tuple[str, ...]]] = []
    _walk(jaxpr, jaxpr.invars[index], (), sites)
    if not sites:
        return ""
    shown: list[str] = []
    for where, conditions in sites[:_MAX_SITES]:
        under = f" (under the condition at {conditions[-1]})" if conditions else ""
        shown.append(f"{where}{under}")
    return "; the kernel body stores into it at " + ", ".join(shown)


def _walk(
    jaxpr: Any, ref: Any, conditions: tuple[str, ...], sites: list[tuple[str, tuple[str, ...]]]
) -> None:
    for eqn in jaxpr.eqns:
        invars = list(eqn.invars)
        if not any(v is ref for v in invars if not _jax.is_literal(v)):
            continue
        name = eqn.primitive.name
        if name == "swap" and invars[0] is ref:
            sites.append((location(eqn), conditions))
        elif name == "cond":
            # branches take the operands after the predicate, in order
            operands = invars[1:]
            position = next((i for i, v in enumerate(operands) if v is ref), len(operands))
            for branch in eqn.params["branches"]:
                inner = _jax.jaxpr_of(branch)[0]
                if position < len(inner.invars):
                    _walk(inner, inner.invars[position], (*conditions, location(eqn)), sites)
        else:
            # a call whose body takes the operands as they are (pjit, closed_call)
            for sub in _jax.sub_jaxprs(eqn.params):
                inner = _jax.jaxpr_of(sub)[0]
                if len(inner.invars) == len(invars):
                    position = next(i for i, v in enumerate(invars) if v is ref)  # found above
                    _walk(inner, inner.invars[position], conditions, sites)
