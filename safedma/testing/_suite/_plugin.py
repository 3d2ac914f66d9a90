"""The pytest hooks of ``--safedma-verify``, registered only while it is on.

``safedma.pytest_plugin`` reads the options and registers one
:class:`VerifyEveryKernel`; it installs the hook into jax at once (so kernels run
while test modules are imported are seen too) and takes it out when pytest
finishes.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace

import pytest

from safedma.testing._suite._outcome import FINDING, Outcome
from safedma.testing._suite._reports import Tally, file_on_report
from safedma.testing._suite._session import OUTSIDE_TESTS, SuiteSession

__all__ = ["EXPECTED_MARKER", "VerifyEveryKernel"]

#: ``@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError", ...)`` (or
#: ``errors=[LeftoverSemaphoreError]``): the test runs a kernel with these mistakes on
#: purpose (none named: any finding).
EXPECTED_MARKER = "safedma_verify_expected"  # the name safedma.pytest_plugin registers


def _expected(item: pytest.Item, verdicts: list[Outcome]) -> list[Outcome]:
    """The verdicts, with the findings the test's marker expects marked as no news."""
    marker = item.get_closest_marker(EXPECTED_MARKER)
    if marker is None:
        return verdicts
    # Names, or classes: pytest takes a lone class argument for the thing to mark, so
    # classes go in errors=[...].
    given = [*marker.args, *marker.kwargs.get("errors", ())]
    names = frozenset(a if isinstance(a, str) else getattr(a, "__name__", str(a)) for a in given)
    reason = f"the test's {EXPECTED_MARKER} marker expects it"
    return [
        replace(v, observed=v.observed or reason) if v.kind == FINDING and v.is_one_of(names) else v
        for v in verdicts
    ]


class VerifyEveryKernel:
    """Files each verdict under the test phase that ran the kernel, fails or warns
    in that phase's report, and prints the session's summary."""

    def __init__(self, timeout_s: float, fail_unsupported: bool, warning: type[Warning]) -> None:
        self.suite = SuiteSession(timeout_s)
        self.tally = Tally()
        self.fail_unsupported = fail_unsupported
        self.warning = warning
        self.suite.install()

    def close(self) -> None:
        self.suite.close()

    def _begin(self, item: pytest.Item, phase: str) -> None:
        self.suite.begin(item.nodeid, phase)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        self._begin(item, "setup")
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        self._begin(item, "call")
        yield

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        self._begin(item, "teardown")
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, object, None]:
        outcome = yield
        report: pytest.TestReport = getattr(outcome, "get_result")()
        verdicts = _expected(item, self.suite.take(item.nodeid, call.when))
        if call.when == "teardown":
            self.suite.end()
        file_on_report(item, report, verdicts, self.fail_unsupported, self.warning)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Where the summary is printed (with pytest-xdist, the controller's copy).
        self.tally.add(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        outside = self.suite.take_outside_tests()
        self.tally.add_records([v.as_record(OUTSIDE_TESTS) for v in outside])
        if any(v.kind == FINDING for v in outside) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_sep("=", "safedma verify")
        for line in self.tally.lines(terminalreporter.verbosity > 0):
            terminalreporter.write_line(line)
