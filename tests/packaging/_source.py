"""A still copy of the checkout to build from.

Other workers of the same test run write into the checkout while a build walks it
(mypy caches, ``__pycache__``, pytest's cache), and a file that vanishes under the
build backend's walk fails the build. Building from a copy without those folders
makes the build see one fixed tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

VOLATILE = (
    ".git",
    ".venv",
    "build",
    "dist",
    "site",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
)


def copy_source(destination: Path) -> Path:
    """Copy the checkout, minus what tests and tools write into it, to ``destination``."""
    shutil.copytree(
        REPO,
        destination,
        symlinks=True,  # as a git checkout has them: the mypy stub tree links to the pyright one
        ignore=shutil.ignore_patterns(*VOLATILE),
    )
    return destination
