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
# integer and boolean arguments up to this many elements are keyed by value: they are
# what steers a kernel's copies (scalar prefetch, page tables, indices, flags)
_CONTROL_ELEMENTS = 1 << 12
#: distinct control values verified per program and argument types; later runs with
#: other values are counted, not verified (a test looping over random indices)
MAX_VALUE_VARIANTS = 16


def _signature(value: object) -> Hashable:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return (type(value).__name__, repr(value))
    sharding = getattr(value, "sharding", None)
    return (tuple(int(d) for d in shape), str(dtype), None if sharding is None else repr(sharding))


def _host_bytes(value: object) -> bytes | None:
    try:
        return np.asarray(value).tobytes()
    except Exception:  # an extended dtype (a PRNG key) has no host bytes
        return None


def _control_value(value: object) -> Hashable:
    """The bytes of a small integer or boolean argument, None for any other."""
    dtype = getattr(value, "dtype", None)
    size = getattr(value, "size", None)
    if dtype is None or not isinstance(size, int) or size > _CONTROL_ELEMENTS:
        return None
    try:
        kind = np.dtype(dtype).kind
    except TypeError:  # an extended dtype
        return None
    return _host_bytes(value) if kind in "biu" else None


def _constant_key(value: object) -> Hashable:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and nbytes <= _CONSTANT_KEY_BYTES:
        data = _host_bytes(value)
        if data is not None:
            return (_signature(value), data)
    return (_signature(value), id(value))


class RunVerifier:
    """Verifies runs, and remembers each verdict for the session.

    A verdict holds for the program text, the arguments' shapes, dtypes and
    shardings (the mesh), the program's constants, and the values of its small
    integer arguments: another page table is another run to verify.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._verdicts: dict[Hashable, Outcome] = {}
        self._variants: dict[Hashable, int] = {}
        self._lock = threading.Lock()
        self.seconds = 0.0  # time spent in verify
        self.programs = 0  # programs verified (not taken from the cache)

    def outcome(self, program: Program, run_args: Sequence[object]) -> Outcome:
        """The verdict on this run: verify's, or the one already reached for the same
        program, argument types, mesh and control values (past
        :data:`MAX_VALUE_VARIANTS` of those, "unsupported")."""
        with self._lock:
            args = program.arguments(run_args)
            kernels = tuple(str(k) for k in program.kernels)
            if len(args) != program.argument_count():
                return Outcome(
                    UNSUPPORTED,
                    program.name,
                    kernels,
                    "ArgumentMismatch",
                    f"the run passed {len(run_args)} arguments, which do not match the "
                    f"program's {program.argument_count()} after {program.constants} constants",
                )
            types = (
                program.text(),
                tuple(_signature(a) for a in args),
                tuple(_constant_key(c) for c in program.constant_values()),
            )
            key = (types, tuple(_control_value(a) for a in args))
            hit = self._verdicts.get(key)
            if hit is not None:
                return replace(hit, seconds=0.0, cached=True)
            variants = self._variants.get(types, 0)
            if variants >= MAX_VALUE_VARIANTS:
                return Outcome(
                    UNSUPPORTED,
                    program.name,
                    kernels,
                    "TooManyValueVariants",
                    f"this run was not verified: {MAX_VALUE_VARIANTS} runs of the program with "
                    "the same argument types and other integer argument values (scalar "
                    "prefetch, indices) were verified already in this session, and each new "
                    "set of values costs a verification",
                )
            self._variants[types] = variants + 1
            verdict = self._verify(program, args, kernels)
            self._verdicts[key] = verdict
            return verdict

    def _verify(self, program: Program, args: list[Any], kernels: tuple[str, ...]) -> Outcome:
        start = time.perf_counter()
        kind: Kind = CLEAN
        error, message = "", ""
        classes: tuple[str, ...] = ()
        try:
            verify(program.function(), *args, timeout_s=self.timeout_s)
        except Exception as err:  # classified: verify's findings, limits, own failures
            kind = kind_of(err)
            error, message = type(err).__name__, str(err)
            classes = tuple(c.__name__ for c in type(err).__mro__ if c not in (object,))
        seconds = time.perf_counter() - start
        self.seconds += seconds
        self.programs += 1
        return Outcome(kind, program.name, kernels, error, message, seconds, error_classes=classes)
