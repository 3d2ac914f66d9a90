"""Every corpus case with a ``trace`` verdict: tracing runs each trace-time check of
``sd.pallas_call`` / ``@sd.checked`` (nothing is lowered or run) and must end as the case
says: clean, or the case's error naming the user's line and the fix."""

from __future__ import annotations

import pytest

from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case
from tests.tools._verdicts import check

# Raw twins are written as their authors write them, LOGICAL device ids included.
pytestmark = pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")


@pytest.mark.parametrize("case", corpus.params("trace"))
def test_trace(case: Case) -> None:
    check(case, "trace", _run.trace)
