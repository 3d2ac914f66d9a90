"""Barriers and signals between devices: barrier semaphores, ``collective_id``, second
rounds on REGULAR semaphores, signals that must land while the target is in the kernel.

* R8, a signal device 0 sends once device 1 said it is done, which device 1 never waits
  (written for this suite);
* R10, a ring permute behind one barrier round, invoked twice on a ring of five: a
  neighbour's next call can pass the barrier for us; the fix is jax's own (PR #27963), a
  second round on a REGULAR semaphore.
"""

from __future__ import annotations

from typing import Any

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import ALL, AXIS, Pair, caught, dma, neighbour, send_right, write_out
from tests.corpus._calls import on_ring
from tests.corpus._case import OK, Case

D = sd.DataRef
S = sd.SemRef

# ---------------------------------------------------------------- R8: signal after exit


def r8_signal_after_exit_pltpu(
    x_ref: Any, o_ref: Any, sem: Any, ready: Any, late: Any, *, bug: bool
) -> None:
    """Device 0 signals device 1's ``late`` once device 1 said it is done: in the bug
    nobody waits it."""
    write_out(x_ref, o_ref, sem)
    me = lax.axis_index(AXIS)

    @pl.when(me == 1)
    def _done() -> None:
        pl.semaphore_signal(ready, 1, device_id={AXIS: 0})
        if not bug:
            pl.semaphore_wait(late, 1)

    @pl.when(me == 0)
    def _late() -> None:
        pl.semaphore_wait(ready, 1)
        pl.semaphore_signal(late, 1, device_id={AXIS: 1})  # fix: r8_signal_after_exit


def r8_signal_after_exit_safedma(
    x_ref: D, o_ref: D, sem: S, ready: sd.RegularSem, late: sd.RegularSem, *, bug: bool
) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start().wait()
    me = sd.my_index(AXIS)

    @pl.when(me == 1)
    def _done() -> None:
        sd.signal(ready, 1, device=sd.device(x=0))
        if not bug:  # the bug exits without waiting the late signal
            sd.wait(late, 1)

    @pl.when(me == 0)
    def _late() -> None:
        sd.wait(ready, 1)
        sd.signal(late, 1, device=sd.device(x=1))  # fix: r8_signal_after_exit


# ---------------------------------------------------------------- R10: barrier reuse


def _barrier_round_pltpu(sem: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=neighbour(1))  # fix: r10_one_round
    pl.semaphore_signal(sem, 1, device_id=neighbour(-1))  # fix: r10_one_round
    pl.semaphore_wait(sem, 2)  # fix: r10_one_round


def r10_one_round_pltpu(
    x_ref: Any, o_ref: Any, send: Any, recv: Any, second: Any, *, bug: bool
) -> None:
    """A ring permute behind one barrier round in the bug: a neighbour's next call can pass
    it for us. The fix (jax PR #27963) adds a second round on a REGULAR semaphore."""
    _barrier_round_pltpu(pltpu.get_barrier_semaphore())
    if not bug:
        _barrier_round_pltpu(second)
    send_right(x_ref, o_ref, send, recv)


def _barrier_round_safedma(sem: sd.BarrierSem | sd.RegularSem) -> None:
    sd.signal(sem, 1, device=sd.neighbour(AXIS, 1))  # fix: r10_one_round
    sd.signal(sem, 1, device=sd.neighbour(AXIS, -1))  # fix: r10_one_round
    sd.wait(sem, 2)  # fix: r10_one_round


def r10_one_round_safedma(
    x_ref: D, o_ref: D, send: S, recv: S, second: sd.RegularSem, *, bug: bool
) -> None:
    _barrier_round_safedma(sd.barrier_semaphore())
    if not bug:  # jax PR #27963's fix: a second round on a REGULAR semaphore
        _barrier_round_safedma(second)
    copy = sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send)  # fix: r10_one_round
    copy.to(sd.neighbour(AXIS)).start().wait()  # fix: r10_one_round


PAIRS = (
    # Depends on the schedule under simulate: the late signal is seen only if it lands
    # before device 1's exit check.
    Pair(
        "r8_signal_after_exit",
        "R8",
        "silent",
        lambda: [*dma(), pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR],
        r8_signal_after_exit_safedma,
        r8_signal_after_exit_pltpu,
        caught(
            r"Leftover|AfterExit|Late|Exit",
            r"(?i)after .*(left|exit)|not back to zero|at (kernel )?exit",
            ("x=1",),
            ("late",),
            r"(?i)wait",
        ),
        simulate_bug=None,
    ),
    # Five devices: on a ring of four or fewer one round is safe across calls (a
    # device's barrier wait then implies its right neighbour entered the call; see
    # tests/testing/verify/test_engine_protocols.py::test_r10_single_barrier_reused_across_calls).
    Pair(
        "r10_one_round",
        "R10",
        "silent",
        lambda: [*dma(2), pltpu.SemaphoreType.REGULAR],
        r10_one_round_safedma,
        r10_one_round_pltpu,
        caught(
            r"Race|Barrier|Entry|Entered|AfterExit|Unsatisfiable|Leftover",
            r"(?i)barrier|collective_id|invocation|entered|second round",
            ALL,
            ("o_ref", "recv", "barrier"),
            r"(?i)second (barrier )?round|barrier",
        ),
        provenance="jax Pallas distributed guide (the second barrier round of jax PR #27963)",
        collective_id=0,
        invocations=2,
        devices=5,
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("barriers")]


# ---------------------------------------------------------------- signals to LOGICAL ids


def logical_signal(x: D, o: D, flag: sd.RegularSem) -> None:
    sd.signal(flag, device=sd.logical_device(0))
    sd.wait(flag)


def logical_signal_raw(x: Any, o: Any, flag: Any) -> None:
    pl.semaphore_signal(flag, 1, device_id=0, device_id_type=pl.DeviceIdType.LOGICAL)
    pl.semaphore_wait(flag, 1)


CASES += [
    Case(
        "signal_to_a_logical_device",
        "barriers",
        "jax Pallas distributed guide (LOGICAL device ids), written for this suite",
        lambda: on_ring(logical_signal, [sd.regular_semaphore()]),
        {"mosaic": OK},
        twin=lambda: on_ring(logical_signal_raw, [pltpu.SemaphoreType.REGULAR(())], checked=False),
    ),
]
