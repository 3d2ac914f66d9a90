"""``python -m safedma.stubs``: the directory and the config line for each checker.

That the lines make each checker use the stubs is tested on an installed wheel
(test_wheel_install.py); here: what is printed, where it points, and the docs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from safedma import stubs
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "stubs.md"
STUBBED = (
    "experimental/pallas/__init__.pyi",
    "experimental/pallas/tpu.pyi",
    "experimental/pallas/tpu_sc.pyi",
)


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return run_python("-m", "safedma.stubs", *args, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize("checker", stubs.CHECKERS)
def test_prints_the_directory_as_its_last_line(checker: stubs.Checker) -> None:
    result = _run(checker)
    assert result.returncode == 0, result.stderr
    directory = Path(result.stdout.splitlines()[-1])
    assert directory == stubs.directory(checker) and directory.is_absolute()
    package = directory / ("jax-stubs" if checker == "mypy" else "jax")
    for rel in STUBBED:
        assert (package / rel).is_file()
    if checker == "mypy":
        assert (package / "py.typed").read_text() == "partial\n"
    else:  # a partial jax-stubs on these checkers' paths hides jax's own .pyi files
        assert not list(directory.rglob("*-stubs")) and not (package / "__init__.pyi").exists()


def test_both_trees_serve_one_source() -> None:
    """In the checkout the mypy tree's stubs are symlinks to the pyright tree's (one source)."""
    for rel in STUBBED:
        mypy_entry = stubs.directory("mypy") / "jax-stubs" / rel
        source = stubs.directory("pyright") / "jax" / rel
        assert mypy_entry.is_symlink() and mypy_entry.resolve() == source.resolve(), rel
        assert mypy_entry.read_bytes() == source.read_bytes()


@pytest.mark.parametrize(
    ("checker", "line"),
    [
        ("mypy", "PYTHONPATH=safedma/stubs/mypy"),
        ("pyright", 'stubPath = "safedma/stubs/pyright"'),
        ("basedpyright", 'stubPath = "safedma/stubs/pyright"'),
        ("pyrefly", 'search-path = ["safedma/stubs/pyright"]'),
        ("ty", 'extra-paths = ["safedma/stubs/pyright"]'),
    ],
)
def test_config_line_relative_inside_the_project(checker: str, line: str) -> None:
    result = _run(checker, "--config")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [line]
    assert result.stderr.startswith("# "), "where the line goes is said on stderr"


def test_config_line_absolute_outside_the_project(tmp_path: Path) -> None:
    result = _run("pyright", "--config", cwd=tmp_path)
    assert result.stdout.strip() == f'stubPath = "{stubs.directory("pyright").as_posix()}"'


def test_unknown_checker_is_refused() -> None:
    result = _run("pytype")
    assert result.returncode == 2 and "invalid choice" in result.stderr
    with pytest.raises(ValueError, match="unknown checker"):
        stubs.directory("pytype")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize("checker", stubs.CHECKERS)
def test_docs_give_each_checkers_line(checker: stubs.Checker) -> None:
    """docs/stubs.md shows the line for all five, as the command prints it for a
    project whose virtual environment is .venv (Python 3.12)."""
    package = stubs.directory(checker).parents[1].as_posix()  # .../safedma
    expected = stubs.config_line(checker).replace(
        package, ".venv/lib/python3.12/site-packages/safedma"
    )
    assert expected in DOCS.read_text(), f"{DOCS.name} lacks {expected!r}"
