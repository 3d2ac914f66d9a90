"""nox sessions for safedma, on uv: the same environments and commands as ./dev.

    uvx nox                  tests on Python 3.11 (jax 0.10.2) and 3.12 (jax 0.12.x), then lint
    uvx nox -s fast          the fast lane (-m "not slow") on Python 3.12
    uvx nox -s lint          ruff check + ruff format --check

Each session's virtualenv is synced with uv.lock (`uv sync --locked`), so it holds
exactly what ./dev's .venv/py311 and .venv/py312 hold: the jax of its Python version
(pyproject.toml's jax-matrix group) and the dev tools. ./dev is the entry point the
README and CI use; this file is for developers who drive projects with nox.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]


def _sync(session: nox.Session) -> None:
    session.run_install(
        "uv",
        "sync",
        "--locked",
        "--quiet",
        f"--python={session.virtualenv.location}",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


@nox.session(python=["3.11", "3.12"])
def tests(session: nox.Session) -> None:
    """The whole suite; jax 0.10.2 on 3.11, the locked 0.12.x on 3.12."""
    _sync(session)
    session.run("pytest", *session.posargs, env={"JAX_PLATFORMS": "cpu"})


@nox.session(python="3.12")
def fast(session: nox.Session) -> None:
    """The fast lane: everything not marked slow (tests/support/fast_lane.py)."""
    _sync(session)
    session.run("pytest", "-m", "not slow", *session.posargs, env={"JAX_PLATFORMS": "cpu"})


@nox.session(python="3.12")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check, with the locked ruff."""
    _sync(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
