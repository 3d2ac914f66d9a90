"""Strict stubs for raw ``jax.experimental.pallas.tpu`` code, shipped inside safedma.

They give kernels written against pltpu directly (annotated with safedma's
brands) safedma's static checks before any migration; docs/stubs.md explains
what they check. The two ``.pyi`` files are served under two names (one
source: the ``mypy`` tree's entries are symlinks to the ``pyright`` tree's in the
repository, real copies in the wheel), because the checkers look for stubs in
two incompatible ways:

* ``pyright/jax/...``: a plain ``jax`` tree with no ``jax/__init__.pyi``, for
  pyright and basedpyright (``stubPath``), pyrefly (``search-path``) and ty
  (``extra-paths``). Each takes the two stubbed modules from it and the rest of
  jax from the installed jax.
* ``mypy/jax-stubs``: a partial PEP 561 stub package, for mypy, which reads
  partial stub packages only from ``sys.path`` (so: ``PYTHONPATH``). A partial
  ``jax-stubs`` on pyright's path would hide jax's own ``.pyi`` files, so the
  two names cannot be one directory.

``python -m safedma.stubs CHECKER`` prints the directory to hand a checker, or
with ``--config`` the one line of configuration. This package must not import
jax: it only computes paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, get_args

__all__ = ["CHECKERS", "Checker", "config_line", "directory"]

Checker = Literal["mypy", "pyright", "basedpyright", "pyrefly", "ty"]
CHECKERS: Final[tuple[Checker, ...]] = get_args(Checker)

_HERE = Path(__file__).resolve().parent
_TREE = _HERE / "pyright"  # a plain jax/... tree
_PARTIAL_PACKAGE_DIR = _HERE / "mypy"  # holds jax-stubs/ (py.typed: partial)


def directory(checker: Checker) -> Path:
    """The directory to hand ``checker``: ``PYTHONPATH`` for mypy, the stub/search path for the others."""
    if checker not in CHECKERS:
        raise ValueError(f"unknown checker {checker!r}; expected one of {', '.join(CHECKERS)}")
    return _PARTIAL_PACKAGE_DIR if checker == "mypy" else _TREE


def _shown(path: Path, relative_to: Path | None) -> str:
    if relative_to is not None:
        try:
            return path.relative_to(relative_to.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def config_line(checker: Checker, relative_to: Path | None = None) -> str:
    """The one line that enables the stubs for ``checker``.

    Paths are shown relative to ``relative_to`` (the project root, where the
    configuration file lives) when the stubs are inside it, as in a project's
    own ``.venv``; otherwise absolute. For mypy no configuration-file line can do
    it (mypy reads partial stub packages only from ``sys.path``), so the line is
    the environment assignment to put before ``mypy``.
    """
    shown = _shown(directory(checker), relative_to)
    if checker == "mypy":
        return f"PYTHONPATH={shown}"
    if checker in ("pyright", "basedpyright"):
        return f'stubPath = "{shown}"'
    if checker == "pyrefly":
        return f'search-path = ["{shown}"]'
    return f'extra-paths = ["{shown}"]'


# Where each line goes, printed above it.
WHERE: Final[dict[Checker, str]] = {
    "mypy": "before the mypy command only (mypy reads partial stubs from no config-file "
    "setting; exported, it would hide jax's own types from pyright)",
    "pyright": 'pyproject.toml, under [tool.pyright] (pyrightconfig.json: "stubPath": ...)',
    "basedpyright": "pyproject.toml, under [tool.basedpyright]",
    "pyrefly": "pyproject.toml, under [tool.pyrefly] (or pyrefly.toml)",
    "ty": "pyproject.toml, under [tool.ty.environment] (or ty.toml's [environment])",
}
