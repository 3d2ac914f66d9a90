"""``verify``: trace once, then run every device's program through the protocol model."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal, cast, get_args

import jax
import numpy as np
from jax.sharding import PartitionSpec

from safedma._arguments import check_bool, check_callable, check_int, check_number
from safedma.testing import _progress
from safedma.testing._meshes import check_mesh, check_specs
from safedma.testing._errors import SimulationError
from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.errors import DeadlockError, VerificationUnsupportedError
from safedma.testing._verify.face.report import VerifyReport, make_report
from safedma.testing._verify.face.trace import DeviceProgram, local_shard, trace
from safedma.testing._verify.lockstep import prove as _lockstep
from safedma.testing._verify.model.semantics import Blocked, LooseMiss, PruneMiss
from safedma.testing._verify.model.termination import Budget
from safedma.testing._verify.model.waits import Hints
from safedma.testing._verify.program.compiler import Compiled, compile_jaxpr, location, run
from safedma.testing._verify.program.context import Ctx
from safedma.testing._verify.walk import kernels as kernels  # registers pallas_call
from safedma.testing._verify.walk import megacore as _megacore
from safedma.testing._verify.walk import ops as ops  # registers memory and semaphore ops
from safedma.testing._verify.walk import run_state as run_state  # registers run_state
from safedma.testing._verify.walk.cores import mesh_cores  # also registers mpmd_map
from safedma.testing._verify.walk.engine import Engine

__all__ = ["LOCKSTEP_VARIABLE", "LockstepMode", "verify"]

LockstepMode = Literal["on", "off", "check"]
"""How verify uses its lockstep path: "on" (prove an SPMD program in one walk for every
device, and walk it per device only when that path gives up), "off" (always walk per
device), "check" (where the lockstep path proves a program, walk it per device too and
fail loudly if the two disagree: how the test suite cross-checks the fast path)."""

LOCKSTEP_VARIABLE = "SAFEDMA_VERIFY_LOCKSTEP"  # lockstep's default when the keyword is None


def verify(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any = None,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    invocations: int = 1,
    timeout_s: float = 600.0,
    lockstep: LockstepMode | None = None,
    progress: bool | None = None,
) -> VerifyReport:
    """Prove the DMA/semaphore protocol of every Pallas TPU kernel ``fn`` runs, on every device.

    Same calling convention as :func:`safedma.testing.simulate`; ``mesh`` may be
    a real mesh or a device-free ``abstract_mesh``; one with no axes
    (``abstract_mesh((), (), tpu="v5p")``) only names the TPU generation for a
    ``fn`` that asks for it, and ``fn`` runs whole; ``args`` are arrays or
    ``jax.ShapeDtypeStruct``. Nothing is compiled or executed: ``fn`` is traced
    once and each device's kernel program is walked with exact scalars and no
    vector data. ``invocations=k`` runs the program k times back to back. A walk
    still going after ``timeout_s`` seconds (tracing included) stops with
    :class:`~safedma.testing.SimulationTimeoutError` naming the loop, device and
    iteration it was in; a ``while`` loop that can never end is reported at once.
    ``lockstep`` is "on", "off" or "check" (:data:`LockstepMode`); None takes the
    ``SAFEDMA_VERIFY_LOCKSTEP`` environment variable, else "on". Every mode gives the
    same answer; "off" and "check" only take longer. ``progress`` shows what the walk
    is doing on a line of stderr once it has run for two seconds (erased at the end):
    True always, False never, None when stderr is a terminal.
    Raises a :class:`~safedma.testing.SimulationError` subclass naming the
    device, the semaphore or buffer, the kernel line and the fix.
    """
    where = "safedma.testing.verify()"
    check_callable(fn, "fn", where, "Pass the function that runs the kernels, then its arguments.")
    check_mesh(mesh, where)
    check_specs(in_specs, "in_specs", where)
    check_specs(out_specs, "out_specs", where)
    check_int(invocations, "invocations", where, minimum=1, fix="Run the program at least once.")
    check_number(timeout_s, "timeout_s", where, positive=True, fix="Give seconds, such as 600.")
    check_bool(progress, "progress", where, none=True)
    mode = _lockstep_mode(lockstep, os.environ.get(LOCKSTEP_VARIABLE))
    budget = Budget(timeout_s)
    with _progress.Progress("safedma verify", progress) as line:
        line.status("tracing the program")
        program = trace(fn, args, mesh, in_specs, out_specs)
        return _prove(program, mesh, invocations, mode, budget, line, _arg_names(fn, args))


def _arg_names(fn: Callable[..., Any], args: tuple[Any, ...]) -> list[str]:
    """The user's name of each flattened argument, for messages that ask for one to be
    given concretely (``argument k`` where the signature does not say)."""
    import inspect

    params: list[inspect.Parameter]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for k, arg in enumerate(args):
        leaves = len(jax.tree_util.tree_leaves(arg))
        plain = k < len(params) and params[k].kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
        name = params[k].name if plain else f"argument {k}"
        names += [name] if leaves == 1 else [f"{name} (leaf {n})" for n in range(leaves)]
    return names


def _prove(
    program: DeviceProgram,
    mesh: Any,
    invocations: int,
    mode: LockstepMode,
    budget: Budget,
    line: _progress.Progress,
    arg_names: Sequence[str] = (),
) -> VerifyReport:
    """The report of ``program``: proved by the lockstep path, walked per device, or
    both (``mode``); ``line`` says which is running."""
    body, names, sizes = program.body, program.axis_names, program.axis_sizes
    core_axis, cores = _cores_in(body)
    ambient = jax.sharding.get_abstract_mesh()
    chip = _megacore.chip_of([mesh, program.shard_map_mesh, ambient])
    if chip is not None and chip.cores > 1 and cores == 1 and _split_kernels(body):
        cores = chip.cores  # a megacore split: each TensorCore is a participant
    compiled = compile_jaxpr(body, program.consts, outer=True)
    proved: VerifyReport | None = None
    _LAST_LOCKSTEP[0] = f"not tried (no shard_map, or lockstep={mode!r})"
    if program.has_shard_map and mode != "off":
        line.status(f"proving the protocol in lockstep on {math.prod(sizes)} devices")
        fast = _lockstep.prove(
            body, names, sizes, invocations, cores, budget.deadline, mode == "check"
        )
        _LAST_LOCKSTEP[0] = fast.reason
        if fast.model is not None:
            proved = _lockstep_report(fast, body, sizes, invocations)
            if mode != "check":
                return proved
    hints = Hints()
    prune, loose_kept = True, True
    while True:  # walk again while early contributions weaken a wait (model/waits.py)
        hints.start_walk()
        engine = Engine(names, sizes, cores, core_axis)
        engine.chip = chip
        engine.budget = budget
        engine.machine.hints = hints
        engine.machine.prune = prune
        if not loose_kept:
            engine.machine.keep_loose(None)
        line.status(_walk_status(engine, hints.walks))
        try:
            try:
                _walk(engine, compiled, program, invocations, arg_names)
            except SimulationError as err:
                if proved is not None:
                    raise AssertionError(
                        "the lockstep path proved clean what the per-device walk rejects"
                    ) from err
                raise
        except PruneMiss:
            prune = False  # a late new contributor: walk again keeping every wait
            continue
        except LooseMiss:
            loose_kept = False  # an error's message needs an old wait: keep them all
            continue
        except DeadlockError as err:
            note = _parallel_grid_note(body, chip)
            if not note:
                raise
            raise type(err)(f"{err}{note}") from err
        if not hints.changed:
            break
        if hints.walks >= _MAX_WALKS:
            raise VerificationUnsupportedError(
                f"the semaphore accounting did not settle after {hints.walks} walks of the "
                "program (each walk counts contributions that may land before a wait they "
                "are not ordered after); use simulate for this kernel"
            )
    m = engine.machine
    if proved is not None and (m.dmas, m.remote_dmas, m.waits, m.signals) != (
        proved.dmas,
        proved.remote_dmas,
        proved.waits,
        proved.signals,
    ):
        raise AssertionError(f"the lockstep path counted differently: {proved}")
    peaks = [(s.buffer.name, s.peak, s.kind) for s in m.sems.values()]
    return make_report(engine.devices, body, invocations, m, peaks)


_MAX_WALKS = 12


def _walk_status(engine: Engine, walk: int) -> Callable[[], str]:
    """What the progress line says during a per-device walk (read at each redraw)."""
    unit = "devices" if engine.cores == 1 else "cores"
    again = f" (walk {walk}: with what the last walk learned)" if walk > 1 else ""
    total = engine.participants

    def status() -> str:
        return f"walking each device's program{again}: {engine.finished} of {total} {unit} done"

    return status


# why the last call's lockstep path gave up ("" when it proved the program); tests read it
_LAST_LOCKSTEP: list[str] = [""]


_LOCKSTEP_MODES: tuple[LockstepMode, ...] = get_args(LockstepMode)


def _lockstep_mode(keyword: object, variable: str | None) -> LockstepMode:
    """The mode verify runs in: the ``lockstep`` keyword, else the environment
    variable's value (``variable``, read by :func:`verify` once per call), else "on"."""
    allowed = ", ".join(repr(m) for m in _LOCKSTEP_MODES[:-1]) + f" or {_LOCKSTEP_MODES[-1]!r}"
    if keyword is None:
        value: object = (variable or "").strip().lower() or "on"
        wrong = (
            f"the environment variable {LOCKSTEP_VARIABLE} (verify's default lockstep mode) "
            f"must be {allowed}, or unset"
        )
    else:
        value = keyword
        wrong = (
            f"verify's lockstep keyword must be {allowed}, or None for the environment "
            f"variable {LOCKSTEP_VARIABLE}'s mode"
        )
    for mode in _LOCKSTEP_MODES:
        if value == mode:
            return mode
    raise ValueError(f"{wrong}, not {value!r}")


def _lockstep_report(
    fast: _lockstep.Outcome, body: Any, sizes: tuple[int, ...], invocations: int
) -> VerifyReport:
    assert fast.model is not None
    peaks = [(s.name, s.peak, s.kind) for s in fast.sems if s.touched]
    return make_report(math.prod(sizes), body, invocations, fast.model, peaks)


def _walk(
    engine: Engine,
    compiled: Compiled,
    program: DeviceProgram,
    invocations: int,
    arg_names: Sequence[str] = (),
) -> None:
    """One walk of every participant's program through the model."""
    programs: list[Generator[Blocked, None, None]] = []
    for p in range(engine.participants):
        if p % engine.cores:
            programs.append(engine.helper(p))
            continue
        coords = engine.coords(p)
        ctx = Ctx(p, engine, coords)
        inputs: list[object] = []
        for k, var in enumerate(cast("list[Any]", program.body.invars)):
            raw: object = program.op_values[k] if k < len(program.op_values) else None
            value: np.ndarray[Any, Any] | None = None if raw is None else np.asarray(raw)
            if value is not None and program.op_specs is not None:
                value = local_shard(value, program.op_specs[k], coords, engine.axis_sizes)
            arg = arg_names[k] if k < len(arg_names) else f"argument {k}"
            inputs.append(engine.outer_value(p, var.aval, value, f"argument {k}", arg))
        programs.append(engine.main(p, _repeat(compiled, inputs, ctx, invocations)))
    engine.schedule(programs)


def _repeat(
    compiled: Compiled, inputs: list[Any], ctx: Ctx, times: int
) -> Generator[Blocked, None, None]:
    for _ in range(times):
        yield from run(compiled, inputs, ctx)


def _cores_in(jaxpr: Any) -> tuple[str, int]:
    """The core axis and count of the program's pl.kernel (mpmd_map) meshes, if any."""
    found: tuple[str, int] = ("core", 1)
    for eqn in _jax.all_eqns(jaxpr):
        if eqn.primitive.name == "mpmd_map":
            for mesh in eqn.params["meshes"]:
                found = max(found, mesh_cores(mesh), key=lambda f: f[1])
    return found


def _split_kernels(jaxpr: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """Every pallas_call with a leading "parallel" grid dimension, and those dimensions
    (what a megacore chip splits between its cores)."""
    found: list[tuple[Any, tuple[int, ...]]] = []
    for eqn in _jax.all_eqns(jaxpr):
        if eqn.primitive.name != "pallas_call":
            continue
        params = _jax.kernel_params(eqn)
        name = str(params["name"] or "kernel")
        dims = _megacore.split_dims(tuple(params["semantics"]), name, location(eqn))
        if dims:
            found.append((eqn, dims))
    return found


def _parallel_grid_note(jaxpr: Any, chip: _megacore.Chip | None) -> str:
    """What a deadlock means for kernels whose grid has a "parallel" dimension.

    With no TPU named, verify runs every grid step in order on one core, as a
    single-TensorCore chip does; on a megacore chip Mosaic splits that dimension
    between two cores, each with its own scratch and scalar-prefetch copies (a
    kernel that starts each core's first copy at ``program_id(0) == core`` is
    written for that split): the note says so. With a TPU named, the note says
    what that chip does: the split it ran (megacore), or one core. Empty when no
    kernel has a parallel dimension."""
    for eqn in _jax.all_eqns(jaxpr):
        dims = _jax.parallel_grid_dims(eqn) if eqn.primitive.name == "pallas_call" else ()
        if dims:
            break
    else:
        return ""
    params = _jax.kernel_params(eqn)
    name = str(params["name"] or "kernel")
    if chip is not None and chip.cores > 1:
        notes: list[str] = []
        for split_eqn, split in _split_kernels(jaxpr):
            grid = tuple(int(g) for g in _jax.kernel_params(split_eqn)["grid"])
            parts = (
                _megacore.describe_parts(_megacore.core_parts(grid, len(split), chip.cores))
                if all(g >= 0 for g in grid)
                else "the parallel points in contiguous parts"
            )
            split_name = str(_jax.kernel_params(split_eqn)["name"] or "kernel")
            notes.append(_megacore.split_note(chip, split_name, location(split_eqn), split, parts))
        return "".join(dict.fromkeys(notes))
    if chip is not None:
        return _megacore.single_core_note(chip, name, location(eqn), dims)
    return (
        f"\nNote: {name} at {location(eqn)} (grid dimension(s) {dims}) marks a grid "
        "dimension 'parallel'. verify runs every grid "
        "step in order on one core, as a single-TensorCore chip (v5e, v6e) does, where "
        "this deadlock is real. On a megacore chip (v4, v5p) Mosaic splits a parallel "
        "dimension between the two TensorCores, each with its own scratch and "
        "scalar-prefetch values; name the TPU (abstract_mesh(..., tpu='v5p')) and "
        "verify models that split."
    )
