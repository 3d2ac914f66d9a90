"""Every corpus case with a ``verify`` verdict, on its device-free mesh: a correct program
is proved on every device (the report counts them, and the kernels and invocations it
ran); a seeded mistake is an error naming the mistake, the device, the buffer or
semaphore, the user's line and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case, Ok, Program
from tests.tools._verdicts import check

# Raw twins are written as their authors write them, LOGICAL device ids included.
pytestmark = pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")


def _verified(program: Program) -> Any:
    report = _run.verify(program)
    # What was proved, whatever the case adds: every device of the mesh, the
    # invocations asked for, and at least one kernel.
    if program.per_device:
        assert report.devices == program.devices, report
    assert report.invocations == program.invocations, report
    return report


@pytest.mark.parametrize("case", corpus.params("verify"))
def test_verify(case: Case) -> None:
    report = check(case, "verify", _verified)
    verdict = case.expect["verify"]
    if isinstance(verdict, Ok):
        expected = dict(verdict.report)
        if "kernels" not in expected:
            assert report.kernels, report
        for field, value in expected.items():
            assert getattr(report, field) == value, (field, report)
