"""safedma's pltpu stubs on the real packages' DMA code, unmodified: no error of their own.

Every file of the pinned packages (tests/field/_packages.py) that makes a DMA or touches a
semaphore is type-checked as it ships, by mypy and by pyright, once with the stubs set up
the way docs/stubs.md tells a user and once without them. An error reported only with the
stubs is one the stubs caused; on correct code that is a false alarm, so there must be
none. Errors that both runs report (vllm is not installed, jax's own partial typing, the
packages' own typing) are the packages', not the stubs'.

The comparison is checked to be able to fail: a probe file with one raw-pltpu mistake the
stubs catch (a semaphore's value passed as the semaphore) goes into both runs, and its line
must be the one error attributed to the stubs there.

Runs in the field lane (``./dev field``, which installs the packages); mypy and pyright
each check about 70 files twice (minutes on a small machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from tests.field import _packages

pytestmark = [
    pytest.mark.slow,
    # One worker runs all four tests, so each checker's two runs are made once.
    pytest.mark.xdist_group("field-stubs-typecheck"),
    pytest.mark.skipif(
        os.environ.get("SAFEDMA_FIELD") != "1",
        reason="the field lane (./dev field) installs the packages this checks",
    ),
]

REPO = Path(__file__).resolve().parents[2]
STUBS = REPO / "safedma" / "stubs"
# A file is checked when it makes a DMA or uses a semaphore (jax's pltpu or pl API).
DMA_CODE = re.compile(
    r"make_async_copy|make_async_remote_copy|async_copy\(|async_remote_copy\(|"
    r"semaphore_(signal|wait|read)|get_barrier_semaphore|SemaphoreType"
)
PROBE = '''"""Probe: one raw-pltpu mistake the stubs catch, in code typed the way kernels are."""

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def probe_kernel(x_ref: jax.Array, o_ref: jax.Array, sem: jax.Ref) -> None:
    value = pl.semaphore_read(sem)
    pltpu.make_async_copy(x_ref, o_ref, value).start()  # the probe's line
'''
PROBE_LINE = 10


@dataclasses.dataclass(frozen=True)
class Finding:
    checker: str
    path: Path
    line: int
    code: str
    message: str

    @property
    def key(self) -> tuple[Path, int, str]:
        return (self.path, self.line, self.code)

    def render(self) -> str:
        text = self.path.read_text().splitlines()[self.line - 1].strip()
        return f"{self.checker} {self.path}:{self.line} [{self.code}] {self.message} | {text}"


def _dma_files(folder: Path, top_level: str) -> list[Path]:
    return sorted(
        path
        for path in (folder / top_level).rglob("*.py")
        if DMA_CODE.search(path.read_text(errors="replace"))
    )


_MYPY_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): error: (?P<msg>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)


def run_mypy(
    files: Sequence[Path], roots: Sequence[Path], cache: Path, *, stubs: bool
) -> list[Finding]:
    """mypy as a user runs it on existing kernels: default strictness, bodies checked."""
    paths = ([str(STUBS / "mypy"), str(REPO)] if stubs else []) + [str(r) for r in roots]
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "mypy", "--check-untyped-defs", "--follow-imports=silent",
        "--ignore-missing-imports", "--no-error-summary", "--show-error-codes", "--no-pretty",
        "--no-color-output", "--show-absolute-path", "--cache-dir", str(cache),
        *(str(f) for f in files),
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=cache,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"mypy failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    found = []
    for raw in done.stdout.splitlines():
        match = _MYPY_LINE.match(raw)
        if match is not None:
            found.append(
                Finding(
                    "mypy",
                    Path(match["path"]).resolve(),
                    int(match["line"]),
                    match["code"] or "",
                    match["msg"],
                )
            )
    return found


def run_pyright(
    files: Sequence[Path], roots: Sequence[Path], work: Path, *, stubs: bool
) -> list[Finding]:
    """pyright in its default (standard) mode; the stubs on ``stubPath`` or an empty one."""
    work.mkdir(parents=True, exist_ok=True)
    config = {
        "typeCheckingMode": "standard",
        "extraPaths": [str(r) for r in roots] + ([str(REPO)] if stubs else []),
        "stubPath": str(STUBS / "pyright") if stubs else str(work / "no-stubs"),
    }
    (work / "pyrightconfig.json").write_text(json.dumps(config))
    beside = Path(sys.executable).with_name("pyright")
    command = [
        str(beside) if beside.exists() else "pyright",
        "-p", str(work), "--pythonpath", sys.executable, "--outputjson",
        *(str(f) for f in files),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"pyright failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return [
        Finding(
            "pyright",
            Path(d["file"]).resolve(),
            int(d["range"]["start"]["line"]) + 1,
            d.get("rule") or "",
            d["message"].replace("\xa0", " ").splitlines()[0],
        )
        for d in json.loads(done.stdout)["generalDiagnostics"]
        if d["severity"] == "error"
    ]


def added_by_stubs(with_stubs: Iterable[Finding], without: Iterable[Finding]) -> list[Finding]:
    """Errors on a (file, line, code) that the run without the stubs does not report."""
    theirs = {f.key for f in without}
    return [f for f in with_stubs if f.key not in theirs]


@dataclasses.dataclass(frozen=True)
class Runs:
    checker: str
    files: tuple[Path, ...]
    probe: Path
    with_stubs: tuple[Finding, ...]
    without: tuple[Finding, ...]
    seconds: float


@pytest.fixture(scope="module")
def field_files() -> tuple[list[Path], list[Path]]:
    roots, files = [], []
    for package in _packages.PACKAGES:
        folder = _packages.ensure_installed(package)
        roots.append(folder)
        found = _dma_files(folder, package.top_level)
        assert found, f"no file with DMA code in {package.pin}"
        files += found
    return roots, files


@pytest.fixture(scope="module", params=["mypy", "pyright"])
def runs(
    request: pytest.FixtureRequest,
    field_files: tuple[list[Path], list[Path]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Runs:
    checker: str = request.param
    roots, files = field_files
    work = tmp_path_factory.mktemp(f"stubs-field-{checker}")
    # One mypy cache per set-up (kept between runs): jax is analysed once for each. mypy
    # caches a module by name, so the probe keeps one path from run to run: in a fresh
    # temporary folder each time, a run would report it at the last run's path.
    cache_root = REPO / ".mypy_cache" / "field-stubs"
    probe_dir = cache_root / "probe" if checker == "mypy" else work
    probe_dir.mkdir(parents=True, exist_ok=True)
    probe = probe_dir / "probe_stub_mistake.py"
    probe.write_text(PROBE)
    targets = [*files, probe]
    start = time.perf_counter()
    if checker == "mypy":
        with_stubs = run_mypy(targets, roots, cache_root / "with", stubs=True)
        without = run_mypy(targets, roots, cache_root / "without", stubs=False)
    else:
        with_stubs = run_pyright(targets, roots, work / "with", stubs=True)
        without = run_pyright(targets, roots, work / "without", stubs=False)
    seconds = time.perf_counter() - start
    print(
        f"\n{checker}: {len(files)} files, with and without the stubs, in {seconds:.0f} s: "
        f"{len(with_stubs)} and {len(without)} errors"
    )
    return Runs(checker, tuple(files), probe.resolve(), tuple(with_stubs), tuple(without), seconds)


def test_the_comparison_finds_the_probes_mistake(runs: Runs) -> None:
    """Without this the next test could pass by comparing nothing."""
    added = added_by_stubs(runs.with_stubs, runs.without)
    on_probe = [f for f in added if f.path == runs.probe]
    assert [f.line for f in on_probe] == [PROBE_LINE], "\n".join(f.render() for f in on_probe)


def test_no_error_of_the_stubs_on_the_unmodified_dma_files(runs: Runs) -> None:
    added = [f for f in added_by_stubs(runs.with_stubs, runs.without) if f.path != runs.probe]
    checked = {f.resolve() for f in runs.files}
    assert all(f.path in checked for f in added), [f.render() for f in added]
    assert not added, (
        f"{runs.checker}: errors only with safedma's stubs on correct code (false alarms):\n"
        + "\n".join(f.render() for f in added)
    )
