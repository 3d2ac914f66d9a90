"""How many seeded mistakes each tool reports at the line a person would fix.

``python -m tests.tools.fix_lines [--tool verify] [--tool simulate] [-k SUBSTRING]``
runs every corpus case whose verdict for the tool is a :class:`Raises` (a seeded
mistake), and counts the errors whose message names one of the case's ``# fix:`` lines
as ``file.py:LINE``, whatever the verdict asks. It prints one row per case and a total
per tool (the figure docs/coverage.md quotes); ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import warnings

from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case, Raises, names_line

RUNS: dict[str, Callable[[Any], Any]] = {"verify": _run.verify, "simulate": _run.simulate}


@dataclasses.dataclass
class Row:
    case: str
    outcome: str  # "named", "not named", "no error", "no marker"
    asks_line: bool
    message: str = ""


def mistakes(tool: str, selected: str = "") -> list[Case]:
    """The corpus cases whose verdict for ``tool`` is an error."""
    return [
        c for c in corpus.cases(tool) if isinstance(c.expect[tool], Raises) and selected in c.name
    ]


def measure(case: Case, tool: str) -> Row:
    verdict = case.expect[tool]
    assert isinstance(verdict, Raises)
    try:
        marked = case.fix_lines()
    except LookupError:
        marked = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            RUNS[tool](case.build())
    except Exception as error:  # noqa: BLE001 - every error is measured
        message = str(error)
        named = any(names_line(message, path, lines) for path, lines in marked)
        outcome = "named" if named else "not named" if marked else "no marker"
        return Row(case.name, outcome, verdict.line, message)
    return Row(case.name, "no error", verdict.line)


def _cpu_devices() -> None:
    """Simulated CPU devices for the meshes (read when jax starts its backend, which
    importing the corpus does not do)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        ).strip()


def main(argv: list[str]) -> int:
    _cpu_devices()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool", action="append", choices=sorted(RUNS))
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    parser.add_argument("--json", help="write the rows and totals here")
    parser.add_argument("-v", action="store_true", help="print each unnamed message")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for tool in args.tool or ["verify"]:
        rows = []
        started = time.perf_counter()
        for case in mistakes(tool, args.k):
            row = measure(case, tool)
            rows.append(row)
            flag = "" if row.asks_line else "  (verdict: line=False)"
            print(f"{tool:8} {row.outcome:9} {row.case}{flag}", flush=True)
            if args.v and row.outcome != "named":
                print("    " + row.message.replace("\n", "\n    ")[:1500])
        named = sum(r.outcome == "named" for r in rows)
        print(
            f"{tool}: {named} of {len(rows)} seeded mistakes reported at the line to fix "
            f"({time.perf_counter() - started:.0f} s)\n",
            flush=True,
        )
        results[tool] = {
            "named": named,
            "mistakes": len(rows),
            "rows": [dataclasses.asdict(r) for r in rows],
        }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
