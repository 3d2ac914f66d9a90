"""``pip install safedma`` resolves where no libtpu wheel exists: macOS arm64, Windows,
Linux aarch64 (pip's --dry-run against the index, for Python 3.12).

Linux aarch64 is given as manylinux_2_27 (jaxlib's own floor: since 0.10 its
Linux wheels need glibc 2.27, so with manylinux2014 alone plain ``jax`` does not
resolve either) and manylinux2014.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging._source import copy_source

pytestmark = pytest.mark.slow

PLATFORMS = {
    "macos-arm64": ["macosx_14_0_arm64"],
    "windows-amd64": ["win_amd64"],
    "linux-aarch64": ["manylinux_2_27_aarch64", "manylinux2014_aarch64"],
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = copy_source(out / "source")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}\n{result.stderr}"
    (built,) = out.glob("safedma-*.whl")
    return built


@pytest.mark.parametrize("platform", PLATFORMS, ids=list(PLATFORMS))
def test_resolves_without_libtpu(wheel: Path, platform: str, tmp_path: Path) -> None:
    tags = [arg for tag in PLATFORMS[platform] for arg in ("--platform", tag)]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--only-binary=:all:",
            *tags,
            "--python-version",
            "3.12",
            "--target",
            str(tmp_path / "target"),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (would,) = [line for line in result.stdout.splitlines() if line.startswith("Would install")]
    packages = would.split()[2:]
    assert any(p.startswith("jax-0.") for p in packages) and any(
        p.startswith("jaxlib-") for p in packages
    )
    assert not [p for p in packages if p.startswith("libtpu")]
