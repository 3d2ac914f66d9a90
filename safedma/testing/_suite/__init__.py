"""Verify every kernel a test suite runs (``pytest --safedma-verify``).

Modules, one job each: ``_jax`` (the hook into jax's lowering and execution,
and every jax internal it reads), ``_verifier`` (verify one run; one verdict per
program, argument types and mesh per session), ``_sanitized`` (a sanitized
kernel verified as its caller wrote it), ``_outcome`` (a verdict and its text),
``_session`` (which test ran what), ``_reports`` (verdicts into pytest reports
and the summary), ``_plugin`` (the pytest hooks). ``safedma.pytest_plugin``
reads the options and imports this package only when the option is on.
"""

from safedma.testing._suite._outcome import Outcome
from safedma.testing._suite._session import OUTSIDE_TESTS, SuiteSession

__all__ = ["OUTSIDE_TESTS", "Outcome", "SuiteSession"]
