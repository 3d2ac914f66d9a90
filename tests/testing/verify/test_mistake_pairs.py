"""verify on the corpus's mistake pairs beyond what tests/tools/test_verify_corpus.py runs.

Each pair (tests/corpus/_blocks.py) is a DMA mistake of docs/catalogue.md written as a
bug and its fix, in raw pltpu and in safedma. The driver runs verify on a device-free
mesh; here the raw spellings are verified on a real (simulated) mesh too, which must
give the same verdicts, and the leak's report is pinned to the slot that leaks.
"""

from __future__ import annotations

import pytest

from safedma.testing import SimulationError
from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case, Ok, Raises, problems

RAW_SILENT = corpus.cases("verify", tags=("pair", "silent", "pltpu"))
BUGS = [c for c in RAW_SILENT if "bug" in c.tags]
FIXES = [c for c in RAW_SILENT if "bug" not in c.tags]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in BUGS])
def test_verify_gives_the_same_verdict_on_a_simulated_mesh(case: Case) -> None:
    verdict = case.expect["verify"]
    assert isinstance(verdict, Raises)
    with pytest.raises(Exception) as caught:
        _run.verify(case.build(), real_mesh=True)
    found = problems(caught.value, verdict, case)
    assert not found, f"{case.name}: " + "; ".join(found) + f"\n\n{caught.value}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in FIXES])
def test_fix_is_clean_on_a_simulated_mesh_too(case: Case) -> None:
    program = case.build()
    verdict = case.expect["verify"]
    assert isinstance(verdict, Ok)
    report = _run.verify(program, real_mesh=True)
    assert report.devices == program.devices, report
    assert report.kernels, report


def test_the_leak_is_reported_on_slot_1_only() -> None:
    """The rebuilt wait on sems.at[0] balances slot 0; only slot 1 is left over."""
    case = corpus.BY_NAME["per_slot_leak-bug-pltpu"]
    with pytest.raises(SimulationError) as caught:
        _run.verify(case.build())
    message = str(caught.value)
    assert "sems[1]" in message or "sems.at[1]" in message or "sems 1" in message, message
    assert "sems[0]" not in message and "sems.at[0]" not in message, message
