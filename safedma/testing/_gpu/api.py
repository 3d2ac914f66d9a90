"""``verify_gpu``: find the Pallas GPU kernels a function runs and check each program."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, cast

import jax

from safedma._arguments import check_callable
from safedma.testing._gpu import jax_seam
from safedma.testing._gpu.errors import GpuVerifyReport, VerificationUnsupportedError
from safedma.testing._gpu.protocol import Protocol
from safedma.testing._gpu.walker import RefVal, Walker
from safedma.testing._verify import jax_internals as ji

__all__ = ["verify_gpu"]

_MAX_PROGRAMS = 4096

# Typed once: jax leaves ``make_jaxpr`` partly unannotated (its result is a ClosedJaxpr).
_make_jaxpr = cast("Callable[[Callable[..., Any]], Callable[..., Any]]", getattr(jax, "make_jaxpr"))


def verify_gpu(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GpuVerifyReport:
    """Prove the TMA copy and barrier protocol of every Pallas GPU kernel ``fn`` runs.

    Why: a Pallas GPU kernel that waits on a barrier nothing completes hangs the
    GPU, and one that reads shared memory before its copy landed, overwrites a
    buffer a store still reads or skips ``commit_smem`` computes wrong numbers now
    and then; jax's GPU interpreter needs a long run per schedule and sees the races
    only with ``detect_races``. This needs no GPU: ``fn`` is traced once (``args``
    are arrays or ``jax.ShapeDtypeStruct``), and each kernel's program is walked
    for every point of its grid with exact scalars (loop counters, program ids),
    checking every order in which the copies may land.

    Kernels written with ``plgpu.kernel`` or ``pl.pallas_call(...,
    compiler_params=plgpu.CompilerParams())`` are checked; a kernel with several
    warpgroups (``num_threads`` > 1), a cluster, collective copies or operations the
    checker does not model is refused with
    :class:`~safedma.testing.VerificationUnsupportedError` naming the operation and
    line. A mistake raises :class:`~safedma.testing.DeadlockError`,
    :class:`~safedma.testing.RaceDetectedError` or
    :class:`~safedma.testing.CopyInFlightAtExitError`, naming the barrier or buffer,
    the kernel line and the fix. Returns a :class:`~safedma.testing.GpuVerifyReport`.
    """
    check_callable(
        fn,
        "fn",
        "safedma.testing.verify_gpu",
        "Pass the function that runs the kernels, then its arguments.",
    )
    if not jax_seam.plgpu_available():
        raise VerificationUnsupportedError(
            f"jax {jax.__version__} has no Pallas GPU (mosaic_gpu) API the checker can read."
        )
    closed = _make_jaxpr(fn)(*args, **kwargs)
    kernels = list(_gpu_kernels(closed.jaxpr))
    if not kernels:
        raise VerificationUnsupportedError(
            "the program runs no Pallas GPU kernel (plgpu.kernel, or pallas_call with "
            "plgpu.CompilerParams); use safedma.testing.verify for TPU kernels."
        )
    totals = [0, 0, 0, 0]
    for eqn, body, mesh_axes, grid in kernels:
        name = str(
            eqn.params.get("name") or getattr(eqn.params.get("metadata"), "name", "") or "kernel"
        )
        points = math.prod(grid)
        if points > _MAX_PROGRAMS:
            raise VerificationUnsupportedError(
                f"kernel `{name}` has a grid of {points} programs; check it with a smaller grid "
                f"(at most {_MAX_PROGRAMS})."
            )
        for ids in itertools.product(*(range(g) for g in grid)):
            where = f"kernel `{name}`"
            if points > 1:
                # points > 1: the grid has an axis, so an id has at least one index
                where += f", program {ids[0] if len(ids) == 1 else ids} of grid {tuple(grid)}"
            protocol = Protocol(where)
            axes = {n: (i, g) for n, i, g in zip(mesh_axes, ids, grid)}
            axes.update(_fixed_axes(eqn))
            walker = Walker(protocol, axes, ids, grid, _namer(body))
            args_ = [
                RefVal(walker.new_buffer(v.aval, _name(body, i)))
                for i, v in enumerate(ji.jaxpr_of(body)[0].invars)
            ]
            walker.run(body, args_, [])
            protocol.kernel_end()
            totals[0] += 1
            totals[1] += protocol.copies_in
            totals[2] += protocol.copies_out
            totals[3] += protocol.waits
    return GpuVerifyReport(len(kernels), totals[0], totals[1], totals[2], totals[3])


def _fixed_axes(eqn: Any) -> dict[str, tuple[int, int]]:
    """Cluster and thread axes of size 1: their index is always 0."""
    out: dict[str, tuple[int, int]] = {}
    for mesh in eqn.params.get("meshes", ()) or ():
        for n in tuple(getattr(mesh, "cluster_names", ()) or ()):
            out[n] = (0, 1)
        thread = getattr(mesh, "thread_name", None)
        if thread is not None:
            out[thread] = (0, 1)
    return out


def _gpu_kernels(jaxpr: Any) -> Any:
    """(equation, kernel jaxpr, grid axis names, grid) of every GPU kernel call."""
    for eqn in ji.all_eqns(jaxpr):
        name = eqn.primitive.name
        if name == "pallas_call" and jax_seam.gpu_compiler_params(eqn.params) is not None:
            gm = eqn.params["grid_mapping"]
            grid = tuple(int(g) for g in gm.grid)
            names = tuple(getattr(gm, "grid_names", None) or ()) or tuple(
                f"#{i}" for i in range(len(grid))
            )
            yield eqn, eqn.params["jaxpr"], names, grid
        elif name == "mpmd_map":
            meshes = tuple(eqn.params.get("meshes", ()))
            gpu = [jax_seam.gpu_mesh_of(m) for m in meshes]
            if not gpu or any(m is None for m in gpu):
                continue
            if len(meshes) != 1:
                raise VerificationUnsupportedError(
                    "an mpmd_map with several meshes is not modelled by the GPU checker."
                )
            mesh = gpu[0]
            threads = getattr(mesh, "num_threads", None) or 1
            if int(threads) > 1:
                raise VerificationUnsupportedError(
                    f"kernel `{eqn.params.get('name')}` runs num_threads={threads} warpgroups "
                    "(warp specialization): the checker models one thread of each program "
                    "and does not yet check how warpgroups synchronize; "
                    "safedma.testing.simulate_gpu runs it in jax's GPU interpreter instead."
                )
            cluster = tuple(int(c) for c in (getattr(mesh, "cluster", ()) or ()))
            if math.prod(cluster) > 1:
                raise VerificationUnsupportedError(
                    f"kernel `{eqn.params.get('name')}` runs in clusters of {cluster} blocks: "
                    "clusters, multicast and collective copies are not modelled."
                )
            grid = tuple(int(g) for g in (getattr(mesh, "grid", ()) or ()))
            names = tuple(getattr(mesh, "grid_names", ()) or ())
            yield eqn, eqn.params["jaxprs"][0], names, grid


def _name(jaxpr: Any, i: int) -> str:
    names = ji.kernel_param_names(ji.jaxpr_of(jaxpr)[0])
    if i < len(names):
        return names[i]
    return f"operand {i}"


def _namer(kernel: Any) -> Callable[[Any, int], str]:
    def name(jaxpr: Any, i: int) -> str:
        info = getattr(jaxpr, "debug_info", None)
        raw = getattr(info, "arg_names", None) or ()
        if i < len(raw) and raw[i] and not str(raw[i]).startswith("args["):
            return str(raw[i])
        return f"scratch {i}"

    del kernel
    return name
