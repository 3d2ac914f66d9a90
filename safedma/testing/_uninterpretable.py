"""Constructs jax's TPU interpreter cannot run, found in the traced program before it runs.

Interpret mode simulates one ``pallas_call`` at a time: its semaphores live
only while that kernel runs.  A program that hands a semaphore from one
``pallas_call`` to the next (a DMA or semaphore *future*: a copy started in
one kernel and waited in another) cannot be simulated; jax fails deep inside
the interpreter (``NotImplementedError: nan + dma_sem`` while making the
semaphore output) or, with zeroed memory, runs it wrong.  Such a program is
refused here, naming the construct and the user's line, and pointed to
``safedma.testing.verify``, which follows futures across ``pallas_call``s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import _compat
from safedma._errors import MissingCollectiveIdError
from safedma.testing import _interpret_probes as probes
from safedma.testing._errors import SimulationUnsupportedError

__all__ = [
    "has_kernel",
    "interpreter_limit",
    "raised_by_interpreter",
    "refuse_uninterpretable",
    "run_time_limit",
]

#: The primitive names of a Pallas kernel call (see ``_KERNEL_PRIMITIVES`` in
#: the probes): a semaphore crossing one of their boundaries is a future.
_KERNEL_CALLS = frozenset({"pallas_call", "core_map", "mpmd_map"})


def _dtype(aval: object) -> Any:
    inner = getattr(aval, "inner_aval", None)  # a ref's value type
    return getattr(inner if inner is not None else aval, "dtype", None)


def _is_regular_semaphore(aval: object) -> bool:
    dtype = _dtype(aval)
    try:
        return dtype is not None and bool(jnp.issubdtype(dtype, pl.semaphore))
    except TypeError:
        return False


def _is_semaphore(aval: object) -> bool:
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return False
    try:
        return bool(
            jnp.issubdtype(dtype, pl.semaphore) or jnp.issubdtype(dtype, pltpu.dma_semaphore)
        )
    except TypeError:
        return False


def _equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and its sub-jaxprs, kernel bodies left out."""
    for eqn in jaxpr.eqns:
        yield eqn
        if str(eqn.primitive) in _KERNEL_CALLS:
            continue
        for value in eqn.params.values():
            for sub in probes.sub_jaxprs(value):
                yield from _equations(sub)


def _kernel_bodies(eqn: Any) -> Iterator[Any]:
    for name in ("jaxpr", "jaxprs"):
        yield from probes.sub_jaxprs(eqn.params.get(name))


def _refuse_regular_semaphore_dma(kernel: Any) -> None:
    """A copy that signals a REGULAR semaphore: TPU v6+ adds 1, jax's interpreter its bytes."""
    for body in _kernel_bodies(kernel):
        for eqn in _equations(body):
            if str(eqn.primitive) != "dma_start":
                continue
            if not any(_is_regular_semaphore(getattr(v, "aval", None)) for v in eqn.invars):
                continue
            where = probes.user_location(eqn.source_info)
            at = f" at {where}" if where else ""
            raise SimulationUnsupportedError(
                f"simulate cannot run this kernel: the copy started{at} signals a REGULAR "
                "semaphore (waited with pl.semaphore_wait). On a TPU (v6 and later) the "
                "copy's completion adds 1 to it; jax's TPU interpreter adds the number of "
                "bytes copied instead, so a correct kernel would fail with a leftover "
                "count. Check the protocol with safedma.testing.verify, or simulate the "
                "kernel with a DMA semaphore and the copy's wait."
            )


def _refuse_barrier_without_collective_id(kernel: Any) -> None:
    """T9 in a raw kernel: the barrier semaphore with no ``collective_id`` to name it.

    jax's interpreter then fails with ``TypeError: int(None)``, which says nothing
    of the mistake (and Mosaic refuses the kernel when lowering for a TPU).
    """
    if str(kernel.primitive) != "pallas_call" or _compat.auto_collective_ids():
        return
    params = kernel.params.get("compiler_params")
    if getattr(params, "collective_id", None) is not None:
        return
    for body in _kernel_bodies(kernel):
        for eqn in _equations(body):
            if str(eqn.primitive) != "get_barrier_semaphore":
                continue
            if eqn.params.get("tag") is not None:
                continue  # jax 0.12: a tagged barrier gets its id from jax
            raise MissingCollectiveIdError.in_raw_kernel(probes.user_location(eqn.source_info))


def _refuse_captured_scalar(kernel: Any) -> None:
    """A ``pl.kernel`` / ``pl.core_map`` body that closes over a scalar value.

    jax binds it as a body input beside the refs, and its interpreter hands every
    input of such a body over as a buffer: the scalar's value becomes a buffer id
    (measured: index 2 read as 101), so a correct kernel fails with an
    out-of-bounds read at its line (plain interpret mode fails the same way).
    """
    if str(kernel.primitive) not in ("core_map", "mpmd_map"):
        return
    for body in _kernel_bodies(kernel):
        if any(
            getattr(getattr(v, "aval", None), "inner_aval", None) is None
            for v in (*body.constvars, *body.invars)
        ):
            where = probes.user_location(kernel.source_info)
            at = f" at {where}" if where else ""
            raise SimulationUnsupportedError(
                f"simulate cannot run this kernel: the pl.kernel (or core_map) body "
                f"called{at} closes over a scalar value (a traced index, say). jax's TPU "
                "interpreter passes every input of such a body as a buffer, so the "
                "scalar would be read as a buffer id and a correct kernel would fail "
                "with an out-of-bounds access. Pass the scalar in a ref (an SMEM "
                "input) to simulate it, or check the protocol with "
                "safedma.testing.verify, which reads the kernel instead of running it."
            )


def has_kernel(jaxpr: Any) -> bool:
    """True if ``jaxpr`` calls a Pallas kernel anywhere (else the interpreter never runs)."""
    return any(str(eqn.primitive) in _KERNEL_CALLS for eqn in _equations(jaxpr))


def refuse_uninterpretable(jaxpr: Any) -> None:
    """Raise :class:`SimulationUnsupportedError` for what jax's interpreter cannot run.

    Semaphores passed between kernels (futures), and copies that signal a
    REGULAR semaphore; a barrier semaphore with no ``collective_id`` (T9) is
    the kernel's mistake and raises :class:`safedma.MissingCollectiveIdError`.
    """
    for eqn in _equations(jaxpr):
        if str(eqn.primitive) not in _KERNEL_CALLS:
            continue
        _refuse_barrier_without_collective_id(eqn)
        _refuse_regular_semaphore_dma(eqn)
        _refuse_captured_scalar(eqn)
        outs = sum(_is_semaphore(v.aval) for v in eqn.outvars)
        ins = sum(_is_semaphore(getattr(v, "aval", None)) for v in eqn.invars)
        if not outs and not ins:
            continue
        where = probes.user_location(eqn.source_info)
        at = f" at {where}" if where else ""
        sides = " and ".join(
            part for part, n in ((f"returns {outs}", outs), (f"takes {ins}", ins)) if n
        )
        raise SimulationUnsupportedError(
            f"simulate cannot run this program: the kernel call{at} {sides} "
            "semaphore(s) as outputs/inputs, a DMA or semaphore future that lives across "
            "pallas_calls (a copy started in one kernel and waited in another). jax's "
            "TPU interpreter keeps semaphores only while one kernel runs, so it cannot "
            "simulate it. Check the protocol with safedma.testing.verify, which "
            "follows futures across pallas_calls, and simulate each kernel's numbers "
            "with the copy started and waited in the same kernel."
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def interpreter_limit(error: Exception) -> SimulationUnsupportedError:
    """The error for a program jax's interpreter failed to lower (trace had succeeded).

    Lowering is where jax's interpreter turns each kernel equation into host
    callbacks; a construct it does not implement (a ref view such as a
    ``SelectTransform``, shard_map's ``check_vma`` on an interpreted body, ...)
    fails there with jax's own error.  The kernel may well be correct: this
    names the construct and the user's line, and points to ``verify``.
    """
    where = probes.exception_location(error)
    if where is None and error.__cause__ is not None:  # jax's "before transformation" trace
        where = probes.exception_location(error.__cause__)
    at = f" at {where}" if where else ""
    vma = (
        " (an interpreted kernel under a jax.shard_map with check_vma=True: pass "
        "check_vma=False to your shard_map, or mesh= to simulate, which does)"
        if "varying manual axes" in str(error)
        else ""
    )
    return SimulationUnsupportedError(
        f"simulate cannot run this program: jax's TPU interpreter failed while preparing "
        f"the kernel{at}: {type(error).__name__}: {_first_line(error)}{vma}. Most often "
        "this is a construct jax's interpreter does not implement, and the kernel may "
        "well be correct (jax's error above says which); check the protocol with "
        "safedma.testing.verify, which reads the kernel instead of running it."
    )


#: Where jax's interpreter and the ref machinery it calls live: an error of
#: one of the kinds below raised from here is the interpreter meeting a
#: construct it does not implement (an ``AttributeError`` on a ref transform
#: it has no case for, a ``NotImplementedError``), not a check it makes on
#: the kernel (those raise ``IndexError`` / ``ValueError`` with the kernel's
#: mistake in the message).
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
_INTERPRETER_PARTS = (
    os.path.join("_src", "pallas", "mosaic", "interpret") + os.sep,
    os.path.join("_src", "state") + os.sep,
)
_LIMIT_KINDS = (NotImplementedError, AttributeError, TypeError)


def raised_by_interpreter(error: BaseException) -> bool:
    """True if ``error`` is jax's interpreter failing on a construct it lacks, at run time:
    raised inside jax, in frames the interpreter entered after the last frame of user
    code (the interpreter's own code, or jax code it calls: an index vector turned into
    a Python int by ``jax.Array.__int__`` while it runs a gather DMA)."""
    if not isinstance(error, _LIMIT_KINDS):
        return False
    tb = error.__traceback__
    files: list[str] = []
    while tb is not None:
        files.append(os.path.abspath(tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    if not files or not files[-1].startswith(_JAX_DIR):
        return False
    inner: list[str] = []
    for path in reversed(files):  # the jax frames below the last frame outside jax
        if not path.startswith(_JAX_DIR):
            break
        inner.append(path[len(_JAX_DIR) :])
    return any(path.startswith(part) for path in inner for part in _INTERPRETER_PARTS)


def run_time_limit(error: BaseException, device: str | None) -> SimulationUnsupportedError:
    """The error for a kernel jax's interpreter stopped on at run time (see above)."""
    where = probes.exception_location(error)
    at = f" at {where}" if where else ""
    on = f" on {device}" if device else ""
    result = SimulationUnsupportedError(
        f"simulate cannot run this kernel: jax's TPU interpreter stopped{on}{at} on a "
        f"construct it does not implement: {type(error).__name__}: {_first_line(error)} "
        "(a ref view such as .bitcast() or .reshape() on a ref, for instance). Most "
        "often this is a limit of jax's interpreter and the kernel may well be correct "
        "(jax's error says which); check the protocol with safedma.testing.verify, "
        "which reads the kernel instead of running it."
    )
    result.__cause__ = error
    return result
