"""Barriers and signals between devices: barrier semaphores, ``collective_id``, second
rounds on REGULAR semaphores, signals that must land while the target is in the kernel.

* R8, a signal device 0 sends once device 1 said it is done, which device 1 never waits
  (written for this suite);
* R10, a ring permute behind one barrier round, invoked twice on a ring of five: a
  neighbour's next call can pass the barrier for us; the fix is jax's own (PR #27963), a
  second round on a REGULAR semaphore;
* a missing barrier: with a ``collective_id`` Mosaic runs no device barrier, and a
  kernel that sends to both ring neighbours before any barrier round may write into a
  neighbour that has not entered the kernel; the message names the first remote copy,
  where the barrier belongs (written for this suite).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels.reduce_scatter import neighbour_barrier
from tests.corpus._blocks import (
    ALL,
    AXIS,
    BLOCK,
    F32,
    RING,
    Pair,
    caught,
    dma,
    first,
    kernel_call,
    neighbour,
    second,
    send_right,
    write_out,
)
from tests.corpus._calls import on_ring
from tests.corpus._case import OK, Case, Ok, Program, Raises, ring

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


# ---------------------------------------------------------------- a missing barrier


def missing_barrier_pltpu(x_ref: Any, o_ref: Any, send: Any, recv: Any, *, bug: bool) -> None:
    """Each device sends its first chunk into its right neighbour's ``o_ref`` and its
    second into its left neighbour's. With a collective_id Mosaic runs no device barrier:
    the bug starts the copies before any barrier round, so a neighbour may not have
    entered the kernel yet."""
    if not bug:
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=neighbour(-1))
        pl.semaphore_signal(barrier, 1, device_id=neighbour(1))
        pl.semaphore_wait(barrier, 2)
    right = pltpu.make_async_remote_copy(
        first(x_ref), first(o_ref), send.at[0], recv.at[0], device_id=neighbour(1)
    )
    left = pltpu.make_async_remote_copy(
        second(x_ref), second(o_ref), send.at[1], recv.at[1], device_id=neighbour(-1)
    )
    right.start()  # fix: missing_barrier
    left.start()
    right.wait()
    left.wait()


def missing_barrier_safedma(
    x_ref: D, o_ref: D, send: sd.SemArray, recv: sd.SemArray, *, bug: bool
) -> None:
    if not bug:  # the bug sends before the neighbours are known to be in the kernel
        neighbour_barrier(AXIS)
    right = sd.RemoteCopy(first(x_ref), first(o_ref), recv.at[0]).with_send_sem(send.at[0])
    left = sd.RemoteCopy(second(x_ref), second(o_ref), recv.at[1]).with_send_sem(send.at[1])
    sent_right = right.to(sd.neighbour(AXIS)).start()  # fix: missing_barrier
    sent_left = left.to(sd.neighbour(AXIS, -1)).start()
    sent_right.wait()
    sent_left.wait()


def _missing_barrier(kernel: Any, *, safedma: bool, bug: bool) -> Program:
    body = functools.partial(kernel, bug=bug)
    functools.update_wrapper(body, kernel)
    per_device = kernel_call(
        body,
        lambda: [pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))],
        name=f"missing_barrier_{'bug' if bug else 'fix'}",
        safedma=safedma,
        collective_id=0,
    )
    spec = jax.ShapeDtypeStruct((BLOCK[0] * RING, BLOCK[1]), F32)
    return Program(per_device, (spec,), ring(RING, AXIS))


_NO_BARRIER = Raises(
    "SignalAfterExitError",
    matches=(r"before it has entered", r"a barrier belongs before this access, at \S+:\d+"),
    one_of=(ALL, ("o_ref",)),
    says=("get_barrier_semaphore", "neighbour_barrier"),
    kind="SimulationError",
)

CASES += [
    Case(
        f"missing_barrier-{variant}-{flavour}",
        "barriers",
        "written for this suite",
        functools.partial(
            _missing_barrier,
            missing_barrier_safedma if flavour == "safedma" else missing_barrier_pltpu,
            safedma=flavour == "safedma",
            bug=variant == "bug",
        ),
        {"verify": _NO_BARRIER if variant == "bug" else Ok(report={"devices": RING})},
        sources=(Path(__file__),),
        fix="missing_barrier",
        tags=frozenset(
            {"missing_barrier", flavour, variant} | ({"bug"} if variant == "bug" else set())
        ),
    )
    for variant in ("bug", "fix")
    for flavour in ("pltpu", "safedma")
]
