"""What the lane runs: the kernels of this run's slice, their verdicts (once per process),
and the record of each mutant."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax

from tests.corpus import _run
from tests.corpus._case import Program
from tests.field import _mutants, _packages, _verdicts
from tests.field._kernel import FieldKernel

SLICE_VARIABLE = "SAFEDMA_FIELD_SLICE"
TOOLS = ("verify", "trace")


def in_ci_slice() -> bool:
    return os.environ.get(SLICE_VARIABLE) == "ci"


@functools.cache
def lane_kernels() -> tuple[FieldKernel, ...]:
    """The kernels this run drives: all, or in CI's slice those not marked slow."""
    _packages.put_on_path()
    from tests.field.drivers import all_kernels

    kernels = all_kernels()
    if in_ci_slice():
        kernels = [k for k in kernels if not k.slow]
    return tuple(kernels)


def lane_mutants() -> list[tuple[FieldKernel, _mutants.Mutant]]:
    """The mutants of the first kernel driving each module (its other drivers are
    variants of one source)."""
    from tests.field.drivers import all_kernels

    first: dict[str, FieldKernel] = {}
    for kernel in all_kernels():  # the first of every kernel, whatever this run's slice
        first.setdefault(kernel.module, kernel)
    driven = {id(k) for k in lane_kernels()}
    return [
        (kernel, m)
        for kernel in first.values()
        if id(kernel) in driven
        for m in _mutants.mutants_of(kernel.module, _mutants.SITES_PER_OPERATOR)
    ]


@functools.cache
def original_verdicts(kernel: FieldKernel) -> dict[str, _verdicts.Verdict]:
    program = kernel.program()
    tools = TOOLS + (("simulate",) if kernel.simulate else ())
    return {tool: _verdicts.CHECKERS[tool](program) for tool in tools}


def program_text(program: Program) -> str:
    """The traced program, as text: two programs with the same text are the same."""
    fn, args, mesh = program.whole()
    with _run._mesh_context(mesh):
        return str(jax.jit(fn).trace(*args).jaxpr)


@functools.cache
def original_text(kernel: FieldKernel) -> str:
    return program_text(kernel.program())


def mutant_record(kernel: FieldKernel, mutant: _mutants.Mutant) -> dict[str, Any]:
    """Whether the mutant counts (and why not), and what each checker says of it."""
    base: dict[str, Any] = {"operator": mutant.operator, "what": mutant.what}
    try:
        module = _mutants.mutated_module(kernel.module, mutant)
    except Exception as err:  # the changed source does not even load
        return {**base, "kept": False, "why": f"does not load: {type(err).__name__}"}
    try:
        program = kernel.build(module)
        text = program_text(program)
    except Exception as err:  # jax itself rejects it: not a mistake that gets through
        return {**base, "kept": False, "why": f"jax rejects it when traced: {type(err).__name__}"}
    if text == original_text(kernel):
        return {**base, "kept": False, "why": "the same program as the original"}
    if original_verdicts(kernel)["verify"].outcome != "clean":
        return {**base, "kept": False, "why": "the original does not verify clean"}
    found = _verdicts.verify(program)
    traced = _verdicts.trace(program)
    return {
        **base,
        "kept": True,
        "why": "",
        "verify": {
            "caught": found.outcome == "finding",
            "at_line": found.outcome == "finding" and found.names_line(mutant.path, mutant.lines),
            "error": found.error,
        },
        "trace": {"caught": traced.outcome == "finding", "error": traced.error},
    }
