"""Turning what a simulation recorded into the error it reports, in plain words.

Each function takes the :class:`~._recorder.Recorder` of a finished (or
stopped) run and returns the :class:`~._errors.SimulationError` that names
the mistake, the device, the user's line and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from safedma.testing import _interpret_probes as probes
from safedma.testing._kernel_names import KernelNames
from safedma.testing._errors import (
    DeviceOutsideMeshError,
    KernelFailedError,
    LeftoverSemaphore,
    LeftoverSemaphoreError,
    SemaphoreKind,
    SimulationTimeoutError,
    SimulationUnsupportedError,
    StuckWait,
    UnsatisfiableWaitError,
    outside_mesh_message,
)
from safedma.testing._meshes import DeviceNames
from safedma.testing._off_mesh import OffMeshTarget
from safedma.testing._recorder import CopyCounts, Failure, Recorder
from safedma.testing._uninterpretable import raised_by_interpreter, run_time_limit

__all__ = ["failure_error", "leftover_error", "timeout_error", "unsatisfiable_error"]


def _signallers(recorder: Recorder, run: int, sem: int, device: int, devices: DeviceNames) -> str:
    """ " (signalled by device 7 at file.py:12)" for every distinct sender and line."""
    sent = recorder.copies(run, sem, "signal", device)
    if not sent:
        return ""
    parts: list[str] = []
    for (sender, location), times in sorted(
        sent.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
    ):
        at = f" at {location}" if location else ""
        count = f" ({times} times)" if times > 1 else ""
        parts.append(f"{devices.label(sender)}{at}{count}")
    return f" (signalled by {'; '.join(parts)})"


def _kind(
    recorder: Recorder, run: int, sem: int, device: int, is_barrier: bool, is_dma: bool
) -> SemaphoreKind:
    if is_barrier:
        return "BARRIER"
    if (
        is_dma
        or recorder.copies(run, sem, "recv", device)
        or recorder.copies(run, sem, "send", device)
    ):
        return "DMA"
    return "REGULAR"


def _sites(copies: CopyCounts, devices: DeviceNames, device: int) -> list[str]:
    """One phrase per distinct (peer, line) the copies came from, most frequent first."""
    phrases: list[str] = []
    for (peer, location), times in sorted(
        copies.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1] or "")
    ):
        what = "a copy" if peer == device else f"a copy from {devices.label(peer)}"
        started = f" started at {location}" if location else ""
        repeat = f" (started {times} times)" if times > 1 else ""
        phrases.append(f"{what}{started}{repeat}")
    return phrases


def _leftover_hint(
    recorder: Recorder,
    run: int,
    item: probes.LeftoverCount,
    kind: SemaphoreKind,
    devices: DeviceNames,
) -> str:
    by = _signallers(recorder, run, item.semaphore_id, item.device_id, devices)
    if kind == "BARRIER":
        return (
            f"the barrier semaphore was signalled more often than waited{by}: a "
            "barrier signal never waited, or over-signalled"
        )
    if kind == "REGULAR":
        return (
            f"signalled more than waited{by}: a semaphore_signal never waited, or "
            "over-signalled; every signal needs a matching semaphore_wait"
        )
    recv = recorder.copies(run, item.semaphore_id, "recv", item.device_id)
    send = recorder.copies(run, item.semaphore_id, "send", item.device_id)
    if recv:
        sites = _sites(recv, devices, item.device_id)
        local = all(peer == item.device_id for peer, _ in recv)
        fix = "wait on its handle" if local else "wait_recv (or wait) is missing"
        looped = any(times > 1 for times in recv.values())
        loop = (
            " If it was started in a loop, the copy of the last iteration is "
            "left in flight: wait for it after the loop (R4)."
            if looped
            else ""
        )
        one = "; or ".join(sites)
        return (
            f"{one} was never waited on this device, or waited for fewer bytes "
            f"than it moved: {fix} before the kernel returns.{loop}"
        )
    if send:
        parts: list[str] = []
        for (peer, location), _times in sorted(
            send.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
        ):
            started = f" started at {location}" if location else ""
            parts.append(f"a remote copy to {devices.label(peer)}{started}")
        return (
            f"the send side of {'; or '.join(parts)} was never waited: call "
            "wait_send (or wait) on its handle before the kernel returns"
        )
    return "a copy signalled it, but safedma saw none start on this device"


def _lines(recorder: Recorder, run: int, sem: int, device: int) -> list[str | None]:
    """The user's lines of the copies and signals that reached semaphore ``sem``."""
    return [
        location
        for role in ("recv", "send", "signal")
        for _, location in recorder.copies(run, sem, role, device)
    ]


def leftover_error(
    recorder: Recorder, devices: DeviceNames, names: KernelNames
) -> LeftoverSemaphoreError | None:
    """R2/R4: every semaphore not back to zero once every device had finished."""
    reports: list[LeftoverSemaphore] = []
    for run, item in sorted(
        recorder.leftovers, key=lambda r: (r[0], r[1].device_id, r[1].semaphore_id, r[1].core_id)
    ):
        kind = _kind(recorder, run, item.semaphore_id, item.device_id, item.is_barrier, False)
        reports.append(
            LeftoverSemaphore(
                kernel=run,
                device_id=item.device_id,
                device=devices.label(item.device_id),
                semaphore_id=item.semaphore_id,
                kind=kind,
                count=item.count,
                hint=_leftover_hint(recorder, run, item, kind, devices),
                name=names.semaphore(
                    item.semaphore_id,
                    _lines(recorder, run, item.semaphore_id, item.device_id),
                    item.is_barrier,
                ),
            )
        )
    return LeftoverSemaphoreError(reports) if reports else None


def _stuck_hint(recorder: Recorder, run: int, w: probes.WaitStart, kind: SemaphoreKind) -> str:
    if kind == "BARRIER":
        return (
            "the barrier semaphore is waited more often than it is signalled "
            "(an over-waited barrier): each wait needs a signal from a peer"
        )
    if kind == "REGULAR":
        return "the semaphore_signal this wait needs never comes: fewer signals than waits"
    recv = sum(recorder.copies(run, w.semaphore_id, "recv", w.device_id).values())
    send = sum(recorder.copies(run, w.semaphore_id, "send", w.device_id).values())
    if not recv and not send:
        return (
            "no copy signalling this semaphore on this device was ever started: "
            "the send this receiver waits for never comes (is the sender's start "
            "skipped by a condition, or aimed at another device?)"
        )
    copies = recv + send
    return (
        f"more is waited than was copied ({copies} cop{'ies' if copies != 1 else 'y'} "
        "signalled it here): a handle waited twice, or a wait for a copy that "
        "was never started"
    )


def _stuck_waits(
    recorder: Recorder,
    waits: Sequence[tuple[probes.WaitStart, int]],
    devices: DeviceNames,
    names: KernelNames,
) -> list[StuckWait]:
    reports: list[StuckWait] = []
    for w, count in sorted(
        waits, key=lambda wc: (wc[0].device_id, wc[0].core_id, wc[0].semaphore_id)
    ):
        run = recorder.run_index(w.run)
        kind = _kind(recorder, run, w.semaphore_id, w.device_id, w.is_barrier, w.is_dma)
        reports.append(
            StuckWait(
                device_id=w.device_id,
                device=devices.label(w.device_id),
                semaphore_id=w.semaphore_id,
                kind=kind,
                value=w.value,
                count=count,
                location=w.location,
                hint=_stuck_hint(recorder, run, w, kind),
                name=_wait_name(recorder, w, names),
            )
        )
    return reports


def _wait_name(recorder: Recorder, w: probes.WaitStart, names: KernelNames) -> str | None:
    run = recorder.run_index(w.run)
    lines = [w.location, *_lines(recorder, run, w.semaphore_id, w.device_id)]
    return names.semaphore(w.semaphore_id, lines, w.is_barrier)


def unsatisfiable_error(
    recorder: Recorder,
    waits: Sequence[tuple[probes.WaitStart, int]],
    devices: DeviceNames,
    timeout_s: float,
    found_after_s: float,
    names: KernelNames,
) -> UnsatisfiableWaitError:
    """R3: every device blocked, nothing left that could signal."""
    return UnsatisfiableWaitError(
        _stuck_waits(recorder, waits, devices, names), timeout_s, found_after_s
    )


def timeout_error(
    recorder: Recorder,
    devices: DeviceNames,
    timeout_s: float,
    stopped: bool,
    names: KernelNames,
) -> SimulationTimeoutError:
    """The kernel was still making progress when ``timeout_s`` ran out: slow, not stuck."""
    waits = {w.device_id: w for w in recorder.waiting()}
    seen = recorder.last_seen()
    lines: list[str] = []
    for device in sorted({*range(devices.count), *recorder.devices_seen()}):
        label = devices.label(device)
        if device in waits:
            w = waits[device]
            where = f" at {w.location}" if w.location else ""
            name = _wait_name(recorder, w, names) or w.semaphore_id
            lines.append(
                f"  {label} was waiting{where} on semaphore {name} "
                "(a running device could still signal it)"
            )
        else:
            last = f", last seen at {seen[device]}" if device in seen else ""
            lines.append(f"  {label} was running{last}")
    if not waits:
        summary = "no device was waiting on a semaphore"
    else:
        summary = "some devices were waiting, but not all: the others could still signal"
    return SimulationTimeoutError(
        f"the kernel was still running when timeout_s={timeout_s:g} s ran out ({summary}); "
        "it is slow rather than stuck on a semaphore (raise timeout_s if it is meant "
        "to take this long), or it loops outside any semaphore wait:\n" + "\n".join(lines),
        stopped=stopped,
    )


def failure_error(
    failure: Failure, devices: DeviceNames
) -> KernelFailedError | SimulationUnsupportedError:
    """An exception raised on one device, reported as itself, with its device and line.

    Unless it is jax's interpreter meeting a construct it does not implement:
    that is no failure of the kernel, and says so.
    """
    error = failure.error
    device = None if failure.device_id is None else devices.label(failure.device_id)
    if isinstance(error, OffMeshTarget):
        return _off_mesh_error(error, devices)
    if raised_by_interpreter(error):
        return run_time_limit(error, device)
    location = probes.exception_location(error)
    on = f" on {device}" if device else ""
    at = f" at {location}" if location else ""
    text = str(error).strip().rstrip(".") or "(no message)"
    others = "" if devices.count == 1 else " The other devices were stopped because of it."
    message = (
        f"the kernel failed in interpret mode{on}{at}: {type(error).__name__}: {text}.{others}"
    )
    result = KernelFailedError(message, device=device, location=location)
    result.__cause__ = error
    return result


def _off_mesh_error(error: OffMeshTarget, devices: DeviceNames) -> DeviceOutsideMeshError:
    """A copy or signal to a device id outside the mesh, said as ``verify`` says it."""
    axis = devices.only_axis()
    sender = devices.label(error.sender) if error.sender >= 0 else "a device"
    target = f"{axis[0]}={error.target}" if axis else str(error.target)
    message = (
        outside_mesh_message(
            operation=error.operation,
            device=sender,
            where=error.location or "",
            target=target,
            axis=axis[0] if axis else None,
            size=error.devices,
        )
        + " simulate stopped the run before it (on a TPU it reaches another device's "
        "memory, or none)."
    )
    result = DeviceOutsideMeshError(message, device=sender, location=error.location)
    result.__cause__ = error
    return result
