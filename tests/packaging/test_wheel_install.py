"""safedma as its users get it: build, install the wheel into a fresh venv, use it there.

One module-scoped set-up (slow: a build, a venv, jax and five checkers from
the index; pip's cache keeps reruns quick) and several checks on it:

* the sdist carries no tests, and the wheel built from it has the stubs, the
  licence, the entry point and no symlinks;
* the venv has no libtpu (no ``[tpu]`` extra), and ``compile_for_tpu`` says
  which extra to install;
* ``import safedma`` imports no jax;
* a user's pytest suite, with ``safedma_devices = 4`` and nothing else, gets
  four simulated devices from the plugin's entry point and simulates a kernel;
* mypy, pyright, basedpyright, pyrefly and ty, each configured with the line
  ``python -m safedma.stubs CHECKER --config`` prints, report the seed mistake
  in a raw-pltpu kernel and nothing in correct kernels; without the line the
  mistake goes unseen (so the line is what does it).

Everything runs with the venv's own interpreter, outside the checkout and
without ``PYTHONPATH``, so the checkout's ``safedma`` cannot stand in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packaging._source import copy_source

pytestmark = pytest.mark.slow

CHECKERS = ("mypy", "pyright[nodejs]", "basedpyright", "pyrefly", "ty")

# A raw-pltpu kernel annotated with safedma's brands; line 9 is the seed mistake.
RAW_SEED = """\
from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from safedma import DataRef, SemRef

def ring(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_remote_copy(x_ref, o_ref, pl.semaphore_read(send_sem), recv_sem, device_id=(jax.lax.axis_index("x") + 1) % 4).start()
"""
RAW_OK = """\
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from safedma import DataRef, SemRef

def ring(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(jax.lax.axis_index("x") + 1) % 4)
    copy.start()
    copy.wait()

def total(x: jax.Array) -> jax.Array:
    return jnp.sum(x)
"""
SAFEDMA_OK = """\
from __future__ import annotations

import jax
import safedma as sd
from jax.experimental import pallas as pl

def ring_permute(x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef) -> None:
    sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(sd.neighbour("x")).start().wait()

def per_device(block: jax.Array) -> jax.Array:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return sd.pallas_call(
        ring_permute, jax.ShapeDtypeStruct(block.shape, block.dtype), in_specs=[hbm],
        out_specs=hbm, scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
    )(block)
"""
USER_TEST = """\
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from safedma.testing import simulate

from kernels_safedma import per_device


def test_ring_simulates(simulated_devices, simulated_mesh_factory):
    assert simulated_devices == 4
    x = jnp.arange(4 * 8 * 128, dtype=jnp.float32).reshape(4 * 8, 128)
    out = simulate(per_device, x, mesh=simulated_mesh_factory((4,), ("x",)),
                   in_specs=P("x"), out_specs=P("x"))
    expected = np.roll(np.asarray(x).reshape(4, 8, 128), 1, axis=0).reshape(32, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)
"""


@dataclass(frozen=True)
class Installed:
    dist: Path
    project: Path  # the user's project; its venv is project/.venv
    python: Path

    @property
    def bin(self) -> Path:
        return self.python.parent


def _user_env(venv_bin: Path | None = None) -> dict[str, str]:
    """The environment with no trace of the checkout or of the suite's jax settings."""
    drop = (
        "PYTHONPATH",
        "XLA_FLAGS",
        "JAX_PLATFORMS",
        "VIRTUAL_ENV",
        "PYTEST_ADDOPTS",
        "PYTEST_PLUGINS",
        "MYPYPATH",
    )
    # TPU_*: jax sets TPU_LIBRARY_PATH once it has loaded this suite's libtpu; a child
    # would find libtpu through it.
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TPU_")}
    if venv_bin is not None:
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv_bin.parent)
    return env


def _run(
    args: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: int = 1200
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env or _user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    copy_source(source)
    builder = root / "builder"
    _ok(_run([sys.executable, "-m", "venv", builder], root))
    _ok(_run([builder / "bin" / "python", "-m", "pip", "install", "--quiet", "build"], root))
    dist = root / "dist"
    # Without flags, build makes the sdist and then the wheel *from the sdist*.
    _ok(_run([builder / "bin" / "python", "-m", "build", "--outdir", dist, source], root))
    project = root / "project"
    project.mkdir()
    _ok(_run([sys.executable, "-m", "venv", project / ".venv"], project))
    python = project / ".venv" / "bin" / "python"
    _ok(
        _run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--find-links",
                dist,
                "safedma",
                "pytest",
                *CHECKERS,
            ],
            project,
        )
    )
    return Installed(dist=dist, project=project, python=python)


def test_sdist_carries_no_tests_and_builds_the_wheel(installed: Installed) -> None:
    (sdist,) = installed.dist.glob("safedma-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    for expected in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "examples/ring_permute_demo.py",
        "safedma/stubs/mypy/jax-stubs/py.typed",
    ):
        assert expected in names
    (wheel,) = installed.dist.glob("safedma-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        files = set(zf.namelist())
        symlinks = [
            i.filename for i in zf.infolist() if (i.external_attr >> 16) & 0o170000 == 0o120000
        ]
        metadata = zf.read(next(f for f in files if f.endswith(".dist-info/METADATA"))).decode()
        entry_points = zf.read(next(f for f in files if f.endswith("entry_points.txt"))).decode()
        for rel in (
            "experimental/pallas/__init__.pyi",
            "experimental/pallas/tpu.pyi",
            "experimental/pallas/tpu_sc.pyi",
        ):
            # The checkout's symlink arrives as a real copy of the one source.
            mypy_copy = zf.read(f"safedma/stubs/mypy/jax-stubs/{rel}")
            assert (
                mypy_copy == zf.read(f"safedma/stubs/pyright/jax/{rel}") and len(mypy_copy) > 1000
            )
    assert not symlinks
    assert not [f for f in files if f.startswith(("tests/", "examples/", "benchmarks/"))]
    assert "safedma/py.typed" in files and any(f.endswith("licenses/LICENSE") for f in files)
    assert "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert "Requires-Dist: jax<0.13,>=0.10.2\n" in metadata
    assert 'extra == "tpu"' in metadata
    assert "safedma.pytest_plugin = safedma.pytest_plugin" in entry_points


def test_no_libtpu_and_compile_for_tpu_names_the_extra(installed: Installed) -> None:
    shown = _run([installed.python, "-m", "pip", "show", "libtpu"], installed.project)
    assert shown.returncode != 0, "libtpu was installed without the tpu extra"
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from safedma.testing import LibtpuMissingError, compile_for_tpu
        try:
            compile_for_tpu(lambda x: x, jax.ShapeDtypeStruct((8, 128), jnp.float32))
        except LibtpuMissingError as err:
            print(err)
    """)
    out = _ok(_run([installed.python, "-c", code], installed.project))
    assert "pip install 'safedma[tpu]'" in out


def test_import_is_the_installed_one_and_imports_no_jax(installed: Installed) -> None:
    code = (
        "import sys, importlib.metadata, safedma; "
        "print(safedma.__file__); print('jax' in sys.modules); "
        "print(safedma.__version__ == importlib.metadata.version('safedma'))"
    )
    lines = _ok(_run([installed.python, "-c", code], installed.project)).split()
    assert "site-packages" in lines[0] and lines[1:] == ["False", "True"]


def test_users_pytest_suite_simulates_with_the_plugin(installed: Installed) -> None:
    suite = installed.project / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "kernels_safedma.py").write_text(SAFEDMA_OK)
    (suite / "test_ring.py").write_text(USER_TEST)
    (suite / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nsafedma_devices = "4"\npythonpath = ["."]\n'
    )
    result = _run(
        [installed.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-config"], suite
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def _checker_command(
    checker: str, installed: Installed, files: list[str], stub_line: str | None
) -> tuple[list[str | Path], dict[str, str], str]:
    """The command, its environment, and the pyproject.toml for one checker run."""
    env = _user_env(installed.bin)
    venv_python = ".venv/bin/python"
    if checker == "mypy":
        if stub_line is not None:
            name, _, value = stub_line.partition("=")
            assert name == "PYTHONPATH"
            env["PYTHONPATH"] = value
        config = '[tool.mypy]\nuntyped_calls_exclude = ["jax"]\n'
        return ([installed.bin / "mypy", "--strict", "--no-incremental", *files], env, config)
    extra = f"{stub_line}\n" if stub_line else ""
    if checker in ("pyright", "basedpyright"):
        config = f'[tool.{checker}]\ntypeCheckingMode = "standard"\n{extra}'
        return ([installed.bin / checker, "--pythonpath", installed.python, *files], env, config)
    if checker == "pyrefly":
        config = f'[tool.pyrefly]\npython-interpreter-path = "{venv_python}"\n{extra}'
        return (
            [
                installed.bin / "pyrefly",
                "check",
                "--preset",
                "default",
                "--output-format",
                "min-text",
                *files,
            ],
            env,
            config,
        )
    config = f'[tool.ty.environment]\npython = ".venv"\n{extra}'
    return ([installed.bin / "ty", "check", "--output-format", "concise", *files], env, config)


def _errors(output: str, file: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if file in line and ("error" in line.lower() or line.lstrip().startswith("ERROR"))
    ]


@pytest.mark.parametrize("checker", ["mypy", "pyright", "basedpyright", "pyrefly", "ty"])
def test_each_checker_uses_the_stubs_from_the_printed_line(
    installed: Installed, checker: str
) -> None:
    work = installed.project
    for name, text in (
        ("raw_seed.py", RAW_SEED),
        ("raw_ok.py", RAW_OK),
        ("kernels_safedma.py", SAFEDMA_OK),
    ):
        (work / name).write_text(text)
    printed = _run([installed.python, "-m", "safedma.stubs", checker, "--config"], work)
    stub_line = _ok(printed).splitlines()[-1]
    assert ".venv/lib/" in stub_line and "/.venv" not in stub_line, "relative to the project"
    files = ["raw_seed.py", "raw_ok.py", "kernels_safedma.py"]
    outputs: dict[bool, str] = {}
    for with_stubs in (True, False):
        command, env, config = _checker_command(
            checker, installed, files, stub_line if with_stubs else None
        )
        (work / "pyproject.toml").write_text(config)
        result = _run(command, work, env, timeout=600)
        outputs[with_stubs] = result.stdout + result.stderr
    with_stubs, without = outputs[True], outputs[False]
    seed_errors = _errors(with_stubs, "raw_seed.py")
    assert seed_errors and all(":9:" in e or "raw_seed.py:9" in e for e in seed_errors), with_stubs
    assert not _errors(with_stubs, "raw_ok.py"), with_stubs
    assert not _errors(with_stubs, "kernels_safedma.py"), with_stubs
    assert not _errors(without, "raw_seed.py"), (
        f"the mistake is seen even without the stubs:\n{without}"
    )
