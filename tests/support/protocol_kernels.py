"""Protocol cases for ``safedma.testing.verify``: each DMA mistake of MISUSE.md R5-R10, the
shared-semaphore early wait, the per-slot leak and the three trace-time false alarms.

Every case exists as a bug and a fix, each written in raw pltpu (bodies in
protocol_kernels_pltpu.py) and in safedma (bodies here), so four
:class:`Case` objects per row. A case knows its pallas_call set-up, the mesh
it runs on (a ring of ``RING`` devices along ``"x"``), how often it is
invoked back to back, what ``verify`` must say (:class:`Expect`, or clean)
and what ``simulate`` says today (the silent classes pass it).

The lines a verify error must point at carry ``# verify: <marker>`` comments;
:func:`marked_lines` reads them back, so the tests follow the code.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.support import protocol_kernels_pltpu as raw

CHUNK = raw.CHUNK
AXIS = raw.AXIS
RING = 4
BLOCK = (2 * CHUNK, 128)
F32 = jnp.float32
HBM = pl.BlockSpec(memory_space=pl.ANY)
VMEM_BLOCK = pl.BlockSpec(memory_space=pltpu.VMEM)
Kernel = Callable[..., None]


# ====================================================================== safedma bodies
#
# One function a row, its mistake behind ``bug``: Case.kernel binds ``bug=True`` for
# the bug and ``bug=False`` for the fix, so the two differ in nothing else.

D = sd.DataRef
S = sd.SemRef


def _first(x_ref: D) -> D:
    return x_ref.at[pl.ds(0, CHUNK)]


def _second(x_ref: D) -> D:
    return x_ref.at[pl.ds(CHUNK, CHUNK)]


def _read_chunks(
    wait_first: Callable[[], object], wait_second: Callable[[], object], bufs: D, res: D
) -> None:
    """Wait chunk 0 and read it, then chunk 1: the reads a wrong wait leaves unguarded."""
    wait_first()  # verify: r7 r9 early_wait
    res[pl.ds(0, CHUNK)] = bufs[0] * 2.0  # verify: r7 r9 early_wait
    wait_second()
    res[pl.ds(CHUNK, CHUNK)] = bufs[1] * 2.0


def r5_static(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    sd.LocalCopy(x_ref, o_ref, sems.at[2 if bug else 1]).start().wait()  # verify: r5_static


def r5_per_device(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    me = sd.my_index(AXIS)
    slot = me if bug else me % 2
    sd.LocalCopy(x_ref, o_ref, sems.at[slot]).start().wait()  # verify: r5_per_device


def r6_unwritten_staging(
    x_ref: D, o_ref: D, stage: D, send: S, recv: S, local: S, *, bug: bool
) -> None:
    if not bug:  # the bug sends the staging buffer nothing wrote
        sd.LocalCopy(x_ref, stage, local).start().wait()
    copy = sd.RemoteCopy(stage, o_ref, recv).with_send_sem(send)  # verify: r6
    copy.to(sd.neighbour(AXIS)).start().wait()  # verify: r6


def r7_wrong_slot(
    x_ref: D, o_ref: D, bufs: D, res: D, sems: sd.SemArray, out_sem: S, *, bug: bool
) -> None:
    first = sd.LocalCopy(_first(x_ref), bufs.at[0], sems.at[0]).start()
    second = sd.LocalCopy(_second(x_ref), bufs.at[1], sems.at[1]).start()
    if bug:  # each wait rebuilt on the other slot: the counts balance, chunk 0 is unguarded
        first = sd.LocalCopy(_first(x_ref), bufs.at[0], sems.at[1]).started_elsewhere()
        second = sd.LocalCopy(_second(x_ref), bufs.at[1], sems.at[0]).started_elsewhere()
    _read_chunks(first.wait, second.wait, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


def r8_signal_after_exit(
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
        sd.signal(late, 1, device=sd.device(x=1))  # verify: r8


def r9_shared_sem(x_ref: D, o_ref: D, bufs: D, res: D, sem: S, out_sem: S, *, bug: bool) -> None:
    a = sd.LocalCopy(_first(x_ref), bufs.at[0], sem).start()
    b = sd.LocalCopy(_second(x_ref), bufs.at[1], sem).start()
    if bug:  # two same-sized copies on one semaphore: a's wait may count b's bytes
        _read_chunks(a.wait, b.wait, bufs, res)
    else:
        _read_chunks(lambda: sd.wait_all_into(bufs, sem), lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


def early_wait(
    x_ref: D, o_ref: D, bufs: D, res: D, send: S, sem: S, out_sem: S, *, bug: bool
) -> None:
    local = sd.LocalCopy(_first(x_ref), bufs.at[0], sem).start()
    remote = (
        sd.RemoteCopy(_second(x_ref), bufs.at[1], sem)
        .with_send_sem(send)
        .to(sd.neighbour(AXIS))
        .start()
    )

    def both() -> None:  # the local fetch and the neighbour's copy: all 8 KiB
        sd.wait_all_into(bufs, sem)
        remote.wait_send()

    if bug:  # sem counts both copies: the local wait returns on the neighbour's bytes
        _read_chunks(local.wait, remote.wait, bufs, res)
    else:
        _read_chunks(both, lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


def _barrier_round(sem: sd.BarrierSem | sd.RegularSem) -> None:
    sd.signal(sem, 1, device=sd.neighbour(AXIS, 1))  # verify: r10
    sd.signal(sem, 1, device=sd.neighbour(AXIS, -1))  # verify: r10
    sd.wait(sem, 2)  # verify: r10


def r10_one_round(
    x_ref: D, o_ref: D, send: S, recv: S, second: sd.RegularSem, *, bug: bool
) -> None:
    _barrier_round(sd.barrier_semaphore())
    if not bug:  # jax PR #27963's fix: a second round on a REGULAR semaphore
        _barrier_round(second)
    copy = sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send)  # verify: r10
    copy.to(sd.neighbour(AXIS)).start().wait()  # verify: r10


def per_slot_leak(x_ref: D, o_ref: D, bufs: D, sems: sd.SemArray, out_sem: S, *, bug: bool) -> None:
    first = sd.LocalCopy(_first(x_ref), bufs.at[0], sems.at[0]).start()
    second = sd.LocalCopy(_second(x_ref), bufs.at[1], sems.at[1]).start()  # verify: leak
    if bug:  # the wait on slot 0 is rebuilt; the copy on slot 1 is never waited
        sd.LocalCopy(_first(x_ref), bufs.at[0], sems.at[0]).started_elsewhere().wait()
    else:
        first.wait()
        second.wait()
    sd.LocalCopy(x_ref, o_ref, out_sem).start().wait()


def cond_each_branch(x_ref: D, o_ref: D, sem: S, *, bug: bool) -> None:
    handle = sd.LocalCopy(x_ref, o_ref, sem).start()  # verify: cond_each_branch

    def wait() -> None:  # a branch returns nothing; handle.wait() returns the buffer
        handle.wait()

    lax.cond(sd.my_index(AXIS) % 2 == 0, wait, (lambda: None) if bug else wait)


def when_not_when(x_ref: D, o_ref: D, sem: S, *, bug: bool) -> None:
    handle = sd.LocalCopy(x_ref, o_ref, sem).start()
    me = sd.my_index(AXIS)
    even = me % 2 == 0

    def wait() -> None:
        handle.wait()  # verify: when_not_when

    pl.when(even)(wait)  # verify: when_not_when
    # The bug's second condition overlaps the first on device 2: it waits twice.
    pl.when(me >= 1 if bug else jnp.logical_not(even))(wait)  # verify: when_not_when


def writeback(x_ref: D, o_ref: D, bufs: D, sems: sd.SemArray, *, bug: bool) -> None:
    steps = x_ref.shape[0] // CHUNK

    def write_back(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        return sd.LocalCopy(bufs.at[slot], o_ref.at[pl.ds(step * CHUNK, CHUNK)], sems.at[slot])

    def body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step > 0)
        def _previous() -> None:
            write_back(step - 1, 1 - slot).started_elsewhere().wait()

        bufs[slot] = x_ref[pl.ds(step * CHUNK, CHUNK)] * 2.0
        own = write_back(step, slot).start()  # verify: writeback
        if not bug:  # the bug never waits the last step's own write-back

            @pl.when(step == steps - 1)
            def _last() -> None:
                own.wait()

        return carry

    lax.fori_loop(0, steps, body, None)


def credit_ring(
    x_ref: D,
    o_ref: D,
    bufs: D,
    res: D,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    credits: sd.RegularSem,
    out_sem: S,
    *,
    bug: bool,
) -> None:
    messages = raw.CREDIT_MESSAGES
    rows = x_ref.shape[0] // messages

    def message(t: int) -> sd.RemoteCopy[sd.Given, sd.Given]:
        slot = t % 2
        return (
            sd.RemoteCopy(x_ref.at[pl.ds(t * rows, rows)], bufs.at[slot], recv_sems.at[slot])
            .with_send_sem(send_sems.at[slot])
            .to(sd.neighbour(AXIS))
        )

    sd.signal(credits, 2, device=sd.neighbour(AXIS, -1))
    for t in range(messages):
        if not bug or t < 2:  # the bug skips the credit wait from message 2 on
            sd.wait(credits, 1)
        if t >= 2:
            message(t - 2).started_elsewhere().wait_send()
        message(t).start().wait_recv()  # verify: credit_ring
        res[pl.ds(t * rows, rows)] = bufs[t % 2]  # verify: credit_ring
        if t + 2 < messages:
            sd.signal(credits, 1, device=sd.neighbour(AXIS, -1))
    for t in range(max(messages - 2, 0), messages):
        message(t).started_elsewhere().wait_send()
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


# ====================================================================== expectations


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a verify error for a bug must say.

    ``classes`` is a regex one of the error's class names (its MRO) must
    match, the error must be a ``SimulationError``; ``message`` a regex for
    the mistake; ``devices`` the mesh coordinates (``"x=2"``) of the devices
    that make the mistake, one of which must be named; ``names`` kernel parameter names of which one must be named;
    ``marker`` the ``# verify:`` marker of the user's lines, one of which
    must be named as ``file.py:LINE``; ``fix`` a regex for the advice.
    """

    row: str
    classes: str
    message: str
    devices: tuple[str, ...]
    names: tuple[str, ...]
    marker: str
    fix: str


ALL = tuple(f"x={i}" for i in range(4))  # a ring of RING = 4
_RACE = r"^RaceDetectedError$"
_LEFT = r"^LeftoverSemaphoreError$"

EXPECT: dict[str, Expect] = {
    "r5_static": Expect(
        "R5",
        r"Range|Bounds|Index",
        r"(?i)out of (range|bounds)|outside",
        ALL,
        ("sems",),
        "r5_static",
        r"(?i)dma_semaphores\(3\)|index|semaphores",
    ),
    "r5_per_device": Expect(
        "R5",
        r"Range|Bounds|Index",
        r"(?i)out of (range|bounds)|outside",
        ("x=2", "x=3"),
        ("sems",),
        "r5_per_device",
        r"(?i)dma_semaphores\(4\)|index|semaphores",
    ),
    "r6_unwritten_staging": Expect(
        "R6",
        r"Race|Unwritten|Uninit|NeverWritten|Unset",
        r"(?i)never written|nothing (ever )?wr|unwritten|"
        r"uninitiali[sz]ed|not written",
        ALL,
        ("stage",),
        "r6",
        r"(?i)writ|copy",
    ),
    "r7_wrong_slot": Expect(
        "R7", _RACE, r"(?i)race|not ordered|before", ALL, ("bufs",), "r7", r"(?i)wait"
    ),
    "r8_signal_after_exit": Expect(
        "R8",
        r"Leftover|AfterExit|Late|Exit",
        r"(?i)after .*(left|exit)|not back to zero|at (kernel )?exit",
        ("x=1",),
        ("late",),
        "r8",
        r"(?i)wait",
    ),
    "r9_shared_sem": Expect(
        "R9",
        _RACE,
        r"(?i)race|not ordered|before",
        ALL,
        ("bufs", "sem"),
        "r9",
        r"(?i)wait_all_into|separate|own semaphore|total|all",
    ),
    "early_wait": Expect(
        "R9",
        _RACE,
        r"(?i)race|not ordered|before",
        ALL,
        ("bufs", "sem"),
        "early_wait",
        r"(?i)wait_all_into|separate|own semaphore|total|all",
    ),
    "r10_one_round": Expect(
        "R10",
        r"Race|Barrier|Entry|Entered|AfterExit|Unsatisfiable|Leftover",
        r"(?i)barrier|collective_id|invocation|entered|second round",
        ALL,
        ("o_ref", "recv", "barrier"),
        "r10",
        r"(?i)second (barrier )?round|barrier",
    ),
    "per_slot_leak": Expect(
        "R4",
        _LEFT,
        r"(?i)not back to zero|leftover|never waited",
        ALL,
        ("sems",),
        "leak",
        r"(?i)wait",
    ),
    "cond_each_branch": Expect(
        "R2",
        r"Leftover|Race",
        r"(?i)not back to zero|never waited|race",
        ("x=1", "x=3"),
        ("sem", "o_ref"),
        "cond_each_branch",
        r"(?i)wait",
    ),
    "when_not_when": Expect(
        "R3",
        r"Unsatisfiable|Deadlock",
        r"(?i)never|deadlock|blocked",
        ("x=2",),
        ("sem",),
        "when_not_when",
        r"(?i)wait|start|signal",
    ),
    "credit_ring": Expect(
        "R1",
        r"Race|Leftover|AfterExit",
        r"(?i)race|not ordered|not back to zero",
        ALL,
        ("bufs", "credits"),
        "credit_ring",
        r"(?i)wait|signal",
    ),
    "writeback": Expect(
        "R4",
        r"Leftover|Race",
        r"(?i)not back to zero|never waited|race",
        ALL,
        ("sems", "o_ref"),
        "writeback",
        r"(?i)wait",
    ),
}


# ====================================================================== cases


Scratch = Callable[[], list[Any]]


def _dma(n: int = 1) -> list[Any]:
    return [pltpu.SemaphoreType.DMA(()) for _ in range(n)]


def _chunks() -> Any:
    return pltpu.VMEM((2, CHUNK, BLOCK[1]), F32)


def _block() -> Any:
    return pltpu.VMEM(BLOCK, F32)


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of cases: its scratch (pltpu form, used by both flavours) and call set-up."""

    name: str
    scratch: Scratch
    kind: str  # "silent" (simulate passes the bug), "leak", "false_alarm"
    x_in_vmem: bool = False
    collective_id: int | None = None
    invocations: int = 1
    rows: int = BLOCK[0]
    simulate_bug: str = "clean"  # what simulate says of the bug today
    devices: int = RING  # the ring the row's cases run on


ROWS: tuple[Row, ...] = (
    Row(
        "r5_static",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        "silent",
        simulate_bug="KernelFailedError",
    ),
    Row(
        "r5_per_device",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        "silent",
        simulate_bug="KernelFailedError",
    ),
    Row("r6_unwritten_staging", lambda: [_block(), *_dma(3)], "silent"),
    # The race detector's vector clocks see this one: the wait on slot 1 orders
    # nothing with the copy into slot 0.
    Row(
        "r7_wrong_slot",
        lambda: [_chunks(), _block(), pltpu.SemaphoreType.DMA((2,)), *_dma()],
        "silent",
        simulate_bug="RaceDetectedError",
    ),
    # Depends on the schedule: the late signal is seen only if it lands before
    # device 1's exit check.
    Row(
        "r8_signal_after_exit",
        lambda: [*_dma(), pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.REGULAR],
        "silent",
        simulate_bug="schedule-dependent",
    ),
    Row("r9_shared_sem", lambda: [_chunks(), _block(), *_dma(2)], "silent"),
    # Depends on the schedule: simulate orders a wait after the signals it consumes in
    # arrival order, so the bug is seen only when the neighbour's copy lands before the
    # local one (device threads race for that).
    Row(
        "early_wait",
        lambda: [_chunks(), _block(), *_dma(3)],
        "silent",
        simulate_bug="schedule-dependent",
    ),
    # Five devices: on a ring of four or fewer one round is safe across calls (a
    # device's barrier wait then implies its right neighbour entered the call; see
    # test_engine_protocols.py::test_r10_single_barrier_reused_across_calls).
    Row(
        "r10_one_round",
        lambda: [*_dma(2), pltpu.SemaphoreType.REGULAR],
        "silent",
        collective_id=0,
        invocations=2,
        devices=5,
    ),
    Row(
        "per_slot_leak",
        lambda: [_chunks(), pltpu.SemaphoreType.DMA((2,)), *_dma()],
        "leak",
        simulate_bug="LeftoverSemaphoreError",
    ),
    Row("cond_each_branch", lambda: _dma(), "false_alarm", simulate_bug="RaceDetectedError"),
    Row("when_not_when", lambda: _dma(), "false_alarm", simulate_bug="UnsatisfiableWaitError"),
    Row(
        "writeback",
        lambda: [_chunks(), pltpu.SemaphoreType.DMA((2,))],
        "false_alarm",
        x_in_vmem=True,
        rows=4 * CHUNK,
        simulate_bug="RaceDetectedError",
    ),
)
ROW = {r.name: r for r in ROWS}
# Flow control by credits on a REGULAR semaphore (safedma's reduce-scatter and
# all-reduce use it): reusing a receive slot is safe because the credit that allows
# it is issued after the slot was read.
ROWS += (
    Row(
        "credit_ring",
        lambda: [
            pltpu.VMEM((2, CHUNK, BLOCK[1]), F32),
            pltpu.VMEM((6 * CHUNK, BLOCK[1]), F32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.REGULAR,
            *_dma(),
        ],
        "false_alarm",
        rows=6 * CHUNK,
        simulate_bug="RaceDetectedError",
    ),
)
ROW["credit_ring"] = ROWS[-1]

# Correct spellings that safedma's trace-time checks reject (none since the checks
# reject only what is wrong on every path); a safedma case listed here is xfail(strict).
TRACE_REJECTS: dict[str, str] = {}

# Bugs that safedma's trace-time checks already reject, for a reason that is the
# real mistake on some device; verify re-raises trace errors unchanged.
TRACE_CATCHES: dict[str, str] = {
    # The rebuilt wait on sems.at[0] cannot stand for the copy on sems.at[1]: no path waits it.
    "per_slot_leak-bug": "CopyNeverWaitedError",
    # A static index outside the array is rejected when the copy is described.
    "r5_static-bug": "SemaphoreIndexError",
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel of a row: ``variant`` "bug" or "fix" ("ok" for a false alarm's correct form)."""

    row: Row
    flavour: str  # "pltpu" or "safedma"
    variant: str

    @property
    def id(self) -> str:
        return f"{self.row.name}-{self.variant}-{self.flavour}"

    @property
    def is_bug(self) -> bool:
        return self.variant == "bug"

    @property
    def expect(self) -> Expect | None:
        return EXPECT[self.row.name] if self.is_bug else None

    @property
    def name(self) -> str:
        return f"{self.row.name}_{self.variant}"

    @property
    def kernel(self) -> Kernel:
        """The row's kernel with its mistake in (``bug=True``) or out."""
        body = getattr(raw, self.row.name) if self.flavour == "pltpu" else globals()[self.row.name]
        return functools.partial(body, bug=self.is_bug)

    @property
    def source(self) -> Path:
        return Path(raw.__file__ if self.flavour == "pltpu" else __file__)

    @property
    def trace_rejects(self) -> str | None:
        """Why safedma's trace checks reject this correct safedma spelling today, if they do."""
        if self.flavour != "safedma":
            return None
        return TRACE_REJECTS.get(f"{self.row.name}-{self.variant}")

    @property
    def trace_catch(self) -> str | None:
        """The trace-time error class that already catches this safedma bug, if any."""
        if self.flavour != "safedma":
            return None
        return TRACE_CATCHES.get(f"{self.row.name}-{self.variant}")

    def per_device(self) -> Callable[[jax.Array], jax.Array]:
        """The kernel as a per-device function of one block (safedma: through sd.pallas_call)."""
        return kernel_call(self.kernel, self.row, name=self.name, safedma=self.flavour == "safedma")

    def program(self) -> Callable[[jax.Array], jax.Array]:
        """``per_device`` called ``invocations`` times in a row (for simulate, which has no
        ``invocations=``)."""
        once = self.per_device()
        count = self.row.invocations

        def repeated(x: jax.Array) -> jax.Array:
            for _ in range(count):
                x = once(x)
            return x

        return once if count == 1 else repeated


def _variants(row: Row) -> tuple[str, str]:
    return ("bug", "ok") if row.kind == "false_alarm" else ("bug", "fix")


CASES: tuple[Case, ...] = tuple(
    Case(row, flavour, variant)
    for row in ROWS
    for variant in _variants(row)
    for flavour in ("pltpu", "safedma")
)


def cases(
    *, kind: str | None = None, variant: str | None = None, flavour: str | None = None
) -> list[Case]:
    return [
        c
        for c in CASES
        if (kind is None or c.row.kind == kind)
        and (variant is None or c.variant == variant)
        and (flavour is None or c.flavour == flavour)
    ]


def kernel_call(
    kernel: Kernel, row: Row, *, name: str, safedma: bool
) -> Callable[[jax.Array], jax.Array]:
    params = (
        pltpu.CompilerParams(collective_id=row.collective_id)
        if row.collective_id is not None
        else None
    )
    in_spec = VMEM_BLOCK if row.x_in_vmem else HBM

    def per_device(x: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        extra: dict[str, Any] = {} if params is None else {"compiler_params": params}
        if safedma:
            result: jax.Array = sd.pallas_call(
                kernel,
                out,
                in_specs=[in_spec],
                out_specs=HBM,
                scratch_shapes=row.scratch(),
                name=name,
                **extra,
            )(x)
        else:
            result = pl.pallas_call(
                kernel,
                out_shape=out,
                in_specs=[in_spec],
                out_specs=HBM,
                scratch_shapes=row.scratch(),
                name=name,
                **extra,
            )(x)
        return result

    return per_device


# ====================================================================== inputs and meshes


def global_shape(row: Row, devices: int = RING) -> tuple[int, int]:
    return (row.rows * devices, BLOCK[1])


def example(row: Row, devices: int = RING) -> jax.Array:
    shape = global_shape(row, devices)
    return jnp.arange(int(np.prod(shape)), dtype=F32).reshape(shape)


def spec(row: Row, devices: int = RING) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(global_shape(row, devices), F32)


def verify(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``safedma.testing.verify(fn, *args, **kwargs)``.

    Imported at the call, not at module level, so a missing engine fails each
    test that needs it and leaves the simulate-side tests running. Until the
    face exports it, the engine's own module is used
    (test_messages.py checks the export).
    """
    try:
        from safedma.testing import verify as run
    except ImportError:
        from safedma.testing._verify.face.api import verify as run
    return run(fn, *args, **kwargs)


def verify_case(case: Case, *, mesh: Any, devices: int | None = None) -> Any:
    """``verify`` of ``case`` on ``mesh`` (``devices`` of them, by default the row's ring)
    with its invocation count.

    On a device-free mesh the argument is a ShapeDtypeStruct, on a real
    (simulated) mesh an array, as a user would pass to simulate.
    """
    from jax.sharding import Mesh

    devices = case.row.devices if devices is None else devices
    x = example(case.row, devices) if isinstance(mesh, Mesh) else spec(case.row, devices)
    return verify(case.per_device(), x, mesh=mesh, invocations=case.row.invocations)


def trace(case: Case, mesh: Any) -> None:
    """Trace ``case`` under shard_map on ``mesh``: runs every trace-time check, nothing else."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    mapped = jax.shard_map(
        case.program(), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False
    )
    shape = global_shape(case.row, int(np.prod(mesh.devices.shape)))
    jax.jit(mapped).trace(jax.ShapeDtypeStruct(shape, F32, sharding=NamedSharding(mesh, P(AXIS))))


def abstract_ring(devices: int = RING) -> Any:
    from safedma.testing import abstract_mesh

    return abstract_mesh((devices,), (AXIS,))


# ====================================================================== message checks


@functools.cache
def marked_lines(path: Path, marker: str) -> tuple[int, ...]:
    """Line numbers in ``path`` carrying ``# verify: <marker>`` (one of the markers
    a shared line lists, ``# verify: r7 r9``)."""
    pattern = re.compile(rf"#\s*verify:(?:\s+\S+)*?\s+{re.escape(marker)}(?:\s+\S+)*\s*$")
    lines = path.read_text().splitlines()
    found = tuple(i + 1 for i, line in enumerate(lines) if pattern.search(line))
    if not found:
        raise LookupError(f"no '# verify: {marker}' line in {path}")
    return found


def names_line(message: str, path: Path, lines: Sequence[int]) -> bool:
    """Whether ``message`` names ``path`` at one of ``lines`` (``file.py:LINE``)."""
    alternatives = "|".join(str(n) for n in lines)
    return (
        re.search(rf"{re.escape(path.name)}\"?(?::|, line )(?:{alternatives})\b", message)
        is not None
    )


def class_names(error: BaseException) -> list[str]:
    return [k.__name__ for k in type(error).__mro__]


def problems(error: BaseException, expect: Expect, source: Path) -> list[str]:
    """Everything the error fails to say that ``expect`` asks for (empty when right)."""
    from safedma.testing import SimulationError

    message = str(error)
    found: list[str] = []
    if not isinstance(error, SimulationError):
        found.append(f"{type(error).__name__} is not a SimulationError")
    if not any(re.search(expect.classes, n) for n in class_names(error)):
        found.append(f"class {type(error).__name__} does not match {expect.classes!r}")
    if not re.search(expect.message, message):
        found.append(f"the mistake ({expect.message!r}) is not described")
    if not any(re.search(rf"\b{re.escape(d)}\b", message) for d in expect.devices):
        found.append(f"none of the devices {expect.devices} is named")
    if not any(re.search(rf"\b{re.escape(n)}\b", message) for n in expect.names):
        found.append(f"none of the parameters {expect.names} is named")
    if not names_line(message, source, marked_lines(source, expect.marker)):
        found.append(
            f"the user's line ({source.name}:{marked_lines(source, expect.marker)}) is not named"
        )
    if not re.search(expect.fix, message):
        found.append(f"no fix ({expect.fix!r}) is given")
    if re.search(r"safedma/(testing/_verify|_copies|_semaphores)[^\s]*\.py:\d+", message):
        found.append("a line inside safedma is given as the location")
    return found


# ====================================================================== pytest helpers


def params(selected: Sequence[Case]) -> list[Any]:
    """pytest params for ``selected``; correct safedma spellings the trace checks reject
    today are ``xfail(strict=True)`` with the reason."""
    import pytest

    out: list[Any] = []
    for case in selected:
        marks: list[Any] = []
        if case.trace_rejects:
            error = getattr(sd, case.trace_rejects.split(":")[0])
            marks.append(
                pytest.mark.xfail(
                    strict=True,
                    raises=error,
                    reason=f"trace-time false alarm: {case.trace_rejects}",
                )
            )
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


NOT_A_VERDICT = (ImportError, AttributeError, TypeError, NotImplementedError)
"""Errors that mean the engine is missing or could not take the program: never a verdict."""


def assert_caught(case: Case, error: BaseException) -> None:
    """``error`` is the right verdict for the bug ``case``, with everything the message owes."""
    expect = case.expect
    assert expect is not None, case.id
    if isinstance(error, NOT_A_VERDICT):
        raise error
    if case.trace_catch and type(error).__name__ == case.trace_catch:
        return  # safedma's trace check already rejects this spelling, for this mistake
    found = problems(error, expect, case.source)
    assert not found, (
        f"{case.id} ({expect.row}): verify raised {type(error).__name__}, "
        "but: " + "; ".join(found) + f"\n\nThe message:\n{error}"
    )


def assert_clean(report: Any, devices: int = RING) -> None:
    """A verify report of a clean run: there, and over every device when it says so."""
    assert report is not None
    found = getattr(report, "devices", None)
    if found is not None:
        assert (found if isinstance(found, int) else len(found)) == devices, report
