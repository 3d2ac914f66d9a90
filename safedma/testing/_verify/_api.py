"""``verify``: trace once, then run every device's program through the protocol model."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from safedma.testing._verify import _jax, _lockstep, _megacore
from safedma.testing._verify import _kernels as _kernels  # registers pallas_call
from safedma.testing._verify import _ops as _ops  # registers memory and semaphore ops
from safedma.testing._verify._cores import mesh_cores  # also registers mpmd_map
from safedma.testing._verify._engine import Engine
from safedma.testing._verify import _state as _state  # registers run_state
from safedma.testing._verify._outer import shard_map_operands
from safedma.testing._verify._program import Compiled, Ctx, compile_jaxpr, location, run
from safedma.testing._verify._semantics import Blocked, LooseMiss, PruneMiss
from safedma.testing._errors import SimulationError
from safedma.testing._verify._termination import Budget
from safedma.testing._verify._waits import Hints
from safedma.testing._verify._report import (
    DeadlockError,
    VerificationUnsupportedError,
    VerifyReport,
)


__all__ = ["verify"]

_partition_spec: Callable[..., PartitionSpec] = PartitionSpec


def _specs(specs: Any, default: PartitionSpec, arguments: bool) -> Any:
    if specs is None:
        return default
    if isinstance(specs, PartitionSpec):
        return specs
    seq = cast("Sequence[PartitionSpec]", specs)
    return list(seq) if isinstance(specs, list) and not arguments else tuple(seq)


def _mesh_context(mesh: Any) -> contextlib.AbstractContextManager[object]:
    if mesh is None:
        return contextlib.nullcontext()
    if isinstance(mesh, Mesh):
        return contextlib.nullcontext()
    return cast("contextlib.AbstractContextManager[object]", jax.sharding.use_abstract_mesh(mesh))


def _find_device_program(jaxpr: Any) -> tuple[Any, list[Any], Any, list[int]] | None:
    """(per-device jaxpr, its consts, mesh, top-level arg index per operand) of the shard_map."""
    top = {v: i for i, v in enumerate(jaxpr.invars)}

    def walk(j: Any, mapping: dict[Any, int]) -> tuple[Any, list[Any], Any, list[int]] | None:
        for eqn in j.eqns:
            name = eqn.primitive.name
            if name == "shard_map":
                body, consts = _jax.jaxpr_of(eqn.params["jaxpr"])
                args = [mapping.get(v, -1) if not _jax.is_literal(v) else -1 for v in eqn.invars]
                return body, consts, eqn.params["mesh"], args
            for sub in _jax.sub_jaxprs(eqn.params):
                inner, _ = _jax.jaxpr_of(sub)
                inner_map = {
                    iv: mapping[ov]
                    for iv, ov in zip(inner.invars, eqn.invars)
                    if not _jax.is_literal(ov) and ov in mapping
                }
                found = walk(inner, inner_map)
                if found is not None:
                    return found
        return None

    return walk(jaxpr, top)


_KERNEL_PRIMITIVES = ("pallas_call", "mpmd_map")


def _check_one_device_program(top: Any, body: Any) -> None:
    """Refuse a program whose kernels are not all in the one shard_map that is walked.

    Why: verify walks the body of the first shard_map it finds per device; kernels in a
    second shard_map, or outside any, would go unchecked while the report says clean."""
    maps: list[Any] = []
    kernels = 0
    for e in _jax.all_eqns(top):
        if e.primitive.name == "shard_map":
            maps.append(e)
        elif e.primitive.name in _KERNEL_PRIMITIVES:
            kernels += 1
    inside = sum(1 for e in _jax.all_eqns(body) if e.primitive.name in _KERNEL_PRIMITIVES)
    if len(maps) < 2 and kernels <= inside:
        return
    where = ", ".join(location(e) for e in maps[:3])
    raise VerificationUnsupportedError(
        f"verify walks the kernels of one shard_map per program, and this program has "
        f"{len(maps)} shard_map(s) (at {where}) and {kernels} kernel call(s), "
        f"{inside} of them in the first shard_map: the others would go unchecked. Verify "
        "each shard_map's function on its own (or pass the per-device function with "
        "mesh=, in_specs= and out_specs=)."
    )


_TREE: Any = jax.tree  # typed loosely: pytree definitions are opaque here


def _of_leaves(fn: Callable[..., Any], tree: Any) -> Callable[..., Any]:
    """``fn`` called with the leaves of its pytree arguments."""

    def flat(*leaves: Any) -> Any:
        return fn(*_TREE.unflatten(tree, leaves))

    return flat


_HOST_VALUES_LIMIT = 1 << 26  # bytes: page tables and flags are far smaller


def _opaque(a: Any) -> bool:
    """Whether argument ``a`` is an array whose values verify does not read."""
    dtype = getattr(a, "dtype", None)
    shape = getattr(a, "shape", None)
    if dtype is None or shape is None:
        return False
    if _jax.is_extended(dtype):
        return True
    size = math.prod(int(d) for d in cast("tuple[int, ...]", shape))
    return size * int(np.dtype(dtype).itemsize) > _HOST_VALUES_LIMIT


def verify(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any = None,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    invocations: int = 1,
    timeout_s: float = 600.0,
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
    Raises a :class:`~safedma.testing.SimulationError` subclass naming the
    device, the semaphore or buffer, the kernel line and the fix.
    """
    if invocations < 1:
        raise ValueError(f"invocations must be at least 1, got {invocations}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    budget = Budget(timeout_s)
    if mesh is None and (in_specs is not None or out_specs is not None):
        raise ValueError("in_specs/out_specs need a mesh")
    leaves, tree = _TREE.flatten(args)
    if len(leaves) != len(args) or any(a is None for a in args):
        # pytree arguments (a tuple of arrays, as jax.jit takes them): verify the
        # function of their leaves
        if mesh is not None:
            raise ValueError(
                "verify with a mesh takes one array (or ShapeDtypeStruct) per argument, "
                "matching in_specs; pass the leaves of pytree arguments separately"
            )
        fn = _of_leaves(fn, tree)
        args = tuple(leaves)
    structs: list[Any] = []
    values: list[np.ndarray[Any, Any] | None] = []
    for a in args:
        # A NamedSharding the argument already has (an array split over a real mesh
        # that fn's own shard_map expects) is kept for tracing.
        sharding = getattr(a, "sharding", None)
        keep = sharding if isinstance(sharding, NamedSharding) else None
        if isinstance(a, jax.ShapeDtypeStruct):
            structs.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=keep))
            values.append(None)
        elif _opaque(a):
            # PRNG keys (extended dtypes) have no numpy values; arrays too large to
            # hold control data are not copied to the host: both stay unknown, and
            # a value the protocol needs from them names the operand.
            structs.append(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=keep))
            values.append(None)
        else:
            arr = np.asarray(a)
            structs.append(jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=keep))
            values.append(arr)
    program: Callable[..., Any] = fn
    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    if mesh is not None:
        names = tuple(str(n) for n in mesh.axis_names)
        sizes = tuple(
            int(s) for s in (mesh.axis_sizes if hasattr(mesh, "axis_sizes") else mesh.devices.shape)
        )
    # A mesh with no axes (``abstract_mesh((), (), tpu="v5p")``) only names the TPU
    # generation the wrappers ask for: fn runs as it is, inside that mesh.
    split = mesh is not None and bool(names)
    if mesh is not None and not split and (in_specs is not None or out_specs is not None):
        raise ValueError(
            "in_specs/out_specs need a mesh with axes; a mesh with none only names the "
            "TPU generation, and fn gets its arguments whole"
        )
    if mesh is not None and split:
        default = _partition_spec(names[0] if len(names) == 1 else names)
        ins = _specs(in_specs, default, True)
        outs = _specs(out_specs, default, False)
        program = jax.shard_map(fn, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)
        if isinstance(mesh, Mesh):
            # jax 0.12 checks the specs against the arguments' shardings.
            per_arg = _local_specs(in_specs, names, len(structs))
            structs = [
                jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, spec))
                for s, spec in zip(structs, per_arg)
            ]

    def fresh(*xs: Any) -> Any:
        return program(*xs)

    with _mesh_context(mesh):
        traced = jax.jit(fresh).trace(*structs)  # pyright: ignore[reportUnknownMemberType]
    closed = traced.jaxpr
    top = closed.jaxpr
    found = _find_device_program(top)
    if split and found is None:
        raise VerificationUnsupportedError("no shard_map found in the traced program")
    if found is None:
        body, consts = top, list(_jax.consts_of(closed))
    else:
        body, consts, inner_mesh, _ = found
        _check_one_device_program(top, body)
        if not split:
            # fn runs its own shard_map: verify on that mesh, arguments unsplit.
            names = tuple(str(n) for n in inner_mesh.axis_names)
            sizes = tuple(int(inner_mesh.shape[n]) for n in names)
    core_axis, cores = _cores_in(body)
    ambient = jax.sharding.get_abstract_mesh()
    chip = _megacore.chip_of([mesh, None if found is None else found[2], ambient])
    if chip is not None and chip.cores > 1 and cores == 1 and _split_kernels(body):
        cores = chip.cores  # a megacore split: each TensorCore is a participant
    compiled = compile_jaxpr(body, consts, outer=True)
    # the value and in_spec of each operand of the device program
    op_values: list[Any] = list(values)
    op_specs: list[Any] | None = None
    if found is not None:
        outer = shard_map_operands(top, list(_jax.consts_of(closed)), values)
        assert outer is not None  # found is a shard_map
        op_values, op_specs = outer
    proved: VerifyReport | None = None
    mode = _lockstep_mode()
    _LAST_LOCKSTEP[0] = "not tried (no shard_map, or SAFEDMA_VERIFY_LOCKSTEP=off)"
    if found is not None and mode != "off":
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
    while True:  # walk again while early contributions weaken a wait (_waits.py)
        hints.start_walk()
        engine = Engine(names, sizes, cores, core_axis)
        engine.chip = chip
        engine.budget = budget
        engine.machine.hints = hints
        engine.machine.prune = prune
        if not loose_kept:
            engine.machine.keep_loose(None)
        try:
            try:
                _walk(engine, compiled, body, op_values, op_specs, invocations)
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
    peaks = [(s.buffer.name, s.peak) for s in m.sems.values()]
    return _report(engine.devices, body, invocations, m, peaks)


def _report(
    devices: int, body: Any, invocations: int, counts: Any, peaks: list[tuple[str, int]]
) -> VerifyReport:
    """The report of either path: ``counts`` has dmas, remote_dmas, waits and signals;
    ``peaks`` the most in flight of each semaphore of each call (the most per name)."""
    most: dict[str, int] = {}
    for name, peak in peaks:
        most[name] = max(most.get(name, 0), peak)
    return VerifyReport(
        devices=devices,
        kernels=_kernel_labels(_kernel_names(body)),
        invocations=invocations,
        dmas=int(counts.dmas),
        remote_dmas=int(counts.remote_dmas),
        waits=int(counts.waits),
        signals=int(counts.signals),
        max_bytes_in_flight=most,
    )


_MAX_WALKS = 12

# why the last call's lockstep path gave up ("" when it proved the program); tests read it
_LAST_LOCKSTEP: list[str] = [""]


def _lockstep_mode() -> str:
    """``SAFEDMA_VERIFY_LOCKSTEP``: "on" (default), "off" (always walk per device), or
    "check" (when the lockstep path proves a program, walk it per device too and fail
    loudly if the two disagree: how the test suite cross-checks the fast path)."""
    mode = os.environ.get("SAFEDMA_VERIFY_LOCKSTEP", "on").strip().lower() or "on"
    if mode not in ("on", "off", "check"):
        raise ValueError(f"SAFEDMA_VERIFY_LOCKSTEP must be on, off or check, not {mode!r}")
    return mode


def _lockstep_report(
    fast: _lockstep.Outcome, body: Any, sizes: tuple[int, ...], invocations: int
) -> VerifyReport:
    assert fast.model is not None
    peaks = [(s.name, s.peak) for s in fast.sems if s.touched]
    return _report(math.prod(sizes), body, invocations, fast.model, peaks)


def _walk(
    engine: Engine,
    compiled: Compiled,
    body: Any,
    op_values: list[Any],
    op_specs: list[Any] | None,
    invocations: int,
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
        for k, var in enumerate(cast("list[Any]", body.invars)):
            raw: object = op_values[k] if k < len(op_values) else None
            value: np.ndarray[Any, Any] | None = None if raw is None else np.asarray(raw)
            if value is not None and op_specs is not None:
                value = _local_shard(value, op_specs[k], coords, engine.axis_sizes)
            inputs.append(engine.outer_value(p, var.aval, value, f"argument {k}"))
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


def _kernel_names(jaxpr: Any) -> list[tuple[str, str]]:
    """(name, user line) of every kernel call in the program."""
    out: list[tuple[str, str]] = []
    for eqn in _jax.all_eqns(jaxpr):
        if eqn.primitive.name == "pallas_call":
            out.append((str(_jax.kernel_params(eqn)["name"] or "kernel"), location(eqn)))
        if eqn.primitive.name == "mpmd_map":
            out.append((str(eqn.params.get("name") or "pl.kernel"), location(eqn)))
    return out


def _kernel_labels(found: list[tuple[str, str]]) -> tuple[str, ...]:
    """Distinct kernels by name; a name shared by kernels at different lines (every
    ``emit_pipeline`` body is called ``wrapped``) gets each line, so the report counts
    every kernel the program calls."""
    lines: dict[str, set[str]] = {}
    for name, where in found:
        lines.setdefault(name, set()).add(where)
    return tuple(
        sorted(
            label
            for name, wheres in lines.items()
            for label in ([name] if len(wheres) == 1 else [f"{name} ({w})" for w in wheres])
        )
    )


def _local_specs(in_specs: Any, names: tuple[str, ...], n: int) -> list[Any]:
    default = _partition_spec(names[0] if len(names) == 1 else names)
    if in_specs is None:
        return [default] * n
    if isinstance(in_specs, PartitionSpec):
        return [in_specs] * n
    return list(in_specs)


def _local_shard(
    value: np.ndarray[Any, Any], spec: Any, coords: dict[str, int], sizes: dict[str, int]
) -> np.ndarray[Any, Any]:
    index: list[slice] = []
    for d, entry in enumerate(tuple(spec)):
        if entry is None or d >= value.ndim:
            index.append(slice(None))
            continue
        axes: tuple[str, ...] = (
            tuple(str(a) for a in cast("tuple[object, ...]", entry))
            if isinstance(entry, tuple)
            else (str(entry),)
        )
        parts, pos = 1, 0
        for a in axes:
            pos = pos * sizes[a] + coords[a]
            parts *= sizes[a]
        size = value.shape[d] // parts
        index.append(slice(pos * size, (pos + 1) * size))
    return value[tuple(index)]
