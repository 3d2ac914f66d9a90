"""The real packages the field lane drives, installed from the package index at test time.

Their code is never copied into this repository: each pinned wheel is installed with
``pip install --no-deps --target`` into a folder of its own under ``.venv/field/`` (kept
between runs, re-made when the pin changes) and put on ``sys.path``. ``--no-deps``
because their declared dependencies (vllm, torch, cloud clients, a jax pin of their
own) are not needed to trace a kernel: :mod:`tests.field._shims` stands in for the
imports that would pull them. jax's own ``ops/tpu`` kernels come with the jax under test.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIELD_DIR = Path(os.environ.get("SAFEDMA_FIELD_DIR", ROOT / ".venv" / "field"))
"""Where the wheels are installed (``SAFEDMA_FIELD_DIR`` moves it)."""

INSTALL_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class Package:
    """One pinned distribution and the top-level import package it provides."""

    distribution: str
    version: str
    top_level: str

    @property
    def pin(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def folder(self) -> Path:
        return FIELD_DIR / f"{self.distribution}-{self.version}"


PACKAGES = (
    Package("tpu-inference", "0.32.0", "tpu_inference"),
    Package("tokamax", "0.0.17", "tokamax"),
)


class FieldInstallError(RuntimeError):
    """A pinned package could not be installed (no network to the package index, ...)."""


def ensure_installed(package: Package) -> Path:
    """The folder holding ``package``, installing it first if it is not there yet."""
    marker = package.folder / ".installed"
    if marker.exists():
        return package.folder
    package.folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-deps", "--no-compile", "--upgrade", "--target", str(package.folder), package.pin,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as err:
        raise FieldInstallError(
            f"installing {package.pin} took over {INSTALL_TIMEOUT_S:.0f} s"
        ) from err
    if done.returncode != 0:
        raise FieldInstallError(
            f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    marker.write_text(package.pin + "\n")
    return package.folder


def put_on_path() -> None:
    """Install every pinned package (once) and make it importable, shims first."""
    from tests.field import _shims

    for package in PACKAGES:
        folder = str(ensure_installed(package))
        if folder not in sys.path:
            sys.path.append(folder)
    _shims.install()
