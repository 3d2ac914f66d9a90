"""``--safedma-verify`` over a user's kernel tests that know nothing of it.

One run with the option and one without share a project of raw pltpu and safedma
kernels (jitted, eager, in ``jax.shard_map`` over 4 simulated devices, under
``simulate``), clean ones and ones with a seeded protocol mistake.
"""

from __future__ import annotations


import pytest

from tests.pytest_verify.runs import PROJECTS, Run, run_project

CLEAN = (
    "test_raw_kernel_jitted",
    "test_raw_kernel_eager",
    "test_safedma_kernel_in_shard_map",
    "test_safedma_kernel_under_simulate",
    "test_donated_argument",
    "test_window_in_range",
)


def _line_of(marker: str) -> int:
    """The line of the user project that holds ``marker``."""
    lines = (PROJECTS / "user_kernels.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_project(
        tmp_path_factory.mktemp("verified"),
        "user_kernels",
        "--safedma-verify",
        env={"EXPECT_VERIFY_HOOK": "1"},
    )


@pytest.fixture(scope="module")
def unverified(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_project(
        tmp_path_factory.mktemp("unverified"), "user_kernels", env={"EXPECT_VERIFY_HOOK": "0"}
    )


@pytest.mark.parametrize("test", CLEAN)
def test_a_clean_kernel_passes(verified: Run, test: str) -> None:
    assert verified.outcomes[test] == "passed", verified.output


def test_the_hook_is_in_jax_only_with_the_option(verified: Run, unverified: Run) -> None:
    assert verified.outcomes["test_jax_execution_hook_state"] == "passed", verified.output
    assert unverified.outcomes["test_jax_execution_hook_state"] == "passed", unverified.output


def test_without_the_option_the_seeded_mistakes_pass(unverified: Run) -> None:
    """What the option adds: interpret mode runs these kernels without complaint."""
    for test in (
        "test_dropped_wait",
        "test_dropped_wait_eager",
        "test_forgotten_signal_in_shard_map",
        "test_two_kernels_in_one_program",
        "test_module_level_program_first",
    ):
        assert unverified.outcomes[test] == "passed", unverified.output
    assert "safedma verify" not in unverified.output


@pytest.mark.parametrize("test", ["test_dropped_wait", "test_dropped_wait_eager"])
def test_a_dropped_wait_fails_the_test_that_ran_it(verified: Run, test: str) -> None:
    assert verified.outcomes[test] == "failure"
    report = verified.failure(test)
    assert "dropped_wait_kernel" in report
    assert f"test_user_kernels.py::{test}" in report
    assert "VerifiedLeftoverError: 1 semaphore count not back to zero" in report
    assert "was never waited" in report
    assert f"test_user_kernels.py:{_line_of('# never waited')} (dropped_wait_kernel)" in report


def test_a_kernel_in_shard_map_is_verified_on_its_mesh(verified: Run) -> None:
    report = verified.failure("test_forgotten_signal_in_shard_map")
    assert "forgotten_signal" in report
    assert "4 semaphore counts not back to zero" in report  # one per device of the mesh
    assert "device 3 (x=3)" in report


def test_each_run_is_verified_with_its_own_values(verified: Run) -> None:
    """The in-range and out-of-range runs are one program with other start values."""
    assert verified.outcomes["test_window_in_range"] == "passed"
    report = verified.failure("test_window_out_of_range")
    assert "OutOfBoundsDmaError" in report
    assert "window [12, 20) is outside dimension 0 of size 16" in report
    assert "test_user_kernels.py::test_window_out_of_range" in report


def test_several_kernels_in_one_program_name_the_wrong_one(verified: Run) -> None:
    report = verified.failure("test_two_kernels_in_one_program")
    assert "VerifiedLeftoverError" in report
    assert "never waited" in report
    assert "dropped_wait_kernel" in report.split("\n")[0]


def test_a_program_run_by_two_tests_fails_both(verified: Run) -> None:
    for test in ("test_module_level_program_first", "test_module_level_program_again"):
        assert verified.outcomes[test] == "failure"
        assert f"test_user_kernels.py::{test}" in verified.failure(test)


def test_a_program_verify_does_not_check_is_a_warning(verified: Run) -> None:
    assert verified.outcomes["test_two_shard_maps_in_one_program"] == "passed"
    assert "VerifyUnsupportedWarning" in verified.output
    assert "VerificationUnsupportedError" in verified.output
    summary = verified.summary()
    assert "1 not checkable" in summary
    assert "NOT CHECKABLE: test_user_kernels.py::test_two_shard_maps_in_one_program" in summary


def test_the_summary_lists_each_finding(verified: Run) -> None:
    summary = verified.summary()
    assert "FINDING: test_user_kernels.py::test_dropped_wait: dropped_wait_kernel" in summary
    assert "0 verify failure(s)" in summary
