"""What the lane runs: the kernels of this run's slice, their verdicts (once per process),
and the record of each mutant."""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import jax

from tests.corpus import _run
from tests.corpus._case import Program
from tests.field import _mutants, _packages, _verdicts
from tests.field._kernel import FieldKernel

SLICE_VARIABLE = "SAFEDMA_FIELD_SLICE"
TOOLS = ("verify", "trace")
REMOVALS = _mutants.REMOVALS


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
    """verify's and the trace checks' verdicts; simulate's too where the program runs
    on one device (jax's interpreter then runs it on the CPU, as a second opinion)."""
    program = kernel.program()
    tools = TOOLS + (("simulate",) if not kernel.slow and runs_on_one_device(program) else ())
    return {tool: _verdicts.CHECKERS[tool](program) for tool in tools}


def runs_on_one_device(program: Program) -> bool:
    """No mesh axis in the program, and no ``shard_map`` over several devices in its
    traced program (a wrapper that builds its own over an abstract mesh needs devices
    simulate would have to make, so only verify runs it)."""
    if program.per_device:
        return False
    fn, args, mesh = program.whole()
    with _run._mesh_context(mesh):
        jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return _devices_of(jaxpr) <= 1


def _devices_of(jaxpr: Any) -> int:
    """The most devices any ``shard_map`` in ``jaxpr`` (and the bodies in it) spans."""
    most = 1
    for eqn in jaxpr.eqns:
        mesh = eqn.params.get("mesh")
        shape = getattr(mesh, "shape", None)
        if eqn.primitive.name == "shard_map" and isinstance(shape, dict):
            most = max(most, math.prod(shape.values()))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    most = max(most, _devices_of(inner))
    return most


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
    original_text(kernel), original_verdicts(kernel)  # read from the original file
    with _mutants.source_shown(kernel.module, mutant):
        return _judged(kernel, mutant, base)


def _judged(kernel: FieldKernel, mutant: _mutants.Mutant, base: dict[str, Any]) -> dict[str, Any]:
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
    original = original_verdicts(kernel)["verify"]
    if mutant.operator in REMOVALS and found.outcome == "clean" and found.detail == original.detail:
        # the same copies, waits and signals as the original: the removed statement
        # never runs on the driven inputs, so the program they run is the original's
        return {**base, "kept": False, "why": "the removed statement never runs on these inputs"}
    traced = _verdicts.trace(program)
    return {
        **base,
        "kept": True,
        "why": "",
        "verify": {
            "caught": found.outcome == "finding",
            "at_line": found.outcome == "finding"
            and found.names_line(mutant.path, mutant.lines, mutant.follows),
            "error": found.error,
        },
        "trace": {
            "caught": traced.outcome == "finding",
            "at_line": traced.outcome == "finding"
            and traced.names_line(mutant.path, mutant.lines, mutant.follows),
            "error": traced.error,
        },
    }
