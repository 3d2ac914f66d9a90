"""What strict simulation reports: the errors, the records they carry, and their text.

Every error names what went wrong, where (the device, and the user's own line
when interpret mode knows it) and how to fix it.  The records are frozen
dataclasses so tests can assert on them without parsing the text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from safedma._errors import DeviceIdError, SafeDmaError

__all__ = [
    "ConcurrentInterpretError",
    "DeviceOutsideMeshError",
    "KernelFailedError",
    "LeftoverSemaphore",
    "LeftoverSemaphoreError",
    "NotEnoughDevicesError",
    "Race",
    "RaceDetectedError",
    "SemaphoreKind",
    "SimulationError",
    "SimulationTimeoutError",
    "SimulationUnsupportedError",
    "StuckWait",
    "UnsatisfiableWaitError",
]

SemaphoreKind = Literal["DMA", "REGULAR", "BARRIER"]


class SimulationError(SafeDmaError):
    """A kernel misbehaved under strict simulation; the message says where and how to fix it."""


class NotEnoughDevicesError(SimulationError):
    """The process has fewer host CPU devices than the simulated mesh needs."""


class SimulationUnsupportedError(SimulationError):
    """This JAX cannot simulate the run at all; refused before it starts, with the reason."""


class ConcurrentInterpretError(SimulationError):
    """Another interpret-mode kernel ran in this process while ``simulate`` was running.

    Interpret mode keeps one global simulated TPU per process, so two
    interpreted kernels at once would corrupt each other.
    """


@dataclasses.dataclass(frozen=True)
class Race:
    """One race found by interpret mode's race detector.

    ``accessor`` names who made the access that found the race (a device, or
    ``DMA #n`` for a copy); ``buffer`` is interpret mode's key of the ref:
    ``(memory space, buffer id, owning device, core)``; ``report`` is
    interpret mode's own description of both accesses; ``other_location`` is
    the user's line of the earlier access it raced with, when jax names one;
    ``name`` the kernel parameter whose memory it is (``o_ref``), when the program
    says.
    """

    access: Literal["read", "write"]
    accessor: str
    owner: str | None
    buffer: tuple[object, ...]
    location: str | None
    report: str
    other_location: str | None = None
    name: str | None = None


def _raced_with_output_copy(report: str) -> bool:
    """Whether the earlier access of jax's race report is its copy of the outputs.

    jax ends each access line of its report with the access's frame, or with
    ``pallas_call`` for the interpreter's own copy of a kernel's outputs once
    the body has returned.
    """
    accesses = [
        line.strip()
        for line in report.splitlines()
        if line.strip().startswith(("read of", "write of"))
    ]
    return len(accesses) > 1 and accesses[1].endswith("pallas_call")


class RaceDetectedError(SimulationError):
    """R1: a ref was touched while a copy that reads or writes it was in flight."""

    def __init__(self, races: Sequence[Race]) -> None:
        self.races = tuple(races)
        first = self.races[0]
        space = str(first.buffer[0]).upper() if first.buffer else ""
        # Spelled-out letters: "an HBM", "an SMEM", "a VMEM".
        article = "an" if space[:1] in tuple("AEFHILMNORSX") else "a"
        what = f"{article} {space} buffer" if space else "a buffer"
        if first.name:
            what = f"{space} buffer {first.name}" if space else f"buffer {first.name}"
        on = f" on {first.owner}" if first.owner else ""
        if first.location:
            where = f" at {first.location}"
        else:
            where = (
                " while copying the kernel's outputs back after the body "
                "returned (a copy into an output was still in flight)"
            )
        other = f" (the copy or access at {first.other_location})" if first.other_location else ""
        ordered = f" is not ordered after a copy that touches the same memory{other}"
        if first.location and _raced_with_output_copy(first.report):
            # The earlier access is the interpreter copying the outputs back:
            # that device's body had returned with this copy still to land.
            ordered = (
                f" landed after the kernel body of {first.owner or 'that device'} had "
                "returned (its outputs were already being copied back): the receiving "
                "side never waited for this copy, a wait_recv (or wait) is missing there"
            )
        # The vector clocks in jax's report are object reprs (0.12) or raw
        # counters (0.10): noise for a reader, so they are left out here.
        report = "\n".join(
            line
            for line in first.report.rstrip().splitlines()
            if not line.strip().startswith("clock:")
        )
        super().__init__(
            f"data race (R1): a {first.access} of {what}{on} by {first.accessor}"
            f"{where}{ordered}. A "
            "copy's destination may be read only after its wait, and its source "
            "overwritten only after its wait (wait_send for a remote copy).\n\n"
            f"Interpret mode's report:\n{report}"
        )


@dataclasses.dataclass(frozen=True)
class LeftoverSemaphore:
    """A semaphore whose count was not zero on a device when the kernel returned.

    ``count`` is in bytes for a DMA semaphore; ``kernel`` numbers the
    interpreted kernels of the run from 0; ``name`` is the kernel parameter
    (``sems[1]``), when the program says, else messages use ``semaphore_id``
    (interpret mode's number).
    """

    kernel: int
    device_id: int
    device: str
    semaphore_id: int
    kind: SemaphoreKind
    count: int
    hint: str
    name: str | None = None


class LeftoverSemaphoreError(SimulationError):
    """R2/R4: semaphores not back to zero at kernel exit; every one, on every device."""

    def __init__(self, leftovers: Sequence[LeftoverSemaphore]) -> None:
        self.leftovers = tuple(leftovers)
        lines: list[str] = []
        for item in self.leftovers:
            unit = " bytes" if item.kind == "DMA" else ""
            kernel = f"kernel {item.kernel}, " if item.kernel else ""
            lines.append(
                f"  {kernel}{item.device}: {item.kind} semaphore {item.name or item.semaphore_id} "
                f"holds {item.count}{unit}: {item.hint}"
            )
        n = len(self.leftovers)
        super().__init__(
            f"{n} semaphore count{'s' if n != 1 else ''} not back to zero at kernel "
            "exit (R2; on a TPU this crashes the program):\n" + "\n".join(lines)
        )


@dataclasses.dataclass(frozen=True)
class StuckWait:
    """A device that was waiting on a semaphore nothing could signal any more.

    ``value`` (what the wait needs) and ``count`` (what the semaphore held)
    are in bytes for a DMA wait; ``name`` is the kernel parameter waited on
    (``sems[1]``), when the program says.
    """

    device_id: int
    device: str
    semaphore_id: int
    kind: SemaphoreKind
    value: int
    count: int
    location: str | None
    hint: str
    name: str | None = None


class UnsatisfiableWaitError(SimulationError):
    """R3: a wait that can never be satisfied; on a TPU the kernel hangs.

    Reported as soon as every device is blocked and nothing left running
    could signal the semaphores they wait on; ``found_after_s`` says when.
    """

    def __init__(
        self, waits: Sequence[StuckWait], timeout_s: float, found_after_s: float | None = None
    ) -> None:
        self.waits = tuple(waits)
        self.timeout_s = timeout_s
        self.found_after_s = found_after_s
        lines: list[str] = []
        for w in self.waits:
            unit = " bytes" if w.kind == "DMA" else ""
            where = f" at {w.location}" if w.location else ""
            lines.append(
                f"  {w.device} waits{where} on {w.kind} semaphore {w.name or w.semaphore_id} "
                f"for {w.value}{unit}, the count is {w.count}: {w.hint}"
            )
        after = (
            f"found after {found_after_s:.1f} s of timeout_s={timeout_s:g} s"
            if found_after_s is not None
            else f"timeout_s={timeout_s:g} s"
        )
        super().__init__(
            "unsatisfiable wait (R3): every device is blocked and nothing left "
            f"running can signal what they wait for, so the kernel can never finish "
            f"({after}; on a TPU the kernel hangs):\n" + "\n".join(lines)
        )


class SimulationTimeoutError(SimulationError):
    """The run was still going at ``timeout_s``: slow, or stuck outside a semaphore wait.

    ``stopped`` is False when even the watchdog could not stop the run: its
    thread is left behind and the process should not run more simulations.
    """

    def __init__(self, message: str, stopped: bool) -> None:
        super().__init__(message)
        self.stopped = stopped


class KernelFailedError(SimulationError):
    """The kernel raised on a device (out-of-bounds access, a failing callback, ...).

    ``device`` and ``location`` (the user's line, when known) say where;
    ``__cause__`` is the original exception.
    """

    def __init__(
        self, message: str, *, device: str | None = None, location: str | None = None
    ) -> None:
        super().__init__(message)
        self.device = device
        self.location = location


class DeviceOutsideMeshError(KernelFailedError, DeviceIdError):
    """A remote copy or signal aimed at a device id outside the mesh: typically a ring
    neighbour computed as ``lax.axis_index(axis) + 1`` without ``% size``.

    Also a ``safedma.DeviceIdError``, what the trace-time check raises for a static id
    outside the mesh, so one ``except`` catches the mistake wherever it is found.
    """


def outside_mesh_message(
    *, operation: str, device: str, where: str, target: str, axis: str | None, size: int
) -> str:
    """The words ``simulate`` and the sanitizer use for a device id outside the mesh, as
    ``verify`` says it: the line, the id, the mesh size, and the modulo that fixes it."""
    if axis is None:
        outside = f"device id {target}, outside the mesh of {size} devices"
        fix = "Keep the id inside the mesh: take it modulo the number of devices"
    else:
        outside = f"device id {target}, outside the mesh ({axis} has {size} devices)"
        fix = (
            "A ring neighbour needs the modulo: "
            f"(lax.axis_index({axis!r}) + 1) % {size}, or (lax.axis_index({axis!r}) - 1) "
            f"% {size} for the previous one"
        )
    at = f" at {where}" if where else ""
    return f"device id outside the mesh: the {operation}{at} on {device} targets {outside}. {fix}."
