"""The catalogue's chip column: what each DMA mistake does on a real TPU, next to what safedma does.

``python -m benchmarks.chip_mistakes --out FILE.json`` runs every catalogue
row one chip can show (benchmarks/chip_cases.py: the S and T rows that get
past jax's own tracing, R1-R7 and R9) as raw pltpu on the chip, each risky
case in a process of its own under a timeout (benchmarks/chip_runner.py),
and records what happened: a compile (or lowering) error with its first line,
a hang (killed after ``--hang-s`` seconds), a crash, silent wrong data (the
fraction of wrong elements against the input the kernel copies) or right by
luck. Each row's fix runs too and must come out right.

Alongside, on the host CPU of the same machine (this process never takes the
chip), it records what safedma does with the same mistake: the trace-time
error of the safedma spelling (``sd.pallas_call``), and what
``safedma.testing.simulate`` and ``safedma.testing.verify`` say of the raw
kernel. It writes the JSON and a Markdown table (``--md``, default the JSON's
path with ``.md``).

Without a TPU the chip column says why it is empty ("no TPU: ...") and the
safedma side still runs. On a v5e: about 4 minutes (8 child processes, two
of them killed after ``--hang-s``), plus the CPU side in parallel.
"""

from __future__ import annotations

import os

# This process stays on the CPU: the chip is for the child processes. A platform list
# the caller set without "tpu" (CI, a laptop) goes to the children too, so they report
# "no TPU" instead of failing to find one.
_CALLER_PLATFORMS = os.environ.get("JAX_PLATFORMS", "")
if _CALLER_PLATFORMS and "tpu" not in _CALLER_PLATFORMS:
    os.environ.setdefault("SAFEDMA_CHIP_PLATFORMS", _CALLER_PLATFORMS)
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks import chip_cases as cc  # noqa: E402
from benchmarks._common import machine_info, table, write_json  # noqa: E402
from benchmarks.chip_runner import (  # noqa: E402
    DEFAULT_HANG_S,
    DEFAULT_PAUSE_S,
    ChipRun,
    VariantResult,
    run_on_chip,
)

CPU_ROWS = cc.SMALL
SIMULATE_TIMEOUT_S = 30.0


# ------------------------------------------------------------------ the CPU side


def _error(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:220] if lines else ''}"


def safedma_side(case: cc.ChipCase) -> dict[str, str]:
    """Trace the safedma spelling; simulate and verify the raw bug (CPU only)."""
    import jax
    import numpy as np

    from safedma.testing import simulate, verify

    out: dict[str, str] = {"static": case.safedma_static}
    spec = jax.ShapeDtypeStruct((CPU_ROWS, cc.LANES), np.float32)
    if case.safedma_spelling is None:
        out["trace"] = "-"
    else:
        try:
            jax.jit(case.safedma_spelling(CPU_ROWS)).trace(spec)
        except Exception as err:
            out["trace"] = _error(err)
        else:
            out["trace"] = "traces (no trace-time check)"
    bug = case.build("bug", CPU_ROWS)
    x = cc.example(CPU_ROWS, 1)
    try:
        got = simulate(bug, x, timeout_s=SIMULATE_TIMEOUT_S)
    except Exception as err:
        out["simulate"] = _error(err)
    else:
        wrong = cc.wrong_fraction(np.asarray(got), x)
        out["simulate"] = "passes, output right" if not wrong else f"passes, {wrong:.0%} wrong"
    try:
        verify(bug, spec, timeout_s=120.0)
    except Exception as err:
        out["verify"] = _error(err)
    else:
        out["verify"] = "clean"
    return out


# ------------------------------------------------------------------ the tables


def _size(rows: int) -> str:
    n = rows * cc.LANES * 4
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def describe(v: VariantResult) -> str:
    """One variant's outcome in a table cell."""
    if v.outcome in (cc.WRONG, cc.RIGHT, cc.RIGHT_BY_LUCK) and v.wrong_fractions:
        calls = len(v.wrong_fractions)
        if v.outcome == cc.WRONG:
            worst = max(v.wrong_fractions)
            bad = sum(1 for f in v.wrong_fractions if f)
            return f"{v.outcome} at {_size(v.rows)}: {bad} of {calls} calls, up to {worst:.1%} of elements"
        return f"{v.outcome} at {_size(v.rows)} ({calls} call{'s' if calls > 1 else ''})"
    where = f" at {_size(v.rows)}" if v.rows else ""
    return f"{v.outcome}{where}" + (f": {v.detail}" if v.detail else "")


def _cut(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def chip_cell(run: ChipRun, name: str) -> tuple[str, str]:
    result = run.cases.get(name)
    if result is None:
        return "not run", "-"
    if result.infrastructure:
        return "not measured (see above)", "-"
    bug = "; ".join(describe(v) for v in result.bug) or "not reached"
    fix = describe(result.fix) if result.fix else "not reached"
    return bug, fix


def matches_catalogue(run: ChipRun, case: cc.ChipCase) -> str:
    result = run.cases.get(case.name)
    if result is None or result.infrastructure or not result.bug:
        return "-"
    return "yes" if result.bug_outcome in case.catalogue_says else "NO"


def markdown(record: dict[str, Any], run: ChipRun) -> str:
    rows = []
    for entry in record["cases"]:
        case = cc.BY_NAME[entry["name"]]
        bug, fix = chip_cell(run, case.name)
        side = entry.get("safedma", {})
        rows.append(
            [
                f"{case.row}: {case.title}",
                case.mistake,
                bug,
                fix,
                ", ".join(sorted(case.catalogue_says)),
                matches_catalogue(run, case),
                side.get("static", "-"),
                _cut(side.get("trace", "not run")),
                _cut(side.get("simulate", "not run")),
                _cut(side.get("verify", "not run")),
            ]
        )
    head = [
        "# The catalogue's mistakes on a TPU chip",
        "",
        f"Measured {record['date']} with `python -m benchmarks.chip_mistakes`; "
        f"chip: {record['chip']['device_kind'] or record['chip']['no_tpu'] or 'none'}; "
        f"versions {record['chip']['versions'] or '-'}; a run still going after "
        f"{record['hang_s']:.0f} s is a hang; {record['chip']['children']} child processes, "
        f"{record['chip']['seconds']:.0f} s on the chip. The safedma side ran in jax "
        f"{record['machine'].get('jax', '?')} on the host CPU. Full messages: the JSON file.",
        "",
        "Raw pltpu, as written without safedma: what the chip did with the mistake (each "
        "size run several times, with new input values each call), what it did with the "
        "fix, what docs/catalogue.md predicts for a TPU and whether the chip agreed; then "
        "what safedma does with the same mistake: the type checkers (from the type-test "
        "corpus), tracing the safedma spelling, and `simulate` / `verify` of the raw "
        f"kernel at {_size(CPU_ROWS)} on the host CPU.",
        "",
    ]
    notes = [f"- {n}" for n in record["chip"].get("notes", [])]
    return (
        "\n".join(
            head
            + [
                table(
                    [
                        "row",
                        "mistake (raw pltpu)",
                        "on the chip",
                        "fix on the chip",
                        "catalogue says",
                        "agrees",
                        "safedma: types",
                        "safedma: trace",
                        "simulate (raw)",
                        "verify (raw)",
                    ],
                    rows,
                )
            ]
            + ([""] + notes if notes else [])
        )
        + "\n"
    )


# ------------------------------------------------------------------ main


def run(
    names: list[str],
    *,
    hang_s: float,
    pause_s: float,
    cpu_side: bool,
    isolate: bool,
) -> tuple[dict[str, Any], ChipRun]:
    chip: dict[str, ChipRun] = {}

    def on_chip() -> None:
        chip["run"] = run_on_chip(names, hang_s=hang_s, pause_s=pause_s, isolate=isolate)

    worker = threading.Thread(target=on_chip, name="chip")
    worker.start()  # the chip's children; the CPU side runs here meanwhile
    sides: dict[str, dict[str, str]] = {}
    if cpu_side:
        for name in names:
            started = time.perf_counter()
            sides[name] = safedma_side(cc.BY_NAME[name])
            print(
                f"[cpu] {name}: trace {sides[name]['trace'][:60]}; simulate "
                f"{sides[name]['simulate'][:60]}; verify {sides[name]['verify'][:60]} "
                f"({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
    worker.join()
    result = chip["run"]
    cases = []
    for name in names:
        case = cc.BY_NAME[name]
        cases.append(
            {
                "name": name,
                "row": case.row,
                "title": case.title,
                "mistake": case.mistake,
                "catalogue_says": sorted(case.catalogue_says),
                "agrees_with_catalogue": matches_catalogue(result, case),
                "chip": result.cases[name].as_dict() if name in result.cases else None,
                "safedma": sides.get(name, {}),
            }
        )
    record = {
        "date": datetime.date.today().isoformat(),
        "machine": machine_info(),
        "hang_s": hang_s,
        "pause_s": pause_s,
        "chip": result.as_dict(),
        "cases": cases,
    }
    return record, result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.chip_mistakes", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="JSON results file")
    p.add_argument("--md", type=Path, help="Markdown table (default: --out with .md)")
    p.add_argument(
        "--only",
        type=lambda s: [n for n in s.split(",") if n],
        help=f"cases to run (default all): {', '.join(c.name for c in cc.CATALOGUE)}",
    )
    p.add_argument(
        "--hang-s",
        type=float,
        default=DEFAULT_HANG_S,
        help="seconds a kernel may run before it counts as hung (default %(default)s)",
    )
    p.add_argument(
        "--pause-s",
        type=float,
        default=DEFAULT_PAUSE_S,
        help="seconds between child processes (default %(default)s)",
    )
    p.add_argument(
        "--no-cpu-side", action="store_true", help="skip safedma's trace, simulate and verify"
    )
    p.add_argument(
        "--isolate", action="store_true", help="every case in a process of its own (slower)"
    )
    ns = p.parse_args(argv)
    names = ns.only or [c.name for c in cc.CATALOGUE]
    unknown = [n for n in names if n not in cc.BY_NAME]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}")
    started = time.perf_counter()
    record, result = run(
        names, hang_s=ns.hang_s, pause_s=ns.pause_s, cpu_side=not ns.no_cpu_side, isolate=ns.isolate
    )
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    write_json(ns.out, record)
    md_path = ns.md or ns.out.with_suffix(".md")
    text = markdown(record, result)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    print()
    print(text)
    print(f"results: {ns.out} and {md_path} ({record['wall_seconds']:.0f} s)")
    failed_fixes = [
        n for n, c in result.cases.items() if c.fix is not None and c.fix.outcome != cc.RIGHT
    ]
    if failed_fixes:
        print(f"FAILED: the fix of {', '.join(failed_fixes)} did not come out right on the chip")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
