"""Every corpus case with a ``mosaic`` verdict lowers to the Mosaic of its hand-written raw
pltpu twin: safedma's typed spelling costs nothing on the chip (and traces clean, since
lowering traces every kernel body)."""

from __future__ import annotations

import pytest

from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case
from tests.tools._verdicts import check

# Raw twins are written as their authors write them, LOGICAL device ids included.
pytestmark = pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")


@pytest.mark.parametrize("case", corpus.params("mosaic"))
def test_mosaic(case: Case) -> None:
    assert case.twin is not None
    twin = case.twin
    check(case, "mosaic", lambda program: _run.mosaic(program, twin()))
