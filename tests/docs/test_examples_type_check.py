"""The manual's examples pass mypy --strict and pyright strict under the configuration it shows.

Getting started shows one ``pyproject.toml`` block for both checkers (marked
``<!-- type-check-config -->``; the README shows the same block). It is read from the page, and both checkers run with
exactly those settings over ``examples/``, the files whose code the manual shows inline
(tests/docs/test_inline_examples.py keeps the two equal). A setting dropped from the
page, an example that stops type-checking, or a jax release that leaves another
function unannotated fails here. The only additions are how this checkout is found:
the repository on the import path, and mypy's ``--explicit-package-bases`` because
``examples/`` is a namespace package here rather than the user's own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "getting-started.md"
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
CONFIG = re.compile(r"^<!-- type-check-config -->\n```toml\n(?P<toml>.*?)^```", re.M | re.S)

pytestmark = pytest.mark.slow  # two type checkers over every example: about 30 s cold


def _config() -> dict[str, dict[str, object]]:
    found = CONFIG.findall(PAGE.read_text(encoding="utf-8"))
    assert len(found) == 1, "getting-started.md has no single <!-- type-check-config --> block"
    tool: dict[str, dict[str, object]] = tomllib.loads(found[0])["tool"]
    return tool


def _checker(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    assert beside.exists(), f"{name} is not installed next to {sys.executable} (./dev setup)"
    return str(beside)


def test_the_readme_shows_the_same_settings() -> None:
    readme = CONFIG.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert readme == CONFIG.findall(PAGE.read_text(encoding="utf-8")), (
        "README.md's <!-- type-check-config --> block differs from getting-started.md's"
    )


def test_the_manual_shows_strict_settings_for_both_checkers() -> None:
    tool = _config()
    assert tool["mypy"].get("strict") is True, tool["mypy"]
    assert tool["pyright"].get("typeCheckingMode") == "strict", tool["pyright"]


def test_the_examples_pass_mypy_strict_with_the_manuals_settings(tmp_path: Path) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text(CONFIG.findall(PAGE.read_text(encoding="utf-8"))[0])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--explicit-package-bases",
            "--cache-dir",
            str(REPO / ".mypy_cache" / "manual-examples"),
            *(str(p.relative_to(REPO)) for p in EXAMPLES),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_examples_pass_pyright_strict_with_the_manuals_settings(tmp_path: Path) -> None:
    settings = {**_config()["pyright"], "extraPaths": [str(REPO)]}
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps(settings))
    result = subprocess.run(
        [
            _checker("pyright"),
            "--outputjson",
            "-p",
            str(config),
            "--pythonpath",
            sys.executable,
            *(str(p) for p in EXAMPLES),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(result.stdout)
    found = [
        f"{Path(d['file']).name}:{d['range']['start']['line'] + 1}: {d['message']} ({d.get('rule')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert not found, "\n".join(found)
    assert report["summary"]["filesAnalyzed"] >= len(EXAMPLES), report["summary"]
