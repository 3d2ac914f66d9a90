"""How ``--safedma-verify`` is switched on: the ini key, the environment variable,
and its cache of verdicts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pytest_verify.runs import REPO, run_project


def test_the_ini_key_switches_it_on_and_unsupported_can_fail(tmp_path: Path) -> None:
    run = run_project(
        tmp_path,
        "few_kernels",
        ini="safedma_verify = true\nsafedma_verify_unsupported = fail\n",
    )
    assert run.outcomes == {
        "test_dropped_wait": "failure",
        "test_dropped_wait_on_purpose": "passed",
        "test_dropped_wait_expecting_another_mistake": "failure",
        "test_two_shard_maps_in_one_program": "failure",
    }, run.output
    assert "VerificationUnsupportedError" in run.failure("test_two_shard_maps_in_one_program")
    assert "VerifiedLeftoverError" in run.failure("test_dropped_wait_expecting_another_mistake")


def test_the_environment_variable_wins_over_the_ini(tmp_path: Path) -> None:
    run = run_project(
        tmp_path, "few_kernels", ini="safedma_verify = true\n", env={"SAFEDMA_VERIFY": "0"}
    )
    assert set(run.outcomes.values()) == {"passed"}, run.output
    assert len(run.outcomes) == 4
    assert "safedma verify" not in run.output


def test_the_environment_variable_switches_it_on_and_verdicts_are_cached(tmp_path: Path) -> None:
    run = run_project(tmp_path, "repeated_kernel", env={"SAFEDMA_VERIFY": "1"})
    assert set(run.outcomes.values()) == {"failure"}, run.output
    assert len(run.outcomes) == 5
    for value in ("1.0", "4.0"):
        assert "was never waited" in run.failure(f"test_same_shape[{value}]")
    # four runs of one shape: verified once; another shape: verified again
    assert "2 kernel program(s) verified" in run.summary()
    assert "3 test phase(s) ran a program already verified" in run.summary()


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"SAFEDMA_VERIFY": "maybe"}, "SAFEDMA_VERIFY"),
        ({"args": "--safedma-verify-timeout=soon"}, "safedma_verify_timeout"),
        ({"args": "--safedma-verify-unsupported=ignore"}, "safedma-verify-unsupported"),
    ],
)
def test_a_bad_setting_is_a_usage_error(
    tmp_path: Path, setting: dict[str, str], named: str
) -> None:
    args = ["--safedma-verify", setting["args"]] if "args" in setting else []
    env = {k: v for k, v in setting.items() if k != "args"}
    run = run_project(tmp_path, "few_kernels", *args, env=env)
    assert run.code == pytest.ExitCode.USAGE_ERROR, run.output
    assert named in run.output


def test_importing_the_plugin_imports_no_jax() -> None:
    code = "import sys, safedma.pytest_plugin; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
