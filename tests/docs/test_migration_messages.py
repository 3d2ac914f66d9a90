"""The checker messages quoted in docs/migration.md are the ones the checkers print.

The guide's "After" snippets, laid out as the file ``kernels.py`` it describes
(eight lines of imports, then each snippet, two blank lines apart), are checked
with mypy ``--strict`` (with safedma's plugin, whose messages are added next to
mypy's own) and with pyright strict. Every ``kernels.py:N: error: ...`` line the
guide quotes must be printed at that line, and every pyright sentence it quotes
must be the start of one of pyright's messages: a guide that drifts from the
library fails here instead of misleading a reader.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "migration.md"
HEADER = (
    "from __future__ import annotations\n"
    "\n"
    "from jax.experimental import pallas as pl\n"
    "\n"
    "import safedma as sd\n"
    "from safedma import DataRef, RegularSem, SemArray, SemRef\n"
    "\n"
    "\n"
)

pytestmark = pytest.mark.slow  # two type-checker runs, about 15 s


def _guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def _kernels_file(tmp_path: Path) -> Path:
    snippets = re.findall(r"```python\n(def s\d.*?)```", _guide(), re.S)
    assert len(snippets) >= 9, "the guide's After snippets were not found"
    path = tmp_path / "kernels.py"
    path.write_text(HEADER + "\n\n".join(s.rstrip("\n") + "\n" for s in snippets))
    return path


def _mypy(tmp_path: Path, plugin: bool) -> set[str]:
    config = tmp_path / f"mypy{'-plugin' if plugin else ''}.ini"
    config.write_text(
        "[mypy]\nstrict = True\nuntyped_calls_exclude = jax\n"
        + ("plugins = safedma.mypy_plugin\n" if plugin else "")
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--no-incremental",
            "--no-error-summary",
            "--show-error-codes",
            "--no-pretty",
            "kernels.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "error:" in run.stdout, run.stdout + run.stderr
    return set(run.stdout.splitlines())


def test_quoted_mypy_messages_are_printed_at_their_lines(tmp_path: Path) -> None:
    """Each quoted line comes from mypy alone or from mypy with the plugin, as the guide says."""
    _kernels_file(tmp_path)
    printed = _mypy(tmp_path, plugin=False) | _mypy(tmp_path, plugin=True)
    quoted = re.findall(r"^(kernels\.py:\d+: error: .*)$", _guide(), re.M)
    assert len(quoted) >= 10
    missing = [line for line in quoted if line not in printed]
    assert not missing, (
        "docs/migration.md quotes mypy lines it does not print; mypy printed:\n"
        + "\n".join(sorted(printed))
        + "\nmissing:\n"
        + "\n".join(missing)
    )


def test_quoted_pyright_messages_are_printed(tmp_path: Path) -> None:
    _kernels_file(tmp_path)
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"})
    )
    pyright = Path(sys.executable).parent / "pyright"
    if not pyright.exists():
        pytest.skip("pyright is not installed in this environment")
    run = subprocess.run(
        [str(pyright), "--outputjson", "--pythonpath", sys.executable, "kernels.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    messages = [d["message"] for d in json.loads(run.stdout)["generalDiagnostics"]]
    quoted = re.findall(r"^pyright: `([^`]+)`", _guide(), re.M)
    quoted += re.findall(r"\. pyright: `([^`]+)`", _guide())
    assert len(quoted) >= 5
    missing = [q for q in quoted if not any(m.startswith(q) for m in messages)]
    assert not missing, f"quoted but not printed by pyright: {missing}\nprinted: {messages}"
