"""A sanitized kernel is verified as its caller wrote it.

The sanitizer (``sanitize=True``, ``SAFEDMA_SANITIZE=1``) instruments a kernel
before jax sees it: bounded spin loops on semaphore reads, flag writes into an
SMEM output it adds, an exit drain in a scratch it adds. Those are the
sanitizer's, not the caller's protocol, and verify does not model them. So while
the suite verifies, each sanitized call hands its runs here (the sanitizer's
watcher): the instrumented call is traced, which names the kernel jaxpr jax
will run, and runs from that trace; the caller's own call (the same body, grid,
specs, scratch and arguments, the sanitizer off) is traced on the same
arguments beside it. A program is verified with each instrumented kernel call
replaced by the caller's, its flags output by zeros (for the program's own
flags check, nothing is flagged): a sanitized kernel gets the verdict of the
same kernel unsanitized.

The sanitizer's own report of a mistake is the run's error reaching the test,
like an error the run itself raises: an eager call's check raises it as the
call returns (that run is known); under ``jax.jit`` a host callback raises it,
often after the run has returned (at ``block_until_ready``), so a finding of
that class on a sanitized kernel run in the same test phase is taken as reported.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from safedma._sanitize import _report
from safedma._sanitize._call import SanitizedRun, watch_runs
from safedma.testing._suite import _jax

__all__ = ["SanitizedCalls", "reported_mark", "reported_since"]

#: Called with the kernel jaxpr of a sanitized call and the error its check raised.
Raised = Callable[[object, BaseException], None]

# The instrumented kernel jaxpr -> the caller's call, traced (then zeros for the flags).
# One for the process: a session opened inside another (a test of the plugin, run
# under the plugin) records for both.
_callers: weakref.WeakKeyDictionary[Any, _jax.Traced] = weakref.WeakKeyDictionary()
_callers_lock = threading.Lock()


def _caller_of(kernel: object) -> _jax.Traced | None:
    """The caller's call recorded for an instrumented kernel body; None for any other
    (a kernel call whose body the program does not hold, such as a core map, has none)."""
    if kernel is None:
        return None
    with _callers_lock:
        try:
            return _callers.get(kernel)
        except TypeError:  # not weakly referenceable: never recorded
            return None


class SanitizedCalls:
    """The caller's own call behind each instrumented kernel run in this session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: weakref.WeakKeyDictionary[_jax.Program, _jax.Program | None] = (
            weakref.WeakKeyDictionary()
        )

    def install(self, raised: Raised) -> Callable[[], None]:
        """Watch every sanitized call's runs; ``raised`` hears of each that its check
        raised. Returns the function that stops watching."""

        def watcher(run: SanitizedRun) -> Any:
            return self._watch(run, raised)

        before = watch_runs(watcher)

        def stop() -> None:
            watch_runs(before)

        return stop

    def callers_view(self, program: _jax.Program) -> _jax.Program:
        """``program`` with each instrumented kernel call replaced by its caller's
        (the program itself when it runs none)."""
        with self._lock:
            if program in self._views:
                return self._views[program] or program
            view = program.replacing_kernels(_caller_of)
            # None for "the program itself": a value holding its key would keep it alive
            self._views[program] = None if view is program else view
        return view

    def runs_instrumented(self, program: _jax.Program) -> bool:
        """Whether ``program`` runs a kernel instrumented by the sanitizer."""
        return any(_caller_of(k) is not None for k in program.kernel_bodies())

    def _watch(self, run: SanitizedRun, raised: Raised) -> Any:
        if _jax.jax_busy_here():  # verify's own jax work
            return run.check(run.instrumented(*run.args, **run.kwargs))
        leaves, tree = _jax.tree_flatten((run.args, run.kwargs))
        # arrays (and tracers) are the trace's arguments; anything else is closed over
        dynamic = [k for k, leaf in enumerate(leaves) if _is_array(leaf)]

        def with_values(values: Any) -> tuple[Any, Any]:
            given = list(leaves)
            for k, value in zip(dynamic, values):
                given[k] = value
            args, kwargs = _jax.tree_unflatten(tree, given)
            return args, kwargs

        def instrumented(*values: Any) -> Any:
            args, kwargs = with_values(values)
            return run.instrumented(*args, **kwargs)

        arrays = [leaves[k] for k in dynamic]
        # Traced once, as the call traces it when nothing watches: its error (a mistake
        # the body's checks refuse) is the call's own.
        traced = _jax.trace(instrumented, arrays)
        kernel = traced.lone_kernel()
        if kernel is not None:
            callers = _callers_call(run, with_values, arrays, traced)
            if callers is not None:
                with _callers_lock:
                    _callers[kernel] = callers
        outputs = traced(arrays)
        try:
            return run.check(outputs)
        except Exception as err:
            if kernel is not None:
                raised(kernel, err)
            raise


def _is_array(leaf: object) -> bool:
    # a tracer is a jax.Array too
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def reported_mark() -> int:
    """Where the sanitizer's record of the mistakes its host callbacks reported stands."""
    return len(_report.recorded_since(0))


def reported_since(mark: int) -> frozenset[str]:
    """The classes (by name) of the mistakes sanitized kernels under ``jax.jit``
    reported since ``mark``."""
    return frozenset(type(e).__name__ for e in _report.recorded_since(mark))


def _callers_call(
    run: SanitizedRun,
    with_values: Callable[[Any], tuple[Any, Any]],
    arrays: list[Any],
    instrumented: _jax.Traced,
) -> _jax.Traced | None:
    """The caller's own call traced on the run's arguments, its results then zeros in
    place of the flags; None when it does not trace (verify then sees the
    instrumented kernel, and says it cannot check it)."""
    flags = instrumented.out_shapes[-1]

    def callers(*values: Any) -> Any:
        args, kwargs = with_values(values)
        outputs = run.unsanitized()(*args, **kwargs)
        return (*_jax.tree_leaves(outputs), _jax.zeros(flags.shape, flags.dtype))

    try:
        with warnings.catch_warnings():  # the instrumented trace gave the body's warnings
            warnings.simplefilter("ignore")
            return _jax.trace(callers, arrays)
    except Exception:
        return None
