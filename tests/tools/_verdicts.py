"""The verdict check every driver shares: run the tool, compare with the case's verdict."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from tests.corpus._case import Case, Ok, Program, Raises, Unsupported, problems

# What each tool raises when it refuses a program (an Unsupported verdict).
REFUSALS = {
    "trace": ("UnsupportedDmaError", "UnsupportedByJaxError"),
    "mosaic": ("UnsupportedDmaError", "UnsupportedByJaxError"),
    "verify": ("VerificationUnsupportedError",),
    "simulate": ("SimulationUnsupportedError",),
    "sanitize": ("SanitizerUnsupportedError",),
}


def check(
    case: Case,
    tool: str,
    run: Callable[[Program], Any],
    within: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> Any:
    """Build the case's program, run ``tool`` on it and hold the outcome to the verdict.

    ``within``: the tool's setting, in force while the program is built (a program may
    make its ``pallas_call`` when built, and read the setting then).
    Returns what the tool returned (for an ``Ok``), after ``Ok.check``.
    """
    import re

    verdict = case.expect[tool]
    with within():
        program = case.build()
    if isinstance(verdict, Ok):
        result = run(program)
        if verdict.check is not None:
            verdict.check(result, program)
        return result
    try:
        run(program)
    except Exception as error:  # noqa: BLE001 - every outcome is compared with the verdict
        if isinstance(verdict, Unsupported):
            names = [k.__name__ for k in type(error).__mro__]
            if not any(n in names for n in REFUSALS[tool]):
                raise
            assert re.search(verdict.reason, str(error)), (
                f"{case.name}: {tool} refused it, but not saying {verdict.reason!r}:\n{error}"
            )
            return None
        assert isinstance(verdict, Raises)
        found = problems(error, verdict, case)
        if found:
            raise AssertionError(
                f"{case.name}: {tool} raised {type(error).__name__}, but: "
                + "; ".join(found)
                + f"\n\nThe message:\n{error}"
            ) from error
        return None
    raise AssertionError(f"{case.name}: {tool} accepted the program; expected {verdict}")
