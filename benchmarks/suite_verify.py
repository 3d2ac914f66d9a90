"""What ``--safedma-verify`` costs a test suite: the same pytest run with and without it.

``python -m benchmarks.suite_verify [--pairs N] PATH...`` runs ``pytest -q PATH...``
without the option and with it, ``N`` pairs (default 1), in alternating order so
that a change in the machine's load does not favour one side, and prints a Markdown
table of wall time and CPU time (user + sys of pytest and everything it started),
with the plugin's own summary line (programs verified, seconds inside verify).
Each run is a fresh process: jax's start is in both sides. Not part of ``./dev bench``
(a suite subset takes minutes per run).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Timing:
    verify: bool
    wall_s: float
    cpu_s: float
    exit_code: int
    tests: str  # pytest's last line ("1030 passed in ...")
    summary: str  # the plugin's count line, "" without the option


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(paths: list[str], verify: bool, timeout_s: float) -> Timing:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    if verify:
        command.insert(3, "--safedma-verify")
    env = {k: v for k, v in os.environ.items() if k != "SAFEDMA_VERIFY"}
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    lines = done.stdout.strip().splitlines()
    found = re.search(r"^\d+ kernel program\(s\) verified.*$", done.stdout, re.M)
    return Timing(
        verify, wall, cpu, done.returncode, lines[-1] if lines else "", found[0] if found else ""
    )


def table(timings: list[Timing]) -> str:
    rows = [
        "| run | --safedma-verify | wall s | CPU s | exit | pytest | plugin summary |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, t in enumerate(timings, 1):
        rows.append(
            f"| {i} | {'on' if t.verify else 'off'} | {t.wall_s:.0f} | {t.cpu_s:.0f} | "
            f"{t.exit_code} | {t.tests} | {t.summary} |"
        )
    for verify in (False, True):
        side = [t for t in timings if t.verify == verify]
        if side:
            wall = sum(t.wall_s for t in side) / len(side)
            cpu = sum(t.cpu_s for t in side) / len(side)
            rows.append(f"| mean | {'on' if verify else 'off'} | {wall:.0f} | {cpu:.0f} | | | |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite_verify", description=__doc__)
    p.add_argument("paths", nargs="+", help="pytest paths, as on pytest's command line")
    p.add_argument("--pairs", type=int, default=1, help="runs with and without (default 1)")
    p.add_argument("--timeout", type=float, default=3000.0, help="seconds per run")
    args = p.parse_args(argv)
    timings: list[Timing] = []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        for verify in order:
            timings.append(run_once(args.paths, verify, args.timeout))
    print(f"pytest {' '.join(args.paths)}, load average at end {os.getloadavg()[0]:.1f}\n")
    print(table(timings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
