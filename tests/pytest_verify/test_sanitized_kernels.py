"""A sanitized kernel is verified as its caller wrote it: the same verdict as unsanitized,
and a mistake the sanitizer reported counts as the run's error reaching the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma._sanitize import _call
from safedma.testing import LeftoverSemaphoreError
from safedma.testing._suite._outcome import CLEAN, FINDING, Outcome
from safedma.testing._suite._session import SuiteSession
from tests.pytest_verify.runs import PROJECTS, Run, run_project

HBM = pl.BlockSpec(memory_space=pl.ANY)
ROWS = 16
QUICK = sd.SanitizeOptions(polls=100)


def whole_copy(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    pltpu.sync_copy(buf, o_hbm)


def half_written(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    pltpu.sync_copy(buf.at[pl.ds(0, 8)], o_hbm.at[pl.ds(0, 8)])  # rows 8:16 never written


def signal_never_waited(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any, reg: Any) -> None:
    whole_copy(x_hbm, o_hbm, buf, sem)
    pl.semaphore_signal(reg, 1)  # never waited


def _call_of(kernel: Callable[..., None], sanitize: object, regular: bool = False) -> Any:
    scratch = [pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]
    return sd.pallas_call(
        kernel,
        jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[*scratch, *([pltpu.SemaphoreType.REGULAR] if regular else [])],
        interpret=pltpu.InterpretParams(),
        sanitize=sanitize,  # type: ignore[typeddict-item]
    )


def _x() -> jax.Array:
    return jnp.arange(ROWS * 128, dtype=jnp.float32).reshape(ROWS, 128)


@pytest.fixture
def session() -> Iterator[SuiteSession]:
    suite = SuiteSession(timeout_s=60)
    suite.install()
    try:
        yield suite
    finally:
        suite.close()


def _verdicts(session: SuiteSession, test: str, run: Callable[[], object]) -> list[Outcome]:
    session.begin(test, "call")
    try:
        run()
    finally:
        verdicts = session.take(test, "call")
        session.end()
    return verdicts


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_sanitized_correct_kernel_is_verified_clean(session: SuiteSession, jitted: bool) -> None:
    call = _call_of(whole_copy, QUICK)
    run = jax.jit(call) if jitted else call
    [verdict] = _verdicts(session, "t::clean", lambda: jax.block_until_ready(run(_x())))
    assert verdict.kind == CLEAN, verdict.text("t::clean")
    assert verdict.kernels[0].startswith("whole_copy")


# Under the suite's own --safedma-verify, its session sees these runs too.
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_a_sanitized_kernel_gets_the_verdict_of_the_same_kernel_unsanitized(
    session: SuiteSession,
) -> None:
    """The sanitizer finds nothing here (it checks no output coverage); verify reports the
    caller's unwritten rows, sanitized or not, at the caller's line."""
    with_sanitizer = _call_of(half_written, QUICK)
    without = _call_of(half_written, None)
    [sanitized] = _verdicts(session, "t::on", lambda: jax.block_until_ready(with_sanitizer(_x())))
    [unsanitized] = _verdicts(session, "t::off", lambda: jax.block_until_ready(without(_x())))
    assert sanitized.kind == unsanitized.kind == FINDING
    assert sanitized.error == unsanitized.error == "UnwrittenReadError"
    assert sanitized.message == unsanitized.message
    assert "o_hbm[8:16, 0:128]" in sanitized.message and "half_written" in sanitized.message
    assert not sanitized.observed  # a new failure of the test that ran it


@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")
def test_a_mistake_the_sanitizer_raises_eagerly_is_known_to_the_test(
    session: SuiteSession,
) -> None:
    call = _call_of(signal_never_waited, QUICK, regular=True)

    def run() -> None:
        with pytest.raises(LeftoverSemaphoreError):
            call(_x())

    [verdict] = _verdicts(session, "t::leftover", run)
    assert verdict.kind == FINDING and verdict.is_one_of(frozenset({"LeftoverSemaphoreError"}))
    assert "REGULAR semaphore reg" in verdict.message
    assert verdict.observed == "the sanitizer raised LeftoverSemaphoreError on the run"


@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")
def test_a_mistake_the_sanitizer_reports_under_jit_is_known_to_the_test(
    session: SuiteSession,
) -> None:
    call = jax.jit(_call_of(signal_never_waited, QUICK, regular=True))

    def run() -> None:
        with pytest.raises(LeftoverSemaphoreError), sd.sanitizer_errors():
            jax.block_until_ready(call(_x()))

    [verdict] = _verdicts(session, "t::leftover_jit", run)
    assert verdict.kind == FINDING and verdict.is_one_of(frozenset({"LeftoverSemaphoreError"}))
    assert verdict.observed, verdict.text("t::leftover_jit")


def test_a_body_the_checks_refuse_raises_as_without_the_suite(session: SuiteSession) -> None:
    def never_waited(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_hbm, buf, sem).start()
        pltpu.sync_copy(x_hbm, o_hbm)

    with pytest.raises(sd.CopyNeverWaitedError):
        _verdicts(session, "t::refused", lambda: _call_of(never_waited, QUICK)(_x()))


def _watcher() -> object:
    current = _call.watch_runs(None)
    _call.watch_runs(current)
    return current


def test_sanitized_calls_run_directly_once_the_suite_closes() -> None:
    before = _watcher()
    suite = SuiteSession(timeout_s=60)
    suite.install()
    try:
        assert _watcher() is not None and _watcher() is not before
    finally:
        suite.close()
    assert _watcher() is before


# ---------------------------------------------------------------- through pytest


@pytest.fixture(scope="module")
def sanitized_project(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_project(
        tmp_path_factory.mktemp("sanitized"), "sanitized_kernels", "--safedma-verify", "-v"
    )


def _project_line(marker: str) -> int:
    lines = (PROJECTS / "sanitized_kernels.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def test_through_pytest_a_sanitized_kernel_is_verified_not_skipped(sanitized_project: Run) -> None:
    run = sanitized_project
    assert run.outcomes["test_correct_kernel_sanitized"] == "passed", run.output
    assert run.outcomes["test_leftover_the_sanitizer_raises"] == "passed", run.output
    summary = run.summary()
    assert "0 not checkable" in summary and "1 finding(s)" in summary, summary
    assert "1 already known to the test" in summary, summary
    known = [line for line in summary.splitlines() if line.startswith("KNOWN TO THE TEST")]
    assert len(known) == 1 and "signal_never_waited" in known[0], summary
    assert "LeftoverError" in known[0], summary


def test_through_pytest_a_sanitized_mistake_fails_the_test_that_ran_it(
    sanitized_project: Run,
) -> None:
    run = sanitized_project
    assert run.outcomes["test_half_written_output_sanitized"] == "failure", run.output
    report = run.failure("test_half_written_output_sanitized")
    assert "UnwrittenReadError" in report and "half_written" in report
    assert "o_hbm[8:16, 0:128]" in report
    assert f"test_sanitized_kernels.py:{_project_line('def half_written')}" in report


def test_a_kernel_call_without_a_body_of_its_own_has_no_recorded_caller() -> None:
    """A program's kernel call whose body it does not hold (a core map: None), or whose
    body cannot be weakly referenced, was never recorded: verify keeps it as it ran."""
    from safedma.testing._suite._sanitized import _caller_of

    assert _caller_of(None) is None
    assert _caller_of(3) is None
