"""What one TPU chip does with the catalogue's DMA mistakes, and with CountedCopy.

These run the chip in child processes (benchmarks/chip_runner.py) under
timeouts, since a mistake can hang or crash the chip; they run before any test
that takes the chip in this process. ``python -m benchmarks.chip_mistakes``
runs the same cases and writes the table; deselect these here with
``-k "not raw_mistake"`` (about 4 minutes of the lane).
"""

from __future__ import annotations

import pytest

from benchmarks import chip_cases as cc
from benchmarks.chip_runner import CaseResult, ChipRun
from safedma._compat import chip_generation
from safedma._regular_copies import FIRST_COUNTING_GENERATION

pytestmark = pytest.mark.tpu

CATALOGUE = [c.name for c in cc.CATALOGUE]


def run_result(run: ChipRun, name: str) -> CaseResult:
    result = run.cases[name]
    assert not result.infrastructure, f"{name} did not run on the chip: {result.infrastructure}"
    return result


@pytest.mark.parametrize("name", CATALOGUE)
def test_raw_mistake_fix_runs_right_on_chip(name: str, chip_run: ChipRun) -> None:
    result = run_result(chip_run, name)
    assert result.fix is not None, f"{name}: the fix never ran"
    assert result.fix.outcome == cc.RIGHT, f"{name}: the fix gave {result.fix}"


@pytest.mark.parametrize("name", CATALOGUE)
def test_raw_mistake_on_chip_does_what_the_catalogue_says(name: str, chip_run: ChipRun) -> None:
    case = cc.BY_NAME[name]
    result = run_result(chip_run, name)
    assert result.bug, f"{name}: the mistake never ran"
    seen = "; ".join(f"{v.outcome} ({v.detail})" if v.detail else v.outcome for v in result.bug)
    print(f"{case.row} {name}: {seen}")
    assert result.bug_outcome in case.catalogue_says, (
        f"docs/catalogue.md ({case.row}, {case.title}) predicts "
        f"{' or '.join(sorted(case.catalogue_says))} for raw pltpu on a TPU; this chip: {seen}"
    )


def test_counted_copy_is_refused_before_v6_and_right_after(counted_copy_run: ChipRun) -> None:
    """CountedCopy needs TPU v6 or later: on an older chip safedma refuses it at trace time
    (jax compiles it, and a v5e runs it into a halted core); a newer chip runs it right."""
    result = run_result(counted_copy_run, "counted_copy")
    assert result.fix is not None and result.fix.outcome == cc.RIGHT, (
        f"the same copies on a DMA semaphore: {result.fix}"
    )
    (counted,) = result.bug
    kind = counted_copy_run.device_kind
    generation = chip_generation(kind)
    assert generation is not None, kind
    if generation < FIRST_COUNTING_GENERATION:
        assert counted.outcome == cc.TRACE_ERROR, (kind, counted)
        assert "UnsupportedDmaError" in counted.detail and "needs TPU v6" in counted.detail, (
            counted.detail
        )
        return
    assert counted.outcome == cc.RIGHT, (
        f"{kind} (versions {counted_copy_run.versions}) ran a CountedCopy and gave: "
        f"{counted.outcome} ({counted.detail})"
    )
