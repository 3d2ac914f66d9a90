"""Benchmark 5, protocol verification: what ``safedma.testing.verify`` costs, and how it scales.

Three measurements, all on CPU with no TPU:

1. **Scale.** The ring all-gather, reduce-scatter and all-reduce of
   ``safedma.kernels`` verified on device-free meshes (``abstract_mesh``):
   rings of 8, 64, 256 and 1024 devices, and 256 devices as 16x16, 4x64 and
   64x4 meshes with the ring along the second axis, so the number of ring
   steps (ring size - 1) varies at a fixed device count. Each case runs in
   its own process under a time budget, and is timed including tracing
   (best and median wall time of ``reps`` calls, and the best process CPU
   time: on a shared machine wall time includes waiting for a core), and the
   process's peak resident memory (devices^2 clock entries and access records; verify
   bounds its rule-6 wait records, without which it would grow as devices^3). The
   growth exponents are the log-log slopes of time against devices (1-D rings, where
   steps grow with devices) and against steps at 256 devices. Goal: under 2 s at
   256 devices.
2. **verify against simulate** on 8 simulated CPU devices, both including
   tracing, interleaved A/B (repetition ``i`` runs verify first for even
   ``i``), freshly built functions every time. Goal: verify at least 5 times
   faster.
3. **Memory.** Peak Python allocation (``tracemalloc``) and time of verifying
   the 8-device all-gather with 4 KiB and with 1 GiB blocks, given as
   ``jax.ShapeDtypeStruct`` (nothing is allocated for the data). Goal: the
   same for both.

``python -m benchmarks --only verify [--reps N] [--verify-budget S]``; the scale
table alone for some kernels and meshes (e.g. to compare two checkouts under the same
load): ``python -m benchmarks.verify --scale all_gather,all_reduce 256,16x16 [REPS] [BUDGET_S]``.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from benchmarks._common import ROOT, Spread, heading, ms, ratio_text, table

KERNELS = ("all_gather", "reduce_scatter", "all_reduce")
# (label, mesh shape, axis names); the ring runs along "x", the last axis.
MESHES: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    ("8", (8,), ("x",)),
    ("64", (64,), ("x",)),
    ("256", (256,), ("x",)),
    ("1024", (1024,), ("x",)),
    ("16x16", (16, 16), ("y", "x")),
    ("64x4", (64, 4), ("y", "x")),
    ("4x64", (4, 64), ("y", "x")),
)
QUICK_MESHES = ("8", "64", "16x16")
GOAL_256_S = 2.0
# the per-device walk (SAFEDMA_VERIFY_LOCKSTEP=off) is run as the baseline up to this
# many devices (at 1024 it takes minutes per kernel)
BASELINE_MAX_DEVICES = 256
GOAL_SPEEDUP = 5.0
SMALL_BLOCK = (8, 128)  # 4 KiB of float32
BIG_BLOCK = (2**21, 128)  # 1 GiB of float32


def _verify() -> Callable[..., Any]:
    try:
        from safedma.testing import verify
    except ImportError:  # until the face exports it
        from safedma.testing._verify.face.api import verify
    fn: Callable[..., Any] = verify
    return fn


def _kernel(kind: str) -> Callable[..., Any]:
    """A fresh per-device function (a new object: no jax cache is hit)."""
    import safedma.kernels as sk

    make = {
        "all_gather": sk.all_gather,
        "reduce_scatter": sk.reduce_scatter,
        "all_reduce": sk.all_reduce,
    }[kind]
    return functools.partial(make, axis="x")


def _block(kind: str, ring: int, block: tuple[int, int] = SMALL_BLOCK) -> tuple[int, int]:
    if kind == "all_gather":
        return block
    return (8 * ring, 128)  # reduce-scatter, all-reduce: ring chunks of 8 rows


def _args(
    kind: str, shape: tuple[int, ...], names: tuple[str, ...], block: tuple[int, int] = SMALL_BLOCK
) -> tuple[Any, Any, Any]:
    """(the global argument, in_specs, out_specs) for ``kind`` on a mesh of ``shape``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    rows, cols = _block(kind, shape[-1], block)
    x = jax.ShapeDtypeStruct((rows * math.prod(shape), cols), jnp.float32)
    spec = P(names[0] if len(names) == 1 else names)
    return x, spec, spec


def _verdict(error: BaseException | None) -> str:
    if error is None:
        return "clean"
    return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


_LAST_CPU: list[float] = [0.0]  # CPU seconds of the last _timed_verify (this process)


def _timed_verify(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any, str]:
    """(seconds to the verdict, the report or None, the verdict). A verdict that is an
    error is timed too: verify stops at the first error, so the time is a lower bound.
    The process CPU time of the same call is left in ``_LAST_CPU`` (on a shared machine
    wall time includes waiting for a core; CPU time does not)."""
    from safedma.testing import SimulationError

    verify = _verify()
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        report = verify(fn, *args, **kwargs)
    except SimulationError as err:
        _LAST_CPU[0] = time.process_time() - c0
        return time.perf_counter() - t0, None, _verdict(err)
    _LAST_CPU[0] = time.process_time() - c0
    return time.perf_counter() - t0, report, "clean"


def verify_once(
    kind: str, shape: tuple[int, ...], names: tuple[str, ...], block: tuple[int, int] = SMALL_BLOCK
) -> tuple[float, Any, str]:
    """Seconds to verify ``kind`` on a device-free mesh, tracing included; report; verdict."""
    from safedma.testing import abstract_mesh

    x, ins, outs = _args(kind, shape, names, block)
    return _timed_verify(
        _kernel(kind),
        x,
        mesh=abstract_mesh(shape, names),
        in_specs=ins,
        out_specs=outs,
        # the case's process budget bounds the run (a 1024-device ring takes minutes)
        timeout_s=math.inf,
    )


# ------------------------------------------------------------------ 1. scale (child processes)


def _child(kind: str, label: str, reps: int) -> None:
    """Run in a subprocess: time ``reps`` verifications, print one JSON line."""
    shape, names = next((s, n) for lab, s, n in MESHES if lab == label)
    times: list[float] = []
    cpu: list[float] = []
    report: Any = None
    error = None
    verdict = "-"
    for _ in range(reps):
        try:
            seconds, report, verdict = verify_once(kind, shape, names)
        except Exception as err:  # not a verdict: the engine failed; the table shows it
            error = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            break
        times.append(seconds)
        cpu.append(_LAST_CPU[0])
    import resource  # POSIX only, like the rest of the scale table's child processes

    from safedma.testing._verify.face import api as _api

    gave_up = _api._LAST_LOCKSTEP[0]

    out = {
        "times": times,
        "cpu": cpu,
        # peak resident memory of the process (jax itself is about 175 MB of it), in MiB
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "error": error,
        "verdict": verdict,
        "dmas": getattr(report, "dmas", None),
        # which path answered: verify's lockstep path, or the per-device walk (and why)
        "path": "per-device walk"
        if os.environ.get("SAFEDMA_VERIFY_LOCKSTEP") == "off"
        else ("lockstep" if not gave_up else f"per-device walk ({gave_up})"),
        "waits": getattr(report, "waits", None),
    }
    print(json.dumps(out), flush=True)


def _scale_case(
    kind: str, label: str, reps: int, budget_s: float, mode: str = "on"
) -> dict[str, Any]:
    """One case in a child process; ``mode`` is SAFEDMA_VERIFY_LOCKSTEP ("off": the
    per-device walk alone, the baseline of the lockstep path)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", SAFEDMA_VERIFY_LOCKSTEP=mode)
    command = [sys.executable, "-m", "benchmarks.verify", "--child", kind, label, str(reps)]
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget_s
        )
    except subprocess.TimeoutExpired:
        return {"times": [], "error": f"over the {budget_s:g} s budget"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"times": [], "error": f"process failed: {tail[:200]}"}
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(time) against log(x): time ~ x ** slope."""
    pts = [(math.log(x), math.log(t)) for x, t in points if x > 0 and t > 0]
    if len(pts) < 2:
        return None
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def scale(
    reps: int,
    budget_s: float,
    quick: bool,
    kinds: tuple[str, ...] = KERNELS,
    only: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    heading("5a. verify at scale (device-free meshes; tracing included; one process per case)")
    labels = [
        lab
        for lab, _, _ in MESHES
        if (not quick or lab in QUICK_MESHES) and (only is None or lab in only)
    ]
    cases: dict[str, dict[str, Any]] = {}
    rows = []
    for kind in kinds:
        for label in labels:
            record = _scale_case(kind, label, reps, budget_s)
            shape = next(s for lab, s, _ in MESHES if lab == label)
            record.update(devices=math.prod(shape), steps=shape[-1] - 1)
            if record["devices"] <= BASELINE_MAX_DEVICES:
                # the same case walked per device, in the same run (the baseline)
                base = _scale_case(kind, label, reps, budget_s, mode="off")
                record["walk_cpu"] = base.get("cpu") or []
                record["walk_verdict"] = base.get("error") or base.get("verdict")
            cases[f"{kind}@{label}"] = record
            times = record["times"]
            cpu = record.get("cpu") or []
            best = f"{min(times):.3f} s" if times else "-"
            median = f"{statistics.median(times):.3f} s" if times else "-"
            best_cpu = f"{min(cpu):.3f} s" if cpu else "-"
            rss = record.get("peak_rss_mib")
            result = record.get("error") or record.get("verdict") or "-"
            walk_cpu = record.get("walk_cpu") or []
            walk = f"{min(walk_cpu):.3f} s" if walk_cpu else "-"
            rows.append(
                [
                    kind,
                    label,
                    record["devices"],
                    record["steps"],
                    best,
                    median,
                    best_cpu,
                    walk,
                    f"{rss} MiB" if rss is not None else "-",
                    record.get("dmas") or "-",
                    str(record.get("path") or "-")[:60],
                    result[:90],
                ]
            )
            print(f"  {kind} on {label}: {best} ({result})", flush=True)
    print()
    print(
        table(
            [
                "kernel",
                "mesh",
                "devices",
                "ring steps",
                "best",
                "median",
                "best CPU",
                "per-device walk CPU",
                "peak RSS",
                "DMAs",
                "path",
                "verdict (an error: time to it)",
            ],
            rows,
        )
    )
    growth = []
    for kind in kinds:

        def best_of(label: str, kind: str = kind) -> float | None:
            times = cases.get(f"{kind}@{label}", {}).get("times") or []
            return min(times) if times else None

        by_devices = [
            (float(n), t) for n in (8, 64, 256, 1024) if (t := best_of(str(n))) is not None
        ]
        by_steps = [
            (float(s), t)
            for label, s in (("4x64", 63), ("16x16", 15), ("64x4", 3))
            if (t := best_of(label)) is not None
        ]
        at_256 = best_of("256")
        d_slope, s_slope = _slope(by_devices), _slope(by_steps)
        growth.append(
            {
                "kernel": kind,
                "devices_exponent": d_slope,
                "steps_exponent": s_slope,
                "s_at_256": at_256,
                "goal_256_met": at_256 is not None and at_256 < GOAL_256_S,
            }
        )
    print()
    print(
        table(
            [
                "kernel",
                "time ~ devices^k (1-D rings)",
                "time ~ steps^k (256 devices)",
                f"256 devices < {GOAL_256_S:g} s",
            ],
            [
                [
                    g["kernel"],
                    "-" if g["devices_exponent"] is None else f"k = {g['devices_exponent']:.2f}",
                    "-" if g["steps_exponent"] is None else f"k = {g['steps_exponent']:.2f}",
                    "-"
                    if g["s_at_256"] is None
                    else f"{'met' if g['goal_256_met'] else 'missed'} ({g['s_at_256']:.2f} s)",
                ]
                for g in growth
            ],
        )
    )
    return {"cases": cases, "growth": growth, "budget_s": budget_s, "reps": reps}


# ------------------------------------------------------------------ 2. verify vs simulate


def _simulate_once(kind: str) -> float:
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from safedma.testing import simulate, simulated_mesh

    rows, cols = _block(kind, 8)
    x = jax.numpy.asarray(
        np.random.default_rng(0).standard_normal((rows * 8, cols)), jax.numpy.float32
    )
    mesh = simulated_mesh(8, "x")
    fn = _kernel(kind)
    gc.collect()
    t0 = time.perf_counter()
    simulate(fn, x, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    return time.perf_counter() - t0


def _verify_on_eight(kind: str) -> float:
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from safedma.testing import simulated_mesh

    rows, cols = _block(kind, 8)
    x = jax.numpy.asarray(
        np.random.default_rng(0).standard_normal((rows * 8, cols)), jax.numpy.float32
    )
    seconds, _, verdict = _timed_verify(
        _kernel(kind), x, mesh=simulated_mesh(8, "x"), in_specs=P("x"), out_specs=P("x")
    )
    _VERDICTS[kind] = verdict
    return seconds


_VERDICTS: dict[str, str] = {}


def versus(reps: int) -> dict[str, Any]:
    heading("5b. verify vs simulate, 8 CPU devices, tracing included (interleaved A/B)")
    out: dict[str, Any] = {}
    rows = []
    for kind in KERNELS:
        mesh_kind = "simulated"
        try:
            _verify_on_eight(kind)  # warm-up (imports, first compile of shared pieces)
            runner: Callable[[str], float] = _verify_on_eight
        except Exception:  # the engine may not take a real mesh yet: use a device-free one
            runner = lambda k: verify_once(k, (8,), ("x",))[0]  # noqa: E731
            _VERDICTS[kind] = verify_once(kind, (8,), ("x",))[2]
            mesh_kind = "device-free"
        try:
            _simulate_once(kind)
        except Exception as err:
            out[kind] = {"error": f"simulate: {type(err).__name__}: {err}"}
            rows.append([kind, "-", "-", "-", "-", out[kind]["error"][:60]])
            continue
        ours: list[float] = []
        theirs: list[float] = []
        error = None
        for i in range(reps):
            try:
                if i % 2 == 0:
                    ours.append(runner(kind))
                    theirs.append(_simulate_once(kind))
                else:
                    theirs.append(_simulate_once(kind))
                    ours.append(runner(kind))
            except Exception as err:
                error = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
                break  # not a verdict (those are timed): the engine or simulate failed
        if not ours or len(ours) != len(theirs):
            out[kind] = {"error": error or "no measurement"}
            rows.append([kind, "-", "-", "-", "-", out[kind]["error"][:60]])
            continue
        speedup = Spread.of([s / v for s, v in zip(theirs, ours)])
        verdict = _VERDICTS.get(kind, "-")
        out[kind] = {
            "verify_s": Spread.of(ours).as_dict(),
            "simulate_s": Spread.of(theirs).as_dict(),
            "speedup": speedup.as_dict(),
            "verify_mesh": mesh_kind,
            "verify_verdict": verdict,
            "goal_met": speedup.median >= GOAL_SPEEDUP,
        }
        rows.append(
            [
                kind,
                ms(statistics.median(ours)) + f" ({mesh_kind})",
                ms(statistics.median(theirs)),
                ratio_text(speedup),
                "met" if speedup.median >= GOAL_SPEEDUP else "missed",
                verdict[:60],
            ]
        )
    print(
        table(
            [
                "kernel",
                "verify (median)",
                "simulate (median)",
                "speedup simulate/verify: median (IQR, min-max)",
                f"goal >= {GOAL_SPEEDUP:g}x",
                "verify's verdict",
            ],
            rows,
        )
    )
    return out


# ------------------------------------------------------------------ 3. memory


def memory() -> dict[str, Any]:
    heading(
        "5c. peak memory: the 8-device all-gather with 4 KiB vs 1 GiB blocks (ShapeDtypeStruct)"
    )
    out: dict[str, Any] = {}
    rows = []
    for label, block in (("4 KiB", SMALL_BLOCK), ("1 GiB", BIG_BLOCK)):
        try:
            verify_once("all_gather", (8,), ("x",), block)  # warm-up
            seconds = min(verify_once("all_gather", (8,), ("x",), block)[0] for _ in range(3))
            tracemalloc.start()
            verify_once("all_gather", (8,), ("x",), block)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        except Exception as err:
            if tracemalloc.is_tracing():
                tracemalloc.stop()
            out[label] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
            rows.append([label, "-", "-", out[label]["error"]])
            continue
        out[label] = {"seconds": seconds, "peak_bytes": peak}
        rows.append([label, f"{seconds:.3f} s", f"{peak / 2**20:.1f} MiB", "ok"])
    if "seconds" in out.get("4 KiB", {}) and "seconds" in out.get("1 GiB", {}):
        out["time_ratio_big_small"] = out["1 GiB"]["seconds"] / out["4 KiB"]["seconds"]
        out["peak_ratio_big_small"] = out["1 GiB"]["peak_bytes"] / out["4 KiB"]["peak_bytes"]
    print(table(["block", "time (best of 3)", "peak Python allocation", "result"], rows))
    return out


def run(reps: int = 3, quick: bool = False, budget_s: float = 300.0) -> dict[str, Any]:
    return {
        "scale": scale(reps, budget_s, quick),
        "versus_simulate": versus(max(reps, 2) * 2),
        "memory": memory(),
    }


_USAGE = (
    "run the benchmarks with: python -m benchmarks --only verify; or only the scale "
    "table: python -m benchmarks.verify --scale KIND[,KIND] MESH[,MESH] [REPS] [BUDGET_S]"
    f" (kinds {','.join(KERNELS)}; meshes {','.join(lab for lab, _, _ in MESHES)})"
)

if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif 4 <= len(sys.argv) <= 6 and sys.argv[1] == "--scale":
        picked = tuple(sys.argv[2].split(","))
        meshes = tuple(sys.argv[3].split(","))
        if not set(picked) <= set(KERNELS) or not set(meshes) <= {lab for lab, _, _ in MESHES}:
            sys.exit(_USAGE)
        reps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
        budget = float(sys.argv[5]) if len(sys.argv) > 5 else 300.0
        print(json.dumps(scale(reps, budget, False, picked, meshes)["cases"]))
    else:
        sys.exit(_USAGE)
