"""Verdicts into pytest's reports: findings fail the test, the rest warn, a summary.

The verdicts travel on the report itself (``report.safedma_verify``, plain
dicts), so the summary adds up the same with pytest-xdist, whose workers send
their reports to the process that prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pytest

from safedma.testing._suite._outcome import CLEAN, FINDING, UNSUPPORTED, Outcome

__all__ = ["REPORT_ATTRIBUTE", "Tally", "file_on_report"]

#: The attribute of a test report that carries its verdicts.
REPORT_ATTRIBUTE = "safedma_verify"

_SECTION = "safedma verify"


def file_on_report(
    item: pytest.Item,
    report: pytest.TestReport,
    verdicts: Sequence[Outcome],
    fail_unsupported: bool,
    warning: type[Warning],
) -> None:
    """Fail ``report`` for each finding (and, if asked, each program verify could not
    check); warn for the others. A report that already failed keeps its own error,
    with verify's after it."""
    if not verdicts:
        return
    setattr(report, REPORT_ATTRIBUTE, [v.as_record(report.nodeid) for v in verdicts])
    failing = [v for v in verdicts if v.fails_the_test(fail_unsupported)]
    for v in verdicts:
        if v.kind != CLEAN and not v.observed and v not in failing:
            item.warn(warning(v.text(report.nodeid)))
    known = [v for v in verdicts if v.kind != CLEAN and v.observed]
    if known:
        # shown with the report's other sections (-rP for a passing test)
        report.sections.append((_SECTION, "\n\n".join(v.text(report.nodeid) for v in known)))
    if not failing:
        return
    text = "\n\n".join(v.text(report.nodeid) for v in failing)
    if report.passed:
        report.outcome = "failed"
        report.longrepr = text
    else:
        report.sections.append((_SECTION, text))


@dataclass
class Tally:
    """What the session's verdicts add up to, for the terminal summary."""

    verified: int = 0  # programs verify walked
    seconds: float = 0.0
    from_cache: int = 0  # runs whose verdict was already known
    problems: list[dict[str, object]] = field(default_factory=list[dict[str, object]])

    def add(self, report: pytest.TestReport) -> None:
        self.add_records(getattr(report, REPORT_ATTRIBUTE, None) or ())

    def add_records(self, records: Sequence[dict[str, object]]) -> None:
        for r in records:
            if r.get("cached"):
                self.from_cache += 1
            else:
                self.verified += 1
                seconds = r.get("seconds", 0.0)
                self.seconds += seconds if isinstance(seconds, float) else 0.0
            if r.get("kind") != CLEAN:
                self.problems.append(r)

    def lines(self, verbose: bool) -> list[str]:
        """The counts, then one line per finding and per program not checked (with
        ``verbose``, per finding already known to its test, too)."""
        new = [p for p in self.problems if not p.get("observed")]
        known = [p for p in self.problems if p.get("observed")]
        findings = [p for p in new if p.get("kind") == FINDING]
        unsupported = [p for p in new if p.get("kind") == UNSUPPORTED]
        failed = [p for p in new if p.get("kind") not in (FINDING, UNSUPPORTED)]
        out = [
            f"{self.verified} kernel program(s) verified in {self.seconds:.2f} s; "
            f"{self.from_cache} test phase(s) ran a program already verified; "
            f"{len(findings)} finding(s), {len(unsupported)} not checkable, "
            f"{len(failed)} verify failure(s); {len(known)} already known to the test "
            "(its run raised, or its marker expects it)"
        ]
        for label, group in (
            ("finding", findings),
            ("not checkable", unsupported),
            ("verify failed", failed),
            ("known to the test", known if verbose else []),
        ):
            for p in group:
                kernels = p.get("kernels")
                names = (
                    ", ".join(str(k) for k in cast("list[object]", kernels))
                    if isinstance(kernels, list)
                    else ""
                )
                first = str(p.get("message", "")).strip().splitlines()
                out.append(
                    f"{label.upper()}: {p.get('test')}: {names or p.get('program')}: "
                    f"{p.get('error')}: {first[0] if first else ''}"
                )
        return out
