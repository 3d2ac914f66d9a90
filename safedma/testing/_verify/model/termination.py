"""Runs that never end: loops whose state cannot change, and verify's time budget.

A kernel loop that never ends hangs the TPU; the walk would hang with it. Two
guards: a ``while`` loop whose carry is the same after an iteration as before it,
when nothing the carry or the condition depends on is read from memory, can never
end (reported at once, as a kernel error); anything else that runs past the
caller's ``timeout_s`` stops with the loop, device and iteration it was in.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from safedma.testing._errors import SimulationTimeoutError
from safedma.testing._verify import jax_internals as _jax

__all__ = ["Budget", "VerificationTimeoutError", "memory_free", "same_state"]


class VerificationTimeoutError(SimulationTimeoutError):
    """verify was still walking the program at ``timeout_s``: a loop that does not end,
    or a program too large for the time given."""

    def __init__(self, message: str) -> None:
        super().__init__(message, stopped=True)


class Budget:
    """The deadline of one ``verify`` call (monotonic clock), checked by every loop."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s

    def check(self, label: str, where: str, what: str, iteration: int) -> None:
        if time.monotonic() <= self.deadline:
            return
        raise VerificationTimeoutError(
            f"verify stopped after {time.monotonic() - self.start:.1f} s "
            f"(timeout_s={self.timeout_s:g}): {label} was still in the {what} at {where} "
            f"(iteration {iteration}). A loop that never ends hangs the TPU too; if the "
            "program is just large, pass a larger timeout_s (or verify it on fewer "
            "devices, a smaller grid or fewer loop iterations)."
        )


def _reads_memory(eqn: Any) -> bool:
    """Whether an equation's results may depend on memory (a ref's contents, a
    semaphore's count): it takes a ref, or holds a jaxpr with such an equation."""
    if any(
        not _jax.is_literal(a) and _jax.is_ref_aval(getattr(a, "aval", None)) for a in eqn.invars
    ):
        return True
    return any(
        _reads_memory(inner)
        for sub in _jax.sub_jaxprs(eqn.params)
        for inner in _jax.jaxpr_of(sub)[0].eqns
    )


def memory_free(jaxpr: Any) -> bool:
    """Whether ``jaxpr``'s outputs are a function of its inputs alone: no equation they
    depend on reads memory (its effects, e.g. the copies a loop body starts, do not
    matter). Inputs that are refs are excluded by the caller comparing values."""
    needed = {id(v) for v in jaxpr.outvars if not _jax.is_literal(v)}
    for eqn in reversed(jaxpr.eqns):
        if not any(id(v) in needed for v in eqn.outvars):
            continue
        if _reads_memory(eqn):
            return False
        needed.update(id(a) for a in eqn.invars if not _jax.is_literal(a))
    return True


def same_state(before: list[Any], after: list[Any]) -> bool:
    """Whether two carries are the same known scalars (Python or numpy ints, bools)."""
    if len(before) != len(after):
        return False
    for a, b in zip(before, after):
        if type(a) is not type(b) or not isinstance(a, (int, np.integer, np.bool_)):
            return False
        if a != b:
            return False
    return True
