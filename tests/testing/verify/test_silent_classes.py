"""The DMA mistakes simulate lets through (MISUSE.md R5-R10, the shared-semaphore early wait).

For every row, four kernels (tests/support/protocol_kernels*.py): the bug and
its fix, in raw pltpu and in safedma. ``verify`` must reject each bug with an
error that names the mistake, the device, the kernel parameter, the user's
own line and the fix, and must accept each fix; on a device-free mesh, and
on a real simulated one. ``simulate`` is run on the bugs to pin what it says
today: for most of them nothing (that is why verify exists).
"""

from __future__ import annotations

import pytest

from safedma.testing import SimulationError, simulate, simulated_mesh
from tests.support import protocol_kernels as pk

SILENT = pk.cases(kind="silent")
BUGS = [c for c in SILENT if c.is_bug]
FIXES = [c for c in SILENT if not c.is_bug]


@pytest.mark.parametrize("case", pk.params(BUGS))
def test_verify_catches_the_bug_on_a_device_free_mesh(case: pk.Case) -> None:
    with pytest.raises(Exception) as caught:
        pk.verify_case(case, mesh=pk.abstract_ring(case.row.devices))
    pk.assert_caught(case, caught.value)


@pytest.mark.parametrize("case", pk.params(FIXES))
def test_verify_accepts_the_fix_on_a_device_free_mesh(case: pk.Case) -> None:
    pk.assert_clean(pk.verify_case(case, mesh=pk.abstract_ring(case.row.devices)), case.row.devices)


@pytest.mark.parametrize("case", pk.params([c for c in BUGS if c.flavour == "pltpu"]))
def test_verify_gives_the_same_verdict_on_a_simulated_mesh(case: pk.Case) -> None:
    with pytest.raises(Exception) as caught:
        pk.verify_case(case, mesh=simulated_mesh(case.row.devices, pk.AXIS))
    pk.assert_caught(case, caught.value)


@pytest.mark.parametrize("case", pk.params([c for c in FIXES if c.flavour == "pltpu"]))
def test_fix_is_clean_on_a_simulated_mesh_too(case: pk.Case) -> None:
    pk.assert_clean(
        pk.verify_case(case, mesh=simulated_mesh(case.row.devices, pk.AXIS)), case.row.devices
    )


def _simulate_cases() -> list[object]:
    out: list[object] = []
    for case in BUGS:
        if case.row.simulate_bug == "schedule-dependent" or case.trace_catch:
            continue
        marks = [] if case.flavour == "pltpu" else [pytest.mark.slow]
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _simulate_cases())
def test_what_simulate_says_of_the_bug_today(case: pk.Case) -> None:
    """Pins why verify exists: simulate passes most of these bugs (the rest as recorded)."""
    mesh = simulated_mesh(case.row.devices, pk.AXIS)
    expected = case.row.simulate_bug
    if expected == "clean":
        simulate(case.program(), pk.example(case.row, case.row.devices), mesh=mesh, timeout_s=10)
    else:
        with pytest.raises(SimulationError) as caught:
            simulate(
                case.program(), pk.example(case.row, case.row.devices), mesh=mesh, timeout_s=10
            )
        assert type(caught.value).__name__ == expected


@pytest.mark.slow
@pytest.mark.parametrize("case", pk.params(FIXES))
def test_simulate_runs_the_fix_clean(case: pk.Case) -> None:
    simulate(
        case.program(),
        pk.example(case.row, case.row.devices),
        mesh=simulated_mesh(case.row.devices, pk.AXIS),
        timeout_s=10,
    )


def test_every_row_has_four_kernels_and_each_bug_a_marked_line() -> None:
    for row in pk.ROWS:
        assert len([c for c in pk.CASES if c.row is row]) == 4, row.name
    for case in pk.CASES:
        if case.expect is not None:
            assert pk.marked_lines(case.source, case.expect.marker)
