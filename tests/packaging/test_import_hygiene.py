"""Importing safedma changes nothing, and its typing parts never import jax.

Each check runs in a fresh interpreter: an earlier import in the test process
would hide what the module itself does.
"""

from __future__ import annotations

import json
import os
import pkgutil
from pathlib import Path

import pytest

import safedma
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]

# Run by mypy, by type checkers' helpers and by pytest before jax is configured:
# none of them may pull jax in.
JAX_FREE = [
    "safedma",
    "safedma._messages",
    "safedma.mypy_plugin",
    "safedma.stubs",
    "safedma.pytest_plugin",
    "safedma._version",
    "safedma.gpu",
]


def _public_modules() -> list[str]:
    names = ["safedma"]
    for info in pkgutil.walk_packages(safedma.__path__, "safedma."):
        parts = info.name.split(".")
        if not any(p.startswith("_") for p in parts[1:]):
            names.append(info.name)
    return names


def _run(code: str, env: dict[str, str] | None = None) -> str:
    result = run_python("-c", code, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_public_modules_are_found() -> None:
    found = _public_modules()
    for expected in (
        "safedma.testing",
        "safedma.kernels",
        "safedma.mypy_plugin",
        "safedma.stubs",
        "safedma.pytest_plugin",
    ):
        assert expected in found
    assert not [m for m in found if m.endswith("demo")], "the demo lives in examples/"


@pytest.mark.parametrize("module", JAX_FREE)
def test_typing_parts_import_no_jax(module: str) -> None:
    out = _run(f"import sys, {module}; print('jax' in sys.modules)", _env())
    assert out.strip() == "False", f"import {module} imported jax"


def test_stubs_command_imports_no_jax() -> None:
    code = (
        "import runpy, sys; sys.argv = ['x', 'pyright']; "
        "runpy.run_module('safedma.stubs', run_name='__main__', alter_sys=True)"
    )
    result = run_python("-X", "importtime", "-c", code, env=_env())
    assert result.returncode == 0, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "jax" not in imported


_SNAPSHOT = """
import json, os, sys
import jax
def snapshot():
    config = {k: repr(v) for k, v in jax.config.values.items()}
    return {"env": dict(os.environ), "config": config}
before = snapshot()
import importlib
importlib.import_module(sys.argv[1])
after = snapshot()
changed_env = sorted(k for k in set(before["env"]) | set(after["env"])
                     if before["env"].get(k) != after["env"].get(k))
changed_config = sorted(k for k in set(before["config"]) | set(after["config"])
                        if before["config"].get(k) != after["config"].get(k))
print(json.dumps({"env": changed_env, "config": changed_config}))
"""


@pytest.mark.parametrize("module", _public_modules())
def test_import_changes_no_environment_variable_and_no_jax_config(module: str) -> None:
    result = run_python("-c", _SNAPSHOT, module, env=_env())
    assert result.returncode == 0, result.stderr
    changed = json.loads(result.stdout.strip().splitlines()[-1])
    assert changed == {"env": [], "config": []}, f"import {module} changed {changed}"


def test_snapshot_sees_a_change() -> None:
    """The snapshot can fail: a module that sets a variable and a config option is caught."""
    code = _SNAPSHOT.replace(
        "importlib.import_module(sys.argv[1])",
        "os.environ['XLA_FLAGS'] = 'x'; jax.config.update('jax_enable_x64', True)",
    )
    out = _run(code, _env())
    assert json.loads(out.strip().splitlines()[-1]) == {
        "env": ["XLA_FLAGS"],
        "config": ["jax_enable_x64"],
    }
