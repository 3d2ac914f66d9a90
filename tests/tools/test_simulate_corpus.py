"""Every corpus case with a ``simulate`` verdict, run in strict interpret mode on
simulated CPU devices: what simulate says of each program (for the mistakes it cannot
see, that it passes them: why verify exists). No run may leave a thread in the
interpreter or a simulate worker alive."""

from __future__ import annotations

import pytest

from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case
from tests.support.simulation import python_threads, threads_left_behind
from tests.tools._verdicts import check

# Raw programs are written as their authors write them, LOGICAL device ids included.
pytestmark = pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")


@pytest.mark.parametrize("case", corpus.params("simulate"))
def test_simulate(case: Case) -> None:
    before = python_threads()
    check(case, "simulate", _run.simulate)
    left = threads_left_behind(before)
    assert left is None, f"threads left behind: {left}"
