"""Run any of the five type checkers (mypy, pyright, basedpyright, pyrefly, ty) the same way.

One entry point, ``run(checker, targets, setup)``, one ``Diagnostic`` type and one
comparison (``compare``) for every corpus in tests/. Each checker runs as a subprocess
with this interpreter's packages (the env's jax), its settings taken from the
project's own configuration (``[tool.mypy]``, ``pyrightconfig.json``, ``[tool.pyrefly]``,
``[tool.ty]``), so the suite checks what a developer's plain run checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKERS = ("mypy", "pyright", "basedpyright", "pyrefly", "ty")
PYRIGHT_CONFIG = REPO / "pyrightconfig.json"
PYPROJECT = REPO / "pyproject.toml"
# One mypy cache (and one directory of stripped corpus copies) per environment: each
# venv has its own jax, and mypy replays a cached module's errors under the path it
# was cached with, so the copies keep fixed paths.
ENV_TAG = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
WORK = REPO / ".mypy_cache" / f"typing-{ENV_TAG}"


def stubs_root() -> Path:
    """safedma's typed pltpu stubs: inside the package once shipped, else the old top-level tree."""
    shipped = REPO / "safedma" / "stubs"
    return shipped if shipped.is_dir() else REPO / "stubs"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One finding of one checker, in one shape for all five."""

    checker: str
    path: Path
    line: int  # 1-based
    code: str | None  # mypy error code, pyright/basedpyright rule, pyrefly or ty rule name
    severity: str  # "error", "warning", "note"/"information"
    message: str

    def render(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        first = self.message.splitlines()[0] if self.message else ""
        return f"{self.checker}: {where}:{self.line}: {self.severity}: {first} [{self.code}]"


@dataclasses.dataclass(frozen=True)
class Run:
    checker: str
    command: tuple[str, ...]
    returncode: int
    diagnostics: tuple[Diagnostic, ...]
    stderr: str
    seconds: float

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def for_path(self, path: Path, *, errors_only: bool = True) -> list[Diagnostic]:
        found = self.errors if errors_only else list(self.diagnostics)
        return [d for d in found if d.path == path.resolve()]

    def under(self, directory: Path, *, errors_only: bool = True) -> list[Diagnostic]:
        root = directory.resolve()
        found = self.errors if errors_only else list(self.diagnostics)
        return [d for d in found if d.path.is_relative_to(root)]


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where a checker finds imports besides this interpreter's site-packages.

    ``roots``: directories imports resolve from (the checkout, so ``import safedma``
    is the code under test). ``stubs``: also hand each checker safedma's pltpu stubs
    the way docs/stubs.md tells a user to. ``mypy_config``: another mypy config file
    (the plugin test adds its one line); ``cache``: mypy's cache directory name.
    """

    roots: tuple[Path, ...] = (REPO,)
    stubs: bool = False
    mypy_config: Path = PYPROJECT
    cache: str = "corpus"


class CheckerMissing(Exception):
    pass


def executable(name: str) -> str:
    """The checker's command in this environment (next to this python), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise CheckerMissing(
            f"{name} is not installed in this environment ({beside} is missing): it is in the "
            "project's dev dependency group (`./dev setup`, or `uv sync` / `pip install --group dev`)"
        )
    return found


def _resolve(path: str, cwd: Path) -> Path:
    p = Path(path)
    return (p if p.is_absolute() else cwd / p).resolve()


# --- mypy --------------------------------------------------------------------------------


def _mypy(targets: Sequence[Path], setup: Setup, tmp: Path) -> tuple[list[str], dict[str, str]]:
    cache = REPO / ".mypy_cache" / f"{setup.cache}-{ENV_TAG}"
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(setup.mypy_config),
        "--strict",
        "--warn-unused-ignores",
        "--no-error-summary",
        "--output",
        "json",
        "--cache-dir",
        str(cache),
        # Given relative to the repo: mypy names cached modules by the path it saw.
        *(str(t.relative_to(REPO)) if t.is_relative_to(REPO) else str(t) for t in targets),
    ]
    # mypy reads partial stub packages (jax-stubs) only from PYTHONPATH or site-packages.
    paths = ([stubs_root() / "mypy"] if setup.stubs else []) + list(setup.roots)
    return command, {"PYTHONPATH": os.pathsep.join(str(p) for p in paths)}


def _parse_mypy(stdout: str, cwd: Path) -> list[Diagnostic]:
    found = []
    for raw in stdout.splitlines():
        if not raw.strip():
            continue
        item = json.loads(raw)
        message = item["message"] + (f"\n{item['hint']}" if item.get("hint") else "")
        found.append(
            Diagnostic(
                "mypy",
                _resolve(item["file"], cwd),
                int(item["line"]),
                item.get("code"),
                item["severity"],
                message,
            )
        )
    return found


# --- pyright and basedpyright -----------------------------------------------------------


def pyright_settings() -> dict[str, object]:
    """pyrightconfig.json (JSON with // comments), as pyright reads it."""
    lines = PYRIGHT_CONFIG.read_text().splitlines()
    loaded: dict[str, object] = json.loads("\n".join(re.sub(r"^\s*//.*$", "", ln) for ln in lines))
    return loaded


def _pyright(
    name: str, targets: Sequence[Path], setup: Setup, tmp: Path
) -> tuple[list[str], dict[str, str]]:
    # The project's settings, with the import roots (and stubPath) of this set-up.
    settings = {k: v for k, v in pyright_settings().items() if k not in ("include", "exclude")}
    settings["extraPaths"] = [str(p) for p in setup.roots]
    if setup.stubs:
        settings["stubPath"] = str(stubs_root() / "pyright")
    config = tmp / "pyrightconfig.json"
    config.write_text(json.dumps(settings, indent=2))
    command = [
        executable(name),
        "--outputjson",
        "-p",
        str(config),
        "--pythonpath",
        sys.executable,
        *(str(t) for t in targets),
    ]
    return command, {}


def _parse_pyright(name: str, stdout: str, cwd: Path) -> list[Diagnostic]:
    report = json.loads(stdout)
    return [
        Diagnostic(
            name,
            _resolve(item["file"], cwd),
            int(item["range"]["start"]["line"]) + 1,
            item.get("rule"),
            str(item["severity"]),
            str(item["message"]).replace("\xa0", " "),  # continuation lines are indented with nbsp
        )
        for item in report["generalDiagnostics"]
    ]


# --- pyrefly ---------------------------------------------------------------------------


def _site_packages() -> list[str]:
    return [p for p in sys.path if p.endswith("site-packages")]


def _pyrefly(targets: Sequence[Path], setup: Setup, tmp: Path) -> tuple[list[str], dict[str, str]]:
    command = [
        executable("pyrefly"),
        "check",
        "-c",
        str(PYPROJECT),
        "--output-format",
        "json",
        "--python-interpreter-path",
        sys.executable,
    ]
    for root in setup.roots:
        command += ["--search-path", str(root)]
    if setup.stubs:
        # On the search path pyrefly takes a partial jax-stubs tree as all of jax; as site
        # packages, ahead of the interpreter's own, it reads it as partial.
        for path in [str(stubs_root() / "mypy"), *_site_packages()]:
            command += ["--site-packages-path", path]
    return [*command, *(str(t) for t in targets)], {}


def _parse_pyrefly(stdout: str, cwd: Path) -> list[Diagnostic]:
    report = json.loads(stdout)
    return [
        Diagnostic(
            "pyrefly",
            _resolve(item["path"], cwd),
            int(item["line"]),
            item["name"],
            item["severity"],
            item["description"],
        )
        for item in report["errors"]
    ]


# --- ty --------------------------------------------------------------------------------


def _ty(targets: Sequence[Path], setup: Setup, tmp: Path) -> tuple[list[str], dict[str, str]]:
    command = [
        executable("ty"),
        "check",
        "--project",
        str(REPO),
        "--python",
        sys.prefix,
        "--output-format",
        "gitlab",
        "--no-progress",
        "--exit-zero",
    ]
    paths = ([stubs_root() / "pyright"] if setup.stubs else []) + list(setup.roots)
    for path in paths:
        command += ["--extra-search-path", str(path)]
    return [*command, *(str(t) for t in targets)], {}


_SEVERITY_TY = {
    "info": "note",
    "minor": "warning",
    "major": "error",
    "critical": "error",
    "blocker": "error",
}


def _parse_ty(stdout: str, cwd: Path) -> list[Diagnostic]:
    found = []
    for item in json.loads(stdout):
        code = item["check_name"]
        message = item["description"].removeprefix(f"{code}: ")
        line = int(item["location"]["positions"]["begin"]["line"])
        found.append(
            Diagnostic(
                "ty",
                _resolve(item["location"]["path"], cwd),
                line,
                code,
                _SEVERITY_TY.get(item["severity"], item["severity"]),
                message,
            )
        )
    return found


# --- the one entry point -----------------------------------------------------------------


def run(checker: str, targets: Iterable[Path], setup: Setup = Setup()) -> Run:
    """Run ``checker`` over ``targets`` (files or directories) from the repository root."""
    targets = [Path(t).resolve() for t in targets]
    with tempfile.TemporaryDirectory(prefix=f"safedma-{checker}-") as tmp_name:
        tmp = Path(tmp_name)
        if checker == "mypy":
            command, env = _mypy(targets, setup, tmp)
        elif checker in ("pyright", "basedpyright"):
            command, env = _pyright(checker, targets, setup, tmp)
        elif checker == "pyrefly":
            command, env = _pyrefly(targets, setup, tmp)
        elif checker == "ty":
            command, env = _ty(targets, setup, tmp)
        else:
            raise ValueError(f"unknown checker {checker!r}; one of {CHECKERS}")
        start = time.perf_counter()
        proc = subprocess.run(
            command,
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(
            f"{checker} failed (exit {proc.returncode}): {' '.join(command)}\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    try:
        if checker == "mypy":
            diagnostics = _parse_mypy(proc.stdout, REPO)
        elif checker in ("pyright", "basedpyright"):
            diagnostics = _parse_pyright(checker, proc.stdout, REPO)
        elif checker == "pyrefly":
            diagnostics = _parse_pyrefly(proc.stdout, REPO)
        else:
            diagnostics = _parse_ty(proc.stdout, REPO)
    except (ValueError, KeyError) as exc:
        raise RuntimeError(
            f"{checker}: output not understood ({exc}):\n{proc.stdout[-4000:]}"
        ) from exc
    return Run(checker, tuple(command), proc.returncode, tuple(diagnostics), proc.stderr, seconds)


# --- expectations against findings -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Mismatch:
    line: int
    expected: frozenset[str]
    found: frozenset[str]

    def render(self) -> str:
        missing, extra = sorted(self.expected - self.found), sorted(self.found - self.expected)
        parts = ([f"expected {missing} not reported"] if missing else []) + (
            [f"unexpected {extra}"] if extra else []
        )
        return f"line {self.line}: " + "; ".join(parts)


def compare(expected: Mapping[int, frozenset[str]], found: Sequence[Diagnostic]) -> list[Mismatch]:
    """Lines where the set of codes reported differs from the set expected (both exact)."""
    got: dict[int, set[str]] = {}
    for d in found:
        got.setdefault(d.line, set()).add(d.code or "<no code>")
    lines = sorted(set(expected) | set(got))
    mismatches = []
    for line in lines:
        want, have = expected.get(line, frozenset()), frozenset(got.get(line, set()))
        if want != have:
            mismatches.append(Mismatch(line, want, have))
    return mismatches


def strip_copy(files: Sequence[Path], base: Path, into: Path) -> dict[Path, Path]:
    """Copies of ``files`` (paths relative to ``base`` kept) under ``into``, expectations removed.

    Returns ``{copy: original}``. Files whose stripped text is unchanged are not rewritten,
    so mypy's cache stays valid across sessions.
    """
    from _comments import strip_expectations

    mapping = {}
    for original in files:
        copy = into / original.relative_to(base)
        copy.parent.mkdir(parents=True, exist_ok=True)
        text = strip_expectations(original.read_text())
        if not copy.exists() or copy.read_text() != text:
            # Written whole, then renamed: another xdist worker may be reading the copy
            # (for another checker) while this one writes it.
            partial = copy.with_name(f".{copy.name}.{os.getpid()}.tmp")
            partial.write_text(text)
            os.replace(partial, copy)
        mapping[copy.resolve()] = original
    return mapping
