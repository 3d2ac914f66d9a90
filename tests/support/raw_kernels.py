"""Type-check jax's installed raw-pltpu kernels with safedma's stubs.

At test time the kernel files jax ships (``jax/experimental/pallas/ops/tpu``)
are copied into a temporary directory; every kernel function (a ``def`` whose
name contains "kernel") gets safedma brands on its unannotated parameters,
chosen mechanically from the parameter's name and how the body uses it; then
mypy and pyright check the copies with the stubs, as a user who annotates an
existing kernel would. jax's code is never committed here: it is read from the
installed package each run.

Branding rules (a parameter already annotated, ``*args`` and keyword-only
parameters are left alone):

* semaphores: names ``sem``, ``sems``, ``*_sem``, ``*_sems``, ``*semaphore*``.
  Used as ``p[i]`` -> ``tuple[SemRef, ...]`` (a Python tuple of semaphores in
  ``scratch_shapes``); used as ``p.at[...]`` -> the array brand of the largest
  index count seen (``SemArray``, ``SemArray2``, ``SemArray3``); else ``SemRef``.
* data refs: names ending ``_ref``, ``_hbm``, ``_vmem``, ``_smem``, ``buf``,
  ``bufs``, ``_buffer`` -> ``DataRef``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import jax

REPO = Path(__file__).resolve().parents[2]

_SEM = re.compile(r"^(sems?|.*_sems?|.*semaphores?.*)$")
_DATA = re.compile(r"^(.*_ref|.*_hbm|.*_vmem|.*_smem|bufs?|.*_bufs?|.*_buffer)$")
# A line is a DMA or semaphore line when it names one of these.
DMA_LINE = re.compile(
    r"async_copy|async_remote_copy|semaphore|\bsems?\b|_sems?\b|\.wait\w*\(|\.start\(|"
    r"AsyncCopyDescriptor|SemaphoreType|\bDMA\b"
)
BRAND_NAMES = ("DataRef", "SemRef", "SemArray", "SemArray2", "SemArray3")


def stubs_root() -> Path:
    """The stubs folder: ``safedma/stubs`` once the packaging lane moves it, else ``stubs``."""
    for candidate in (REPO / "safedma" / "stubs", REPO / "stubs"):
        if (candidate / "pyright").is_dir():
            return candidate
    raise FileNotFoundError("no stubs/ folder with a pyright tree")


def jax_kernel_files() -> list[Path]:
    """jax's installed TPU kernel files that contain DMA or semaphore code."""
    root = Path(jax.__file__).parent / "experimental" / "pallas" / "ops" / "tpu"
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if "make_async_copy" in text or "async_remote_copy" in text or "semaphore" in text:
            found.append(path)
    return found


def _uses(fn: ast.FunctionDef, name: str) -> tuple[int, bool]:
    """(largest ``name.at[...]`` index count, whether ``name[...]`` is used)."""
    at_rank, plain = 0, False
    for node in ast.walk(fn):
        if not isinstance(node, ast.Subscript):
            continue
        target = node.value
        count = len(node.slice.elts) if isinstance(node.slice, ast.Tuple) else 1
        if isinstance(target, ast.Name) and target.id == name:
            plain = True
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "at"
            and isinstance(target.value, ast.Name)
            and target.value.id == name
        ):
            at_rank = max(at_rank, count)
    return at_rank, plain


def _brand(fn: ast.FunctionDef, arg: ast.arg, ranks: bool) -> str | None:
    name = arg.arg
    if _SEM.match(name):
        at_rank, plain = _uses(fn, name)
        if plain and not at_rank:
            return "tuple[SemRef, ...]"
        if at_rank:
            if not ranks:  # safedma before N-D brands: one array brand
                return "SemArray"
            return {1: "SemArray", 2: "SemArray2"}.get(at_rank, "SemArray3")
        return "SemRef"
    if _DATA.match(name):
        return "DataRef"
    return None


def _forwarded(
    tree: ast.Module, fn: ast.FunctionDef, name: str, brands: dict[tuple[str, str], str]
) -> str | None:
    """The brand of the kernel parameter that ``fn`` passes its parameter ``name`` to."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        callee = next(
            (d for d in tree.body if isinstance(d, ast.FunctionDef) and d.name == node.func.id),
            None,
        )
        if callee is None:
            continue
        params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
        for i, value in enumerate(node.args):
            if isinstance(value, ast.Name) and value.id == name and i < len(params):
                return brands.get((callee.name, params[i]))
        for keyword in node.keywords:
            if isinstance(keyword.value, ast.Name) and keyword.value.id == name and keyword.arg:
                return brands.get((callee.name, keyword.arg))
    return None


def brand_source(source: str, *, ranks: bool = True) -> tuple[str, int]:
    """``source`` with brands on its kernel functions' parameters, and how many were added.

    A semaphore parameter the body only forwards to another kernel of the file
    gets that kernel's brand for it. ``ranks=False`` brands every semaphore
    array ``SemArray`` (safedma before N-D brands), for the before/after count.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    kernels = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and "kernel" in n.name]
    brands: dict[tuple[str, str], str] = {}
    for node in kernels:
        for arg in [*node.args.posonlyargs, *node.args.args]:
            brand = _brand(node, arg, ranks)
            if brand is not None:
                brands[(node.name, arg.arg)] = brand
    edits: list[tuple[int, int, str]] = []  # (line index, column, text to insert)
    for node in kernels:
        for arg in [*node.args.posonlyargs, *node.args.args]:
            brand = brands.get((node.name, arg.arg))
            if arg.annotation is not None or brand is None:
                continue
            if brand == "SemRef":
                brand = _forwarded(tree, node, arg.arg, brands) or brand
            edits.append((arg.lineno - 1, arg.col_offset + len(arg.arg), f": {brand}"))
    for line, col, text in sorted(edits, reverse=True):
        lines[line] = lines[line][:col] + text + lines[line][col:]
    future_end = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            future_end = stmt.end_lineno or stmt.lineno
    names = BRAND_NAMES if ranks else BRAND_NAMES[:3]
    header = f"from safedma import {', '.join(names)}  # added by tests/support/raw_kernels.py\n"
    lines.insert(future_end, header)
    return "".join(lines), len(edits)


@dataclasses.dataclass(frozen=True)
class Finding:
    checker: str
    file: str
    line: int
    code: str
    message: str
    text: str  # the source line

    @property
    def on_dma_line(self) -> bool:
        return bool(DMA_LINE.search(self.text))

    def render(self) -> str:
        return f"{self.checker} {self.file}:{self.line} [{self.code}] {self.message} | {self.text.strip()}"


def prepare(workdir: Path, *, ranks: bool = True) -> tuple[list[Path], int]:
    """Copy and brand jax's kernel files into ``workdir``; return the copies and the brand count."""
    copies, total = [], 0
    base = Path(jax.__file__).parent / "experimental" / "pallas" / "ops" / "tpu"
    for path in jax_kernel_files():
        target = workdir / path.relative_to(base).as_posix().replace("/", "__")
        text, count = brand_source(path.read_text(), ranks=ranks)
        target.write_text(text)
        copies.append(target)
        total += count
    return copies, total


_MYPY_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): error: (?P<msg>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)


def run_mypy(files: Iterable[Path], workdir: Path, stubs: Path | None) -> list[Finding]:
    """mypy as a user runs it on an existing kernel: default strictness with bodies checked."""
    paths = [str(REPO)] + ([str(stubs / "mypy")] if stubs is not None else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--check-untyped-defs",
        "--no-error-summary",
        "--show-error-codes",
        "--no-pretty",
        "--no-color-output",
        "--follow-imports=silent",
        "--cache-dir",
        str(workdir / ".mypy_cache"),
        *(f.name for f in files),
    ]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"mypy crashed:\n{proc.stdout}\n{proc.stderr}")
    findings = []
    for raw in proc.stdout.splitlines():
        match = _MYPY_LINE.match(raw)
        if match is None:
            continue
        path = workdir / match["path"]
        text = path.read_text().splitlines()[int(match["line"]) - 1]
        findings.append(
            Finding("mypy", path.name, int(match["line"]), match["code"] or "", match["msg"], text)
        )
    return findings


def run_pyright(files: Iterable[Path], workdir: Path, stubs: Path | None) -> list[Finding]:
    """pyright in its default (basic) mode with the stubs on ``stubPath``."""
    config: dict[str, object] = {"extraPaths": [str(REPO)], "typeCheckingMode": "standard"}
    if stubs is not None:
        config["stubPath"] = str(stubs / "pyright")
    else:
        config["stubPath"] = str(workdir / "no-stubs")
    (workdir / "pyrightconfig.json").write_text(json.dumps(config))
    exe = Path(sys.executable).parent / "pyright"
    pyright = str(exe) if exe.exists() else (shutil.which("pyright") or "pyright")
    cmd = [
        pyright,
        "-p",
        str(workdir),
        "--pythonpath",
        sys.executable,
        "--outputjson",
        *(str(f) for f in files),
    ]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, check=False)
    data = json.loads(proc.stdout)
    findings = []
    for d in data["generalDiagnostics"]:
        if d["severity"] != "error":
            continue
        path = Path(d["file"])
        line = d["range"]["start"]["line"] + 1
        text = path.read_text().splitlines()[line - 1]
        findings.append(
            Finding(
                "pyright",
                path.name,
                line,
                d.get("rule") or "",
                d["message"].replace("\xa0", " ").splitlines()[0],
                text,
            )
        )
    return findings
