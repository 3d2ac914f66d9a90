"""safedma's pytest plugin, run as a user's suite would run it (pytester, in a subprocess).

Each run is a new pytest process, so jax starts fresh and reads the XLA_FLAGS
the plugin set (or did not set). ``-p safedma.pytest_plugin`` loads it as the
entry point does, before conftest files; the installed-wheel test checks that
the entry point alone is enough.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

USER_TEST = """
import os
import jax


def test_devices(simulated_devices, simulated_mesh_factory):
    assert simulated_devices == jax.device_count() == {devices}
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    mesh = simulated_mesh_factory((2, {half}), ("y", "x"))
    assert dict(mesh.shape) == {{"y": 2, "x": {half}}}
"""


@pytest.fixture
def user_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in ("XLA_FLAGS", "JAX_PLATFORMS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return pytester


def _run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest_subprocess(
        "-p", "safedma.pytest_plugin", "-p", "no:cacheprovider", *args, timeout=300
    )


@pytest.mark.parametrize("devices", [4, 6])
def test_ini_option_sets_the_device_count(user_project: pytest.Pytester, devices: int) -> None:
    user_project.makeini(f"[pytest]\nsafedma_devices = {devices}\n")
    user_project.makepyfile(test_user=USER_TEST.format(devices=devices, half=devices // 2))
    _run(user_project, "--strict-config").assert_outcomes(passed=1)


def test_a_conftest_that_imports_jax_first_still_gets_the_devices(
    user_project: pytest.Pytester,
) -> None:
    user_project.makepyprojecttoml('[tool.pytest.ini_options]\nsafedma_devices = "4"\n')
    user_project.makeconftest("import jax\nfrom jax.experimental.pallas import tpu\n")
    user_project.makepyfile(test_user=USER_TEST.format(devices=4, half=2))
    _run(user_project).assert_outcomes(passed=1)


def test_command_line_overrides_the_ini(user_project: pytest.Pytester) -> None:
    user_project.makeini("[pytest]\nsafedma_devices = 2\n")
    user_project.makepyfile(test_user=USER_TEST.format(devices=4, half=2))
    _run(user_project, "--safedma-devices=4").assert_outcomes(passed=1)


def test_without_the_option_nothing_changes(user_project: pytest.Pytester) -> None:
    user_project.makepyfile(
        test_user="""
import os

def test_untouched():
    assert "XLA_FLAGS" not in os.environ and "JAX_PLATFORMS" not in os.environ
"""
    )
    _run(user_project).assert_outcomes(passed=1)


def test_a_mesh_too_large_names_the_option(user_project: pytest.Pytester) -> None:
    user_project.makeini("[pytest]\nsafedma_devices = 2\n")
    user_project.makepyfile(
        test_user="""
def test_big(simulated_mesh_factory):
    simulated_mesh_factory((2, 4), ("y", "x"))
"""
    )
    result = _run(user_project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*needs 8 devices; jax has 2. Set safedma_devices = 8*"])


def test_a_bad_value_is_a_usage_error(user_project: pytest.Pytester) -> None:
    user_project.makeini("[pytest]\nsafedma_devices = eight\n")
    user_project.makepyfile(test_user="def test_x():\n    pass\n")
    result = _run(user_project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*safedma_devices = 'eight': expected a positive whole number*"])


def test_a_device_count_beyond_the_bound_is_a_usage_error_at_once(
    user_project: pytest.Pytester,
) -> None:
    """65536 devices would keep jax starting for minutes: refused before jax starts."""
    user_project.makeini("[pytest]\nsafedma_devices = 65536\n")
    user_project.makepyfile(test_user="def test_x():\n    pass\n")
    began = time.monotonic()
    result = _run(user_project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*safedma_devices = '65536': at most 1024 simulated devices*"])
    assert time.monotonic() - began < 60


def test_an_unknown_verify_switch_is_a_usage_error_listing_the_spellings(
    user_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAFEDMA_VERIFY", "maybe")
    user_project.makepyfile(test_user="def test_x():\n    pass\n")
    result = _run(user_project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*SAFEDMA_VERIFY='maybe' is not an on/off value*1, true, yes, on*"]
    )


def test_environment_is_restored_after_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-process run: the variables the plugin set are gone when pytest returns."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # set by the user: kept
    pytester.makeini("[pytest]\nsafedma_devices = 4\n")
    pytester.makepyfile(
        test_user="""
import os

def test_set():
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
"""
    )
    pytester.runpytest_inprocess("-p", "safedma.pytest_plugin").assert_outcomes(passed=1)
    assert "XLA_FLAGS" not in os.environ and os.environ["JAX_PLATFORMS"] == "cpu"
