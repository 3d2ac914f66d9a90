"""Run safedma's benchmarks, print a table for each and write the results as JSON.

``python -m benchmarks [--only NAME,...] [--reps N] [--out PATH] ...`` (or
``./dev bench``) runs the chosen benchmarks in order, prints a table for each, and writes
all results with a description of the machine to one JSON file
(benchmarks/results/<machine>-<date>.json unless ``--out`` is given). Exits
1 when a check fails: a kernel not identical to its twin (benchmark 1) or a
TPU benchmark kernel giving a wrong result in interpret mode (benchmark 4).
A missed trace-overhead goal is reported, not failed.
"""

from __future__ import annotations

import os

# Before jax initialises: CPU devices for the interpret-mode checks of benchmark 4
# (ignored on a TPU), and no TPU search on machines that have libtpu but no TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks._common import default_results_path, machine_info, write_json  # noqa: E402

BENCHMARKS = ("identity", "overhead", "typecheck", "tpu", "verify", "sanitize", "verify_scale")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    return names


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only",
        type=_names,
        action="extend",
        metavar="NAME[,NAME]",
        help=f"benchmarks to run (repeatable; default all): {', '.join(BENCHMARKS)}",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions: A/B pairs for overhead (default 15), timed calls for tpu "
        "(default 20), warm mypy runs for typecheck (default 5), timed calls "
        "per scale case for verify (default 3; its A/B pairs are twice that)",
    )
    p.add_argument(
        "--cold-reps",
        type=int,
        default=None,
        help="cold mypy runs and pyright runs per file for typecheck (default 3)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run: one topology, 5 A/B pairs, 1 cold and 2 warm type checks, 3 sizes",
    )
    p.add_argument(
        "--topologies",
        type=lambda s: [t for t in s.split(",") if t],
        help="identity: TPU topologies to compile for (default: the full matrix)",
    )
    p.add_argument(
        "--kernels",
        type=lambda s: {k for k in s.split(",") if k},
        help="identity: registry names to run (default all; see benchmarks/kernels.py)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="overhead: always cProfile the safedma traces (default: only when the "
        "5%% goal is missed)",
    )
    p.add_argument(
        "--tpu-topology",
        default="v6e:2x2",
        help="tpu: topology for the compile-only builds when no TPU is present",
    )
    p.add_argument(
        "--verify-budget",
        type=float,
        default=300.0,
        help="verify: seconds allowed per scale case, in its own process (default 300)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results file (default benchmarks/results/<machine>-<date>.json)",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    ns = parse(argv)
    chosen = [b for b in BENCHMARKS if b in (ns.only or BENCHMARKS)]
    info = machine_info()
    import jax

    platform = jax.devices()[0].platform
    accelerator = (
        jax.devices()[0].device_kind.replace(" ", "-").lower() if platform == "tpu" else "notpu"
    )
    info["jax_platform"] = platform
    print(f"safedma benchmarks: {', '.join(chosen)}")
    print(
        f"machine: {info['cpu_model']}, {info['nproc']} CPUs, {info['memory_total']}, "
        f"load {info['load_average_at_start']}, Python {info['python']}, jax {info['jax']}, "
        f"jax platform {platform}",
        flush=True,
    )
    results: dict[str, Any] = {"machine": info, "argv": argv, "benchmarks": {}}
    ok = True
    started_all = time.perf_counter()
    for name in chosen:
        started = time.perf_counter()
        if name == "identity":
            from benchmarks import identity

            record = identity.run(quick=ns.quick, topologies=ns.topologies, kernels=ns.kernels)
            ok = ok and record["ok"]
        elif name == "overhead":
            from benchmarks import overhead

            reps = ns.reps or (5 if ns.quick else 15)
            record = overhead.run(reps=reps, warmup=1 if ns.quick else 2, profile=ns.profile)
        elif name == "typecheck":
            from benchmarks import typecheck

            record = typecheck.run(
                cold_reps=max(1, ns.cold_reps or (1 if ns.quick else 3)),
                warm_reps=max(1, ns.reps or (2 if ns.quick else 5)),
            )
        elif name == "tpu":
            from benchmarks import tpu

            record = tpu.run(reps=ns.reps or 20, quick=ns.quick, topology=ns.tpu_topology)
            ok = ok and record.get("ok", True)
        elif name == "sanitize":
            from benchmarks import sanitize

            record = sanitize.run(reps=ns.reps or 20, quick=ns.quick)
            ok = ok and record.get("ok", True)
        elif name == "verify_scale":
            from benchmarks import verify_scale

            record = verify_scale.run()
        else:
            from benchmarks import verify

            record = verify.run(reps=ns.reps or 3, quick=ns.quick, budget_s=ns.verify_budget)
        record["wall_seconds"] = round(time.perf_counter() - started, 1)
        results["benchmarks"][name] = record
        print(f"\n[{name}: {record['wall_seconds']:.0f} s]", flush=True)
    results["wall_seconds"] = round(time.perf_counter() - started_all, 1)
    results["ok"] = ok
    out = ns.out or default_results_path(info, accelerator)
    write_json(out, results)
    print(f"\nresults written to {out}")
    print(f"benchmarks {'passed' if ok else 'FAILED'} in {results['wall_seconds']:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
