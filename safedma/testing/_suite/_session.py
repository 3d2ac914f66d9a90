"""The suite's verification session: the hooks, and which test ran what.

Runs may come from another thread (``simulate`` executes on a worker thread), so
the test a run belongs to is the one pytest is running when it happens, kept
here, not a thread-local. A run on ``simulate``'s worker is verified when the
``simulate`` call returns, on the test's own thread: verifying it on the worker
would spend the simulation's ``timeout_s`` and keep its watchdog from stopping
the run. When ``simulate`` raises instead (its own error, or an interrupt), the
test has that run's error already, and the run is not verified.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from safedma.testing._suite import _jax
from safedma.testing._suite._outcome import FINDING, Outcome
from safedma.testing._suite._sanitized import SanitizedCalls, reported_mark, reported_since
from safedma.testing._suite._simulations import watch_simulations
from safedma.testing._suite._verifier import RunVerifier

__all__ = ["SuiteSession", "OUTSIDE_TESTS"]

#: Where runs outside any test (at import or collection) are filed.
OUTSIDE_TESTS = "(outside any test)"

Phase = tuple[str, str]  # (test node id, setup/call/teardown)


class _Filed:
    """One run: its verdict (None until verified), and whether the run's own error
    already reached the test."""

    __slots__ = ("verdict", "program", "arguments", "observed")

    def __init__(self, program: _jax.Program, arguments: Sequence[object]) -> None:
        self.verdict: Outcome | None = None
        self.program = program
        self.arguments: Sequence[object] = arguments  # until verified
        self.observed = ""


class _Simulation:
    """A ``simulate`` call under way: the thread that called it, the runs it made."""

    __slots__ = ("thread", "runs")

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.runs: list[_Filed] = []


class SuiteSession:
    """Verifies every kernel program the tests execute and files each verdict under
    the test (and its phase: setup, call, teardown) that ran it."""

    def __init__(self, timeout_s: float) -> None:
        self.verifier = RunVerifier(timeout_s)
        self.sanitized = SanitizedCalls()
        self._lock = threading.Lock()
        self._phase: Phase = (OUTSIDE_TESTS, "")
        self._filed: dict[Phase, list[_Filed]] = {}
        self._simulation: _Simulation | None = None
        self._undo: list[Callable[[], None]] = []
        # where the sanitizer's jit reports stood as each phase began
        self._reported_at: dict[Phase, int] = {}

    def install(self) -> None:
        if not self._undo:
            self._undo.append(_jax.install(self.observe, self.run_failed))
            self._undo.append(watch_simulations(self._open_simulation, self._close_simulation))
            self._undo.append(self.sanitized.install(self.sanitizer_raised))

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()

    def begin(self, test: str, phase: str) -> None:
        """Runs from now on belong to ``test``'s ``phase``."""
        with self._lock:
            self._phase = (test, phase)
            self._reported_at[self._phase] = reported_mark()

    def end(self) -> None:
        with self._lock:
            self._phase = (OUTSIDE_TESTS, "")

    def observe(self, program: _jax.Program, run_args: Sequence[object]) -> None:
        """File this run under the running test; verify it now, or when the
        ``simulate`` call whose worker runs it returns."""
        filed = _Filed(program, list(run_args))
        with self._lock:
            self._filed.setdefault(self._phase, []).append(filed)
            simulation = self._simulation
            if simulation is not None:
                simulation.runs.append(filed)
                if simulation.thread != threading.get_ident():
                    return
        self._verify(filed)

    def _reported(self, runs: list[_Filed], phase: Phase) -> None:
        """Findings on sanitized kernels of a class the sanitizer reported under jit in
        this phase reached the test (through its host callback) already."""
        mark = self._reported_at.pop(phase, None)
        reported: frozenset[str] = frozenset() if mark is None else reported_since(mark)
        if not reported:
            return
        for filed in runs:
            v = filed.verdict
            if v is None or v.kind != FINDING or filed.observed or not v.is_one_of(reported):
                continue
            if self.sanitized.runs_instrumented(filed.program):
                names = ", ".join(sorted(reported))
                filed.observed = f"the sanitizer reported {names} in this test phase"

    def _verify(self, filed: _Filed) -> None:
        if filed.verdict is None:
            program = self.sanitized.callers_view(filed.program)
            filed.verdict = self.verifier.outcome(program, filed.arguments)
            filed.arguments = ()

    def run_failed(self, program: _jax.Program, error: BaseException) -> None:
        """The run of ``program`` just filed raised ``error`` to the test itself."""
        with self._lock:
            for filed in reversed(self._filed.get(self._phase, [])):
                if filed.program is program:
                    filed.observed = f"the run itself raised {type(error).__name__}"
                    return

    def sanitizer_raised(self, kernel: object, error: BaseException) -> None:
        """The sanitizer's check of the last run of the instrumented ``kernel`` raised
        ``error`` to the test (an eager call's check, after the run)."""
        with self._lock:
            for filed in reversed(self._filed.get(self._phase, [])):
                if any(k is kernel for k in filed.program.kernel_bodies()):
                    filed.observed = f"the sanitizer raised {type(error).__name__} on the run"
                    return

    def _open_simulation(self) -> object:
        with self._lock:
            self._simulation = _Simulation()
            return self._simulation

    def _close_simulation(self, token: object, error: BaseException | None) -> None:
        with self._lock:
            if self._simulation is token:
                self._simulation = None
        simulation = cast("_Simulation", token)
        if error is not None:
            return  # its runs stay unverified: the test has their error
        with _jax.observer_running():  # verify's own jax work is no run of the suite
            for filed in simulation.runs:
                self._verify(filed)

    def take(self, test: str, phase: str) -> list[Outcome]:
        """The verdicts filed under ``test``'s ``phase``, removed: one per program and
        verdict however many runs, unobserved runs first."""
        with self._lock:
            runs = self._filed.pop((test, phase), [])
        self._reported(runs, (test, phase))
        groups: dict[tuple[object, ...], list[Outcome]] = {}
        for filed in runs:
            if filed.verdict is None:  # in a simulate call that raised: not verified
                continue
            v = replace(filed.verdict, observed=filed.observed)
            groups.setdefault((v.kind, v.program, v.kernels, v.error, v.message), []).append(v)
        merged: list[Outcome] = []
        for verdicts in groups.values():
            unobserved = [v for v in verdicts if not v.observed]
            fresh = [v for v in verdicts if not v.cached]
            first = (fresh or verdicts)[0]
            merged.append(replace(first, observed="" if unobserved else verdicts[0].observed))
        return merged

    def take_outside_tests(self) -> list[Outcome]:
        return self.take(OUTSIDE_TESTS, "")
