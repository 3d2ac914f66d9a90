"""The README's first kernel is clean under the mypy set-up the README gives."""

from __future__ import annotations

import os
import re
from pathlib import Path
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _block(after_heading: str, language: str) -> str:
    section = README.split(after_heading, 1)[1]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"no {language} block after {after_heading!r}"
    return match.group(1)


def test_first_kernel_is_clean_under_mypy_strict(tmp_path: Path) -> None:
    kernel = _block("## A kernel", "python")
    assert "def per_device(block: jax.Array) -> jax.Array:" in kernel
    (tmp_path / "kernel.py").write_text(kernel)
    config = _block("## Type checking your kernels", "toml")
    assert config.startswith("[tool.mypy]")
    (tmp_path / "pyproject.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run_python(
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "kernel.py",
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_install_section_installs_from_a_checkout() -> None:
    """Until safedma is on a package index, the install commands work from a checkout."""
    install = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "pip install . " in install and "pip install '.[tpu]'" in install
    assert "editable_mode=compat" in install
    assert "pip install safedma" not in README
