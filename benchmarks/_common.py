"""What every benchmark shares: paths, the machine, statistics, tables, JSON.

Kept free of jax so that the command line can describe the machine and set
up the environment before jax initialises.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
RESULTS = Path(__file__).resolve().parent / "results"


# --------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 2**20:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    found: dict[str, str] = {}
    for dist in ("jax", "jaxlib", "libtpu", "mypy", "pyright"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = "missing"
    return found


def machine_info() -> dict[str, Any]:
    """Where the numbers were measured; goes at the top of every result file."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count(),
        "memory_total": _memory_total(),
        "load_average_at_start": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "jax_platforms_env": os.environ.get("JAX_PLATFORMS", ""),
        **_versions(),
    }


def machine_tag(info: dict[str, Any], accelerator: str) -> str:
    """A short file-name-safe name: CPU model, cores, accelerator, Python."""
    model = re.sub(r"[^a-z0-9]+", "-", str(info["cpu_model"]).lower()).strip("-")
    py = "py" + "".join(str(info["python"]).split(".")[:2])
    return f"{model}-{info['nproc']}cpu-{accelerator}-{py}"


def default_results_path(info: dict[str, Any], accelerator: str) -> Path:
    day = datetime.date.today().isoformat()
    return RESULTS / f"{machine_tag(info, accelerator)}-{day}.json"


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median and spread of repeated measurements (seconds or ratios)."""

    n: int
    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no measurements")
        data = sorted(values)
        if len(data) >= 2:
            q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
        else:
            q1 = q3 = data[0]
        return cls(len(data), statistics.median(data), data[0], data[-1], q1, q3)

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def ratio_text(s: Spread) -> str:
    """``1.012 (IQR 1.004-1.020, min-max 0.990-1.051)``"""
    return f"{s.median:.3f} (IQR {s.q1:.3f}-{s.q3:.3f}, min-max {s.minimum:.3f}-{s.maximum:.3f})"


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into the README)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def heading(title: str) -> None:
    print(f"\n## {title}\n", flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
