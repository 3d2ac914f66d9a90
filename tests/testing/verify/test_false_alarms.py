"""Kernels the trace-time checks get wrong: three correct ones they reject, one leak they miss.

* a handle waited once in each branch of ``lax.cond``;
* the same with ``pl.when(c)`` and ``pl.when(~c)``;
* a write-back pipeline waiting step i - 1 through ``started_elsewhere()``
  and its own handle at the last step;
* a ``started_elsewhere()`` wait on ``sems.at[0]`` that must not discharge a
  copy leaked on ``sems.at[1]``;
* and one verify itself must not reject: credit flow control on a REGULAR
  semaphore (the receiver returns a credit per slot it read; the sender waits
  a credit per message), the protocol of safedma's reduce-scatter and
  all-reduce, reduced to a ring of six messages over two slots.

``verify`` executes each device's path, so it must prove the correct ones
clean and reject each broken twin (one branch without its wait; two
conditions that overlap on device 2; no wait for the last write-back; the
leak), naming the device that takes the bad path. The last tests pin the
rule of issue 14: no trace-time check may reject a kernel verify proves
sound.
"""

from __future__ import annotations

import pytest

import safedma as sd

from safedma.testing import SimulationError, simulate, simulated_mesh
from tests.support import protocol_kernels as pk

ALARMS = pk.cases(kind="false_alarm") + pk.cases(kind="leak")
CORRECT = [c for c in ALARMS if not c.is_bug]
BROKEN = [c for c in ALARMS if c.is_bug]


@pytest.mark.parametrize("case", pk.params(CORRECT))
def test_verify_proves_the_correct_kernel_clean(case: pk.Case) -> None:
    pk.assert_clean(pk.verify_case(case, mesh=pk.abstract_ring(case.row.devices)), case.row.devices)


@pytest.mark.parametrize("case", pk.params(BROKEN))
def test_verify_rejects_the_broken_twin_naming_the_device(case: pk.Case) -> None:
    with pytest.raises(Exception) as caught:
        pk.verify_case(case, mesh=pk.abstract_ring(case.row.devices))
    pk.assert_caught(case, caught.value)


def test_the_leak_is_reported_on_slot_1_only() -> None:
    """The rebuilt wait on sems.at[0] balances slot 0; only slot 1 is left over."""
    case = next(c for c in BROKEN if c.row.name == "per_slot_leak" and c.flavour == "pltpu")
    with pytest.raises(SimulationError) as caught:
        pk.verify_case(case, mesh=pk.abstract_ring(case.row.devices))
    message = str(caught.value)
    assert "sems[1]" in message or "sems.at[1]" in message or "sems 1" in message, message
    assert "sems[0]" not in message and "sems.at[0]" not in message, message


@pytest.mark.parametrize(
    "case", pk.params([c for c in pk.CASES if c.flavour == "safedma" and not c.is_bug])
)
def test_no_trace_time_check_rejects_a_kernel_verify_proves_sound(case: pk.Case) -> None:
    # Tracing alone runs every trace-time check (sd.pallas_call's kernel scope).
    pk.trace(case, simulated_mesh(case.row.devices, pk.AXIS))


def test_the_trace_time_checks_catch_the_per_slot_leak() -> None:
    """Per-slot matching: a started_elsewhere() wait on sems.at[0] never discharges sems.at[1]."""
    case = next(c for c in BROKEN if c.row.name == "per_slot_leak" and c.flavour == "safedma")
    with pytest.raises(sd.CopyNeverWaitedError, match=r"protocol_kernels\.py:\d+: wait\(\) never"):
        pk.trace(case, simulated_mesh(case.row.devices, pk.AXIS))


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id) for c in CORRECT if c.flavour == "pltpu"]
)
def test_simulate_agrees_the_correct_kernels_are_clean(case: pk.Case) -> None:
    simulate(
        case.program(),
        pk.example(case.row, case.row.devices),
        mesh=simulated_mesh(case.row.devices, pk.AXIS),
        timeout_s=10,
    )


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in BROKEN if c.flavour == "pltpu"])
def test_simulate_catches_the_broken_twins_too(case: pk.Case) -> None:
    with pytest.raises(SimulationError) as caught:
        simulate(
            case.program(),
            pk.example(case.row, case.row.devices),
            mesh=simulated_mesh(case.row.devices, pk.AXIS),
            timeout_s=5,
        )
    assert type(caught.value).__name__ == case.row.simulate_bug
