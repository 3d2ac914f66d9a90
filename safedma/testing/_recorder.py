"""The record of one simulation: what the interpret-mode probes saw, safe to read while it runs.

The probes call in from the interpreter's device threads; the runner and the
diagnosis read from the simulating thread.  Everything here is behind one
lock, and nothing here formats a message (that is :mod:`._diagnosis`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Sequence

from safedma.testing import _interpret_probes as probes
from safedma.testing._errors import ConcurrentInterpretError, Race
from safedma.testing._meshes import DeviceNames

__all__ = ["Blocked", "CopyCounts", "Failure", "Recorder"]

#: (peer device, the user's line) -> how many copies
CopyCounts = Counter[tuple[int, "str | None"]]


@dataclasses.dataclass(frozen=True)
class Failure:
    """The first error of a run on a device: its root cause.

    ``inside`` is False when it was raised outside the interpreter (a failing
    ``jax.debug.callback``): jax does not know the run failed, so the other
    devices must be stopped and the barriers broken by the runner.
    """

    error: BaseException
    device_id: int | None
    inside: bool


@dataclasses.dataclass(frozen=True)
class Blocked:
    """Every core of a run is in a wait its semaphore cannot satisfy, or has exited."""

    sequence: int
    waits: tuple[tuple[probes.WaitStart, int], ...]  # each wait with the count it saw


class Recorder:
    """Collects probe events from the interpreter's device threads (an InterpretObserver)."""

    def __init__(self, devices: DeviceNames) -> None:
        self._devices = devices
        self._lock = threading.Lock()
        self._sequence = 0  # bumped by every event that shows progress
        self._waits: dict[int, probes.WaitStart] = {}
        self._runs: dict[int, int] = {}
        self._keep: list[probes.InterpretRun] = []
        self._dmas: dict[tuple[int, int, str, int], CopyCounts] = {}
        self._exited: set[tuple[int, int]] = set()
        self._threads: dict[int, int] = {}
        self._failed_runs: set[int] = set()
        self._seen_errors: set[int] = set()
        self._last_seen: dict[int, str] = {}
        self._copies = 0
        self._signals = 0
        self.failure: Failure | None = None
        self.leftovers: list[tuple[int, probes.LeftoverCount]] = []
        self.races: list[Race] = []

    def _run_index(self, run: probes.InterpretRun) -> int:
        if run.key not in self._runs:
            self._runs[run.key] = len(self._runs)
            self._keep.append(run)  # keeps id() keys unique for the whole simulation
        return self._runs[run.key]

    # ---------------------------------------------- InterpretObserver
    def wait_started(self, token: int, wait: probes.WaitStart) -> None:
        with self._lock:
            self._run_index(wait.run)
            self._threads[threading.get_ident()] = wait.device_id
            self._waits[token] = wait
            self._sequence += 1

    def wait_finished(self, token: int) -> None:
        with self._lock:
            wait = self._waits.pop(token, None)
            if wait is not None and wait.location:
                self._last_seen[wait.device_id] = wait.location
            self._sequence += 1

    def dma_started(self, dma: probes.DmaStart) -> None:
        with self._lock:
            run = self._run_index(dma.run)
            recv = (run, dma.recv_semaphore_id, "recv", dma.dst_device_id)
            self._dmas.setdefault(recv, Counter())[(dma.src_device_id, dma.location)] += 1
            self._copies += 1
            if dma.send_semaphore_id is not None:
                send = (run, dma.send_semaphore_id, "send", dma.src_device_id)
                self._dmas.setdefault(send, Counter())[(dma.dst_device_id, dma.location)] += 1
            device = self._threads.get(threading.get_ident())
            if device is not None and dma.location:
                self._last_seen[device] = dma.location
            self._sequence += 1

    def semaphore_signalled(self, signal: probes.SignalSent) -> None:
        with self._lock:
            run = self._run_index(signal.run)
            key = (run, signal.semaphore_id, "signal", signal.device_id)
            self._dmas.setdefault(key, Counter())[(signal.sender_device_id, signal.location)] += 1
            self._signals += 1
            self._sequence += 1

    def device_thread(self, run: probes.InterpretRun, device_id: int) -> None:
        with self._lock:
            self._run_index(run)
            self._threads[threading.get_ident()] = device_id

    def kernel_exited(self, run: probes.InterpretRun, device_id: int) -> None:
        with self._lock:
            self._exited.add((run.key, device_id))
            self._sequence += 1

    def kernel_ended(
        self, run: probes.InterpretRun, counts: Sequence[probes.LeftoverCount]
    ) -> None:
        with self._lock:
            index = self._run_index(run)
            if run.key not in self._failed_runs:
                self.leftovers.extend((index, c) for c in counts)

    def race_detected(self, race: probes.RaceReport) -> None:
        who = race.accessor[0]
        # A program with its own shard_map (no mesh given) has more devices than
        # the names know; the run says how many.
        devices = race.device_count or self._devices.count
        accessor = self._devices.label(who) if 0 <= who < devices else f"DMA #{who}"
        owner_id = race.buffer[2] if len(race.buffer) > 2 else None
        owner = self._devices.label(owner_id) if isinstance(owner_id, int) else None
        with self._lock:
            self.races.append(
                Race(
                    race.access,
                    accessor,
                    owner,
                    race.buffer,
                    race.location,
                    race.message,
                    race.other_location,
                )
            )

    def run_failed(
        self, run: probes.InterpretRun, error: BaseException, device_id: int | None
    ) -> None:
        with self._lock:
            self._run_index(run)
            self._seen_errors.add(id(error))
            first = run.key not in self._failed_runs
            self._failed_runs.add(run.key)
            if device_id is None:
                device_id = self._threads.get(threading.get_ident())
            # The first failure of a run is its cause; every later one (other
            # devices' "Computation failed", broken barriers) follows from it.
            # The watchdog's own StopRun is no cause of anything.
            if first and self.failure is None and not isinstance(error, probes.StopRun):
                self.failure = Failure(error, device_id, inside=True)

    def callback_failed(self, error: BaseException) -> bool:
        with self._lock:
            if id(error) in self._seen_errors or isinstance(error, probes.StopRun):
                return True
            if isinstance(error, ConcurrentInterpretError):
                return False  # another thread's kernel: its caller should see the log
            device = self._threads.get(threading.get_ident())
            if device is None:
                return False  # not one of this simulation's device threads
            if self.failure is None and not self._failed_runs:
                self.failure = Failure(error, device, inside=False)
            return True

    # ---------------------------------------------- queries (simulating thread)
    def progress(self) -> str:
        """What the run has done so far, for simulate's progress line."""
        with self._lock:
            copies, signals, waiting = self._copies, self._signals, len(self._waits)
            exits = len(self._exited)
        # a copy's completion signals its semaphore too: signals count those
        return (
            f"copies started {copies}, semaphore signals {signals}, waits in progress "
            f"{waiting}, kernel exits {exits}"
        )

    def waiting(self) -> list[probes.WaitStart]:
        with self._lock:
            return list(self._waits.values())

    def run_index(self, run: probes.InterpretRun) -> int:
        with self._lock:
            return self._runs.get(run.key, 0)

    def runs_in_flight(self) -> list[probes.InterpretRun]:
        with self._lock:
            return list({w.run.key: w.run for w in self._waits.values()}.values())

    def copies(self, run: int, sem: int, role: str, device: int) -> CopyCounts:
        with self._lock:
            return Counter(self._dmas.get((run, sem, role, device), Counter()))

    def devices_seen(self) -> set[int]:
        """Every device a probe heard from (a program may bring its own shard_map)."""
        with self._lock:
            return {
                *self._threads.values(),
                *self._last_seen,
                *(w.device_id for w in self._waits.values()),
            }

    def last_seen(self) -> dict[int, str]:
        with self._lock:
            return dict(self._last_seen)

    def blocked(self) -> Blocked | None:
        """A snapshot showing every core blocked for good, or None if something can still move.

        A core is blocked when it waits on a semaphore whose count is below
        what it needs, or when its device's kernel has returned.  DMAs run
        when started (eager mode), so once every core is blocked nothing is
        in flight and nothing can signal any more.  The caller confirms with
        a second snapshot: a count read here may be raised by a signal an
        instant later, and that shows as progress (the waiter wakes up).
        """
        with self._lock:
            waits = list(self._waits.values())
            sequence = self._sequence
            exited = set(self._exited)
        if not waits:
            return None
        run = waits[0].run
        if any(w.run.key != run.key for w in waits):
            return None
        stuck: list[tuple[probes.WaitStart, int]] = []
        cores: set[int] = set()
        for w in waits:
            try:
                count = w.read_count()
            except Exception:  # the run is being torn down
                return None
            if count >= w.value:
                return None  # about to wake up
            stuck.append((w, count))
            cores.add(w.global_core_id)
        per_device = run.cores_per_device
        for key, device in exited:
            if key == run.key:
                cores.update(range(device * per_device, (device + 1) * per_device))
        if len(cores) < run.cores:
            return None
        return Blocked(sequence, tuple(stuck))
