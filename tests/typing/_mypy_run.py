"""Run mypy as a subprocess and parse what it prints (shared by the mypy type tests)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note|warning): (?P<message>.*)$"
)
_CODE = re.compile(r"\s+\[(?P<code>[a-z0-9-]+)\]$")


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    path: Path
    line: int
    severity: str
    message: str
    code: str | None
    raw: str


@dataclasses.dataclass(frozen=True)
class MypyRun:
    returncode: int
    diagnostics: tuple[Diagnostic, ...]
    unparsed: tuple[str, ...]
    stderr: str
    seconds: float

    def for_path(self, path: Path) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.path == path.resolve()]

    def under(self, directory: Path) -> list[Diagnostic]:
        root = directory.resolve()
        return [d for d in self.diagnostics if d.path.is_relative_to(root)]


def parse(output: str) -> tuple[list[Diagnostic], list[str]]:
    diagnostics: list[Diagnostic] = []
    unparsed: list[str] = []
    for raw in output.splitlines():
        if not raw.strip():
            continue
        match = _LINE.match(raw)
        if match is None:
            unparsed.append(raw)
            continue
        message = match["message"]
        code_match = _CODE.search(message)
        code = code_match["code"] if code_match else None
        if code_match:
            message = message[: code_match.start()]
        path = Path(match["path"])
        if not path.is_absolute():
            path = REPO / path
        diagnostics.append(
            Diagnostic(path.resolve(), int(match["line"]), match["severity"], message, code, raw)
        )
    return diagnostics, unparsed


def run_mypy(targets: Sequence[str | Path], flags: Sequence[str]) -> MypyRun:
    """``python -m mypy`` with this interpreter, from the repo root."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *flags, *(str(t) for t in targets)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(
            f"mypy crashed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    diagnostics, unparsed = parse(proc.stdout)
    return MypyRun(proc.returncode, tuple(diagnostics), tuple(unparsed), proc.stderr, seconds)
