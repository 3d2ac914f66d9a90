"""Benchmark: verify's lockstep path on long rings, this checkout against a baseline
commit, side by side in one run (CPU only, no TPU).

The ring all-gather, reduce-scatter and all-reduce of ``safedma.kernels`` on 1-D
device-free meshes of 256, 512 and 1024 devices, each verified in its own process
(tracing included, lockstep path on), reporting that process's CPU time for the
call (on a shared machine wall time includes waiting for a core) and which path
answered. The baseline is the same code at ``--baseline`` (a git ref, exported to a
temporary directory), run by the same interpreter, alternating with this checkout
case by case. Goal: under 5 s of CPU per 1024-device ring.

Each case runs ``reps`` times (alternating baseline and this checkout, each run its
own process) and the table gives the least CPU time of each: on a machine other jobs
load, the least is the run least disturbed by them.

``python -m benchmarks --only verify_scale`` (baseline: ``HEAD~1`` unless the
environment variable ``SAFEDMA_BENCH_BASELINE`` names another ref), or
``python -m benchmarks.verify_scale [REF] [KINDS] [DEVICES] [REPS]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from benchmarks._common import ROOT, heading, table

KINDS = ("all_gather", "reduce_scatter", "all_reduce")
DEVICES = (256, 512, 1024)
GOAL_1024_CPU_S = 5.0
BUDGET_S = 600

_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from benchmarks.verify import verify_once, _LAST_CPU
from safedma.testing._verify.face import api
kind, n = sys.argv[2], int(sys.argv[3])
verify_once(kind, (8,), ("x",))  # warm: jax's tracing machinery, imports
seconds, report, verdict = verify_once(kind, (n,), ("x",))
print(json.dumps({"cpu": _LAST_CPU[0], "wall": seconds, "verdict": verdict,
                  "gave_up": api._LAST_LOCKSTEP[0], "dmas": getattr(report, "dmas", None)}))
"""


def _case(root: str, kind: str, n: int) -> dict[str, Any]:
    env = dict(os.environ, SAFEDMA_VERIFY_LOCKSTEP="on", JAX_PLATFORMS="cpu")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, root, kind, str(n)],
            capture_output=True,
            text=True,
            timeout=BUDGET_S,
            env=env,
            cwd=root,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"over {BUDGET_S} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def _cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return str(r["error"])
    path = "lockstep" if not r["gave_up"] else f"walk ({r['gave_up']})"
    return f"{r['cpu']:.2f} s ({path})"


def _runs(r: dict[str, Any]) -> str:
    return ", ".join("-" if c is None else f"{c:.2f}" for c in r["cpu_runs"])


def _dmas(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The DMA count and verdict both checkouts reported (both, when they differ)."""
    b = (before.get("dmas"), before.get("verdict"))
    a = (after.get("dmas"), after.get("verdict"))
    if b == a:
        return f"{a[0]:,} ({a[1]})" if isinstance(a[0], int) else str(a[1])
    return f"{b[0]} ({b[1]}) vs {a[0]} ({a[1]})"


def _least(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the least CPU time (an error if any run failed), with every run's."""
    failed = [r for r in runs if "cpu" not in r]
    best = dict(failed[0] if failed else min(runs, key=lambda r: float(r["cpu"])))
    best["cpu_runs"] = [r.get("cpu") for r in runs]
    return best


def run(
    baseline: str | None = None,
    kinds: tuple[str, ...] = KINDS,
    devices: tuple[int, ...] = DEVICES,
    reps: int = 1,
) -> dict[str, Any]:
    ref = baseline or os.environ.get("SAFEDMA_BENCH_BASELINE", "HEAD~1")
    heading(
        f"verify_scale: lockstep path on 1-D rings, CPU seconds (least of {reps}),"
        f" this checkout vs {ref}"
    )
    rows: list[list[str]] = []
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(
            ["git", "archive", ref], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        for n in devices:
            for kind in kinds:
                pairs = [(_case(base, kind, n), _case(str(ROOT), kind, n)) for _ in range(reps)]
                before = _least([b for b, _ in pairs])
                after = _least([a for _, a in pairs])
                cases.append({"kind": kind, "devices": n, "before": before, "after": after})
                ratio = (
                    f"{before['cpu'] / after['cpu']:.1f}x"
                    if "cpu" in before and "cpu" in after and after["cpu"] > 0
                    else "-"
                )
                rows.append(
                    [kind, str(n), _dmas(before, after), _cell(before), _cell(after), ratio]
                )
                print(
                    f"  {kind} {n}: {_cell(before)} -> {_cell(after)}"
                    f" (CPU s per run: {_runs(before)} -> {_runs(after)})",
                    flush=True,
                )
    print(table(["kernel", "devices", "DMAs", f"CPU s at {ref}", "CPU s now", "speed-up"], rows))
    at_1024 = [c["after"].get("cpu", float("inf")) for c in cases if c["devices"] == 1024]
    return {
        "baseline": ref,
        "cases": cases,
        "goal_1024_cpu_s": GOAL_1024_CPU_S,
        "goal_met": bool(at_1024) and max(at_1024) < GOAL_1024_CPU_S,
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    run(
        args[0] if args else None,
        tuple(args[1].split(",")) if len(args) > 1 else KINDS,
        tuple(int(d) for d in args[2].split(",")) if len(args) > 2 else DEVICES,
        int(args[3]) if len(args) > 3 else 1,
    )
