"""Verify one run of a program, once per program, argument types and mesh per session.

A run is verified with :func:`safedma.testing.verify` before jax executes it, with
the arguments it was given: the program's jaxpr, run again as a function, and
the concrete arrays (their values where verify needs them: scalar prefetch,
page tables). The mesh is the program's own (the ``shard_map`` inside it and the
arguments' shardings), so nothing is guessed from the test's Python.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from safedma.testing._errors import (
    ConcurrentInterpretError,
    NotEnoughDevicesError,
    SimulationError,
    SimulationTimeoutError,
    SimulationUnsupportedError,
)
from safedma.testing._suite._jax import Program
from safedma.testing._suite._outcome import (
    CLEAN,
    FINDING,
    UNSUPPORTED,
    VERIFY_ERROR,
    Kind,
    Outcome,
)
from safedma.testing._verify import VerificationUnsupportedError, verify

__all__ = ["RunVerifier", "kind_of"]

# verify's errors that say it cannot check the program, not that the program is wrong
_CANNOT_CHECK: tuple[type[BaseException], ...] = (
    VerificationUnsupportedError,
    SimulationUnsupportedError,
    SimulationTimeoutError,
    NotEnoughDevicesError,
    ConcurrentInterpretError,
)


def kind_of(error: BaseException) -> Kind:
    """A finding (verify's protocol errors), unsupported, or a failure of verify itself."""
    if isinstance(error, _CANNOT_CHECK):
        return UNSUPPORTED
    if isinstance(error, SimulationError):
        return FINDING
    return VERIFY_ERROR


# constants up to this many bytes are keyed by value (a table a kernel closes over)
_CONSTANT_KEY_BYTES = 1 << 16


def _signature(value: object) -> Hashable:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return (type(value).__name__, repr(value))
    sharding = getattr(value, "sharding", None)
    return (tuple(int(d) for d in shape), str(dtype), None if sharding is None else repr(sharding))


def _constant_key(value: object) -> Hashable:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and nbytes <= _CONSTANT_KEY_BYTES:
        try:
            arr = np.asarray(value)
            return (_signature(value), arr.tobytes())
        except Exception:  # an extended dtype (a PRNG key) has no host bytes
            pass
    return (_signature(value), id(value))


class RunVerifier:
    """Verifies runs, and remembers each verdict for the session."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._verdicts: dict[Hashable, Outcome] = {}
        self._lock = threading.Lock()
        self.seconds = 0.0  # time spent in verify
        self.programs = 0  # programs verified (not taken from the cache)

    def outcome(self, program: Program, run_args: Sequence[object]) -> Outcome:
        """The verdict on this run: verify's, or the one already reached for the same
        program with the same argument types and mesh."""
        with self._lock:
            known = program.outcome
            if isinstance(known, Outcome):
                return replace(known, seconds=0.0, cached=True)
            args = program.arguments(run_args)
            if len(args) != program.argument_count():
                verdict = Outcome(
                    UNSUPPORTED,
                    program.name,
                    tuple(str(k) for k in program.kernels),
                    "ArgumentMismatch",
                    f"the run passed {len(run_args)} arguments, which do not match the "
                    f"program's {program.argument_count()} after {program.constants} constants",
                )
                program.outcome = verdict
                return verdict
            key = (
                program.text(),
                tuple(_signature(a) for a in args),
                tuple(_constant_key(c) for c in program.constant_values()),
            )
            hit = self._verdicts.get(key)
            if hit is None:
                hit = self._verify(program, args)
                self._verdicts[key] = hit
                verdict = hit
            else:
                verdict = replace(hit, seconds=0.0, cached=True)
            program.outcome = hit
            program.release()
            return verdict

    def _verify(self, program: Program, args: list[Any]) -> Outcome:
        kernels = tuple(str(k) for k in program.kernels)
        start = time.perf_counter()
        kind: Kind = CLEAN
        error, message = "", ""
        try:
            verify(program.function(), *args, timeout_s=self.timeout_s)
        except Exception as err:  # classified: verify's findings, limits, own failures
            kind = kind_of(err)
            error, message = type(err).__name__, str(err)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        self.programs += 1
        return Outcome(kind, program.name, kernels, error, message, seconds)
