"""The suite's verification session: the hooks, and which test ran what.

Runs may come from another thread (``simulate`` executes on a worker thread), so
the test a run belongs to is the one pytest is running when it happens, kept
here, not a thread-local.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from safedma.testing._suite import _jax
from safedma.testing._suite._outcome import Outcome
from safedma.testing._suite._simulations import watch_simulations
from safedma.testing._suite._verifier import RunVerifier

__all__ = ["SuiteSession", "OUTSIDE_TESTS"]

#: Where runs outside any test (at import or collection) are filed.
OUTSIDE_TESTS = "(outside any test)"

Phase = tuple[str, str]  # (test node id, setup/call/teardown)


class _Filed:
    """One run's verdict, and whether the run's own error already reached the test."""

    __slots__ = ("verdict", "program", "observed")

    def __init__(self, verdict: Outcome, program: _jax.Program) -> None:
        self.verdict = verdict
        self.program = program
        self.observed = ""


class SuiteSession:
    """Verifies every kernel program the tests execute and files each verdict under
    the test (and its phase: setup, call, teardown) that ran it."""

    def __init__(self, timeout_s: float) -> None:
        self.verifier = RunVerifier(timeout_s)
        self._lock = threading.Lock()
        self._phase: Phase = (OUTSIDE_TESTS, "")
        self._filed: dict[Phase, list[_Filed]] = {}
        self._simulation: list[_Filed] | None = None  # runs of the simulate call under way
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        if not self._undo:
            self._undo.append(_jax.install(self.observe, self.run_failed))
            self._undo.append(watch_simulations(self._open_simulation, self._close_simulation))

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()

    def begin(self, test: str, phase: str) -> None:
        """Runs from now on belong to ``test``'s ``phase``."""
        with self._lock:
            self._phase = (test, phase)

    def end(self) -> None:
        with self._lock:
            self._phase = (OUTSIDE_TESTS, "")

    def observe(self, program: _jax.Program, run_args: Sequence[object]) -> None:
        """Verify (or recall) this run and file it under the running test."""
        verdict = self.verifier.outcome(program, run_args)
        with self._lock:
            filed = _Filed(verdict, program)
            self._filed.setdefault(self._phase, []).append(filed)
            if self._simulation is not None:
                self._simulation.append(filed)

    def run_failed(self, program: _jax.Program, error: BaseException) -> None:
        """The run of ``program`` just filed raised ``error`` to the test itself."""
        with self._lock:
            for filed in reversed(self._filed.get(self._phase, [])):
                if filed.program is program:
                    filed.observed = f"the run itself raised {type(error).__name__}"
                    return

    def _open_simulation(self) -> object:
        with self._lock:
            self._simulation = []
            return self._simulation

    def _close_simulation(self, token: object, error: BaseException | None) -> None:
        with self._lock:
            if self._simulation is token:
                self._simulation = None
            if error is None or not isinstance(token, list):
                return
            for filed in cast("list[_Filed]", token):
                filed.observed = filed.observed or (
                    f"simulate raised {type(error).__name__} for this run"
                )

    def take(self, test: str, phase: str) -> list[Outcome]:
        """The verdicts filed under ``test``'s ``phase``, removed: one per program and
        verdict however many runs, unobserved runs first."""
        with self._lock:
            runs = self._filed.pop((test, phase), [])
        groups: dict[tuple[object, ...], list[Outcome]] = {}
        for filed in runs:
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
