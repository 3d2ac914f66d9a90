"""Benchmark 3, type-checking cost: mypy and pyright on a kernel file, safedma vs raw pltpu.

The two files in benchmarks/typecheck_files/ hold the same three kernels
(they lower to the same Mosaic, see tests/test_bench_identity.py), one
written with safedma and one in raw pltpu. Each checker runs as its own
process, the way a developer or CI runs it, with A and B interleaved:

* mypy ``--strict`` (with ``untyped_calls_exclude = jax``, as the README
  recommends), **cold**: a fresh, empty cache directory per run, so jax,
  numpy and safedma are analysed from scratch; **warm**: the cache of an
  earlier run, file unchanged; **edit**: that cache with the kernel file
  changed (a comment line added), the everyday edit-and-check loop.
* pyright (standard mode): it keeps no cache between runs, so every run is
  cold; a "warm" pyright number would only measure the OS file cache.

Each file is checked from a temporary directory with safedma found on
MYPYPATH / pyright's extraPaths (the editable install's import hook is
invisible to type checkers), so the repository's own configuration plays no
part. Reported: median wall time per file, its ratio, and the checker's
verdict (both files are expected to be clean).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import ROOT, Spread, heading, ratio_text, table

FILES = Path(__file__).resolve().parent / "typecheck_files"
SIDES = {"safedma": "kernels_safedma.py", "pltpu": "kernels_pltpu.py"}
MYPY_FLAGS = ["--strict", "--untyped-calls-exclude=jax", "--no-error-summary", "--no-color-output"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    out = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )
    return time.perf_counter() - started, out.returncode, (out.stdout + out.stderr).strip()


class _Workspace:
    """A scratch directory per side, holding the kernel file and the checker caches."""

    def __init__(self, root: Path, side: str) -> None:
        self.dir = root / side
        self.dir.mkdir()
        self.file = self.dir / SIDES[side]
        shutil.copy(FILES / SIDES[side], self.file)
        (self.dir / "pyrightconfig.json").write_text(
            '{"extraPaths": [' + _json_str(str(ROOT)) + '], "typeCheckingMode": "standard"}\n'
        )
        self.env = {**os.environ, "MYPYPATH": str(ROOT)}
        self.edits = 0

    def mypy(self, cache: Path) -> tuple[float, int, str]:
        cmd = [sys.executable, "-m", "mypy", *MYPY_FLAGS, "--cache-dir", str(cache), self.file.name]
        return _run(cmd, self.dir, self.env)

    def pyright(self) -> tuple[float, int, str]:
        exe = shutil.which("pyright", path=str(Path(sys.executable).parent)) or "pyright"
        cmd = [exe, "--pythonpath", sys.executable, self.file.name]
        return _run(cmd, self.dir, self.env)

    def edit(self) -> None:
        self.edits += 1
        with self.file.open("a") as fh:
            fh.write(f"# edit {self.edits}\n")


def _json_str(text: str) -> str:
    import json

    return json.dumps(text)


def _pyright_available() -> bool:
    return shutil.which("pyright", path=str(Path(sys.executable).parent)) is not None


def run(*, cold_reps: int = 3, warm_reps: int = 5) -> dict[str, Any]:
    """Run benchmark 3; print its table; return the JSON record."""
    heading("3. Type-checking cost: safedma / raw pltpu kernel file (mypy --strict, pyright)")
    times: dict[str, dict[str, list[float]]] = {}
    verdicts: dict[str, dict[str, str]] = {}

    def record(mode: str, side: str, result: tuple[float, int, str]) -> None:
        seconds, rc, text = result
        times.setdefault(mode, {}).setdefault(side, []).append(seconds)
        verdict = "clean" if rc == 0 else f"exit {rc}: {text.splitlines()[-1] if text else ''}"
        previous = verdicts.setdefault(mode, {}).get(side)
        if previous is None or previous == "clean":
            verdicts[mode][side] = verdict

    with tempfile.TemporaryDirectory(prefix="safedma-bench-typecheck-") as tmp:
        root = Path(tmp)
        spaces = {side: _Workspace(root, side) for side in SIDES}
        order = list(SIDES)
        print(f"mypy cold x{cold_reps} ... ", end="", flush=True)
        caches: dict[str, Path] = {}
        for i in range(cold_reps):
            for side in order if i % 2 == 0 else order[::-1]:
                cache = root / f"cold-{side}-{i}"
                record("mypy cold", side, spaces[side].mypy(cache))
                if side in caches:
                    shutil.rmtree(caches[side], ignore_errors=True)
                caches[side] = cache  # the last cold run's cache is the warm one
        print(f"warm x{warm_reps} ... ", end="", flush=True)
        for i in range(warm_reps):
            for side in order if i % 2 == 0 else order[::-1]:
                record("mypy warm", side, spaces[side].mypy(caches[side]))
        print(f"edit x{warm_reps} ... ", end="", flush=True)
        for i in range(warm_reps):
            for side in order if i % 2 == 0 else order[::-1]:
                spaces[side].edit()
                record("mypy edit", side, spaces[side].mypy(caches[side]))
        if _pyright_available():
            print(f"pyright x{cold_reps} ... ", end="", flush=True)
            for side in SIDES:
                spaces[side].pyright()  # untimed: the first run also loads node's code
            for i in range(cold_reps):
                for side in order if i % 2 == 0 else order[::-1]:
                    record("pyright", side, spaces[side].pyright())
        print("done", flush=True)

    results: dict[str, Any] = {}
    rows = []
    for mode, by_side in times.items():
        a, b = by_side["safedma"], by_side["pltpu"]
        ratio = Spread.of([x / y for x, y in zip(a, b)])
        results[mode] = {
            "safedma_s": Spread.of(a).as_dict(),
            "pltpu_s": Spread.of(b).as_dict(),
            "ratio": ratio.as_dict(),
            "verdict": verdicts[mode],
        }
        rows.append(
            [
                mode,
                len(a),
                f"{Spread.of(a).median:.2f} s",
                f"{Spread.of(b).median:.2f} s",
                ratio_text(ratio),
                f"{verdicts[mode]['safedma']} / {verdicts[mode]['pltpu']}",
            ]
        )
    print()
    print(
        table(
            [
                "checker",
                "runs",
                "safedma file (median)",
                "pltpu file (median)",
                "ratio: median (IQR, min-max)",
                "verdict safedma / pltpu",
            ],
            rows,
        )
    )
    if not _pyright_available():
        print("pyright is not installed in this environment: not measured")
    print("pyright keeps no cache between runs: each run is cold, so there is no warm figure")
    return {
        "files": {side: f"benchmarks/typecheck_files/{name}" for side, name in SIDES.items()},
        "mypy_flags": MYPY_FLAGS,
        "modes": results,
    }
