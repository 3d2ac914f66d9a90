"""How each tool runs a corpus program: one function per tool, shared by the drivers in
tests/tools/ and by the subject tests that take their kernels from the corpus."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax

from tests.corpus._case import Program

SIMULATE_TIMEOUT_S = 10.0


def _mesh_context(mesh: Any) -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext() if mesh is None else jax.sharding.use_abstract_mesh(mesh)


@contextlib.contextmanager
def _raw_bodies_checked() -> Any:
    """Bodies of a plain ``pl.pallas_call`` (raw pltpu twins) traced under ``sd.checked``, as
    a user wraps a raw kernel: the trace-time checks then read their raw copies too."""
    import safedma as sd
    from jax.experimental import pallas as pl

    original = pl.pallas_call

    def checked_call(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        return original(sd.checked(kernel), *args, **kwargs)

    pl.pallas_call = checked_call
    try:
        yield
    finally:
        pl.pallas_call = original


def trace(program: Program) -> Any:
    """Trace the whole program: every kernel body runs (a plain ``pl.pallas_call``'s under
    ``sd.checked``), so every trace-time check runs; nothing is lowered. A ``lower=True`` program is lowered to Mosaic (for checks that
    run there, and to count its kernels): its Mosaic kernels are returned."""
    fn, args, mesh = program.whole()
    if program.lower:
        from safedma.testing import mosaic_kernels

        with _raw_bodies_checked():
            kernels = mosaic_kernels(fn, *args, mesh=mesh)
        assert kernels, "the program lowers to no Mosaic kernel"
        return kernels
    with _mesh_context(mesh), _raw_bodies_checked():
        jax.jit(fn).trace(*args)
    return None


def mosaic(program: Program, twin: Program) -> None:
    """Both programs lower to the same Mosaic (``MosaicMismatchError`` with a diff if not)."""
    from safedma.testing import assert_same_mosaic

    fn, args, mesh = program.whole()
    twin_fn, _, _ = twin.whole()
    assert_same_mosaic(fn, twin_fn, *args, mesh=mesh)


def verify(program: Program, *, real_mesh: bool = False) -> Any:
    """``safedma.testing.verify`` of the program, on its device-free mesh (or, with
    ``real_mesh``, on simulated devices of the same shape)."""
    from safedma.testing import verify as run

    mesh = None
    if program.mesh is not None:
        mesh = program.mesh.real() if real_mesh and program.per_device else program.mesh.abstract()
    return run(program.fn, *program.args, mesh=mesh, invocations=program.invocations)


def simulate(program: Program, *, timeout_s: float = SIMULATE_TIMEOUT_S) -> Any:
    """``safedma.testing.simulate`` of the program on simulated CPU devices."""
    from safedma.testing import simulate as run

    mesh = program.mesh.real() if program.per_device and program.mesh is not None else None
    return run(program.repeated(), *program.concrete_args(), mesh=mesh, timeout_s=timeout_s)


SANITIZE_HANG_S = 0.2
"""The sanitizer's spin bound in the corpus: a wait that has not completed 0.2 s in
(about 200 polls in interpret mode) is a hang; every correct kernel's waits complete
long before, so a correct case still has to run clean under it."""


@contextlib.contextmanager
def sanitizing() -> Iterator[None]:
    """The sanitizer on, in TPU interpret mode on the CPU: every ``sd.pallas_call``
    sanitized (``SAFEDMA_SANITIZE=1``), every raw ``pl.pallas_call`` routed through
    ``sd.pallas_call(..., sanitize=...)`` as a user who switches to it would. A program
    is built inside it too (some build their ``pallas_call`` when made)."""
    import pytest
    from jax.experimental.pallas import tpu as pltpu

    import safedma as sd
    from tests.sanitize.helpers import interpret, raw_calls_sanitized

    options = sd.SanitizeOptions(hang_after_s=SANITIZE_HANG_S)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAFEDMA_SANITIZE", "1")
        patch.setenv("SAFEDMA_SANITIZE_HANG_S", str(SANITIZE_HANG_S))
        with raw_calls_sanitized(patch, options), pltpu.force_tpu_interpret_mode(interpret()):
            yield


@contextlib.contextmanager
def unsanitized() -> Iterator[None]:
    """The same TPU interpret mode with the sanitizer off (``SAFEDMA_SANITIZE=0``)."""
    import pytest
    from jax.experimental.pallas import tpu as pltpu

    from tests.sanitize.helpers import interpret

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAFEDMA_SANITIZE", "0")
        with pltpu.force_tpu_interpret_mode(interpret()):
            yield


def sanitize(program: Program) -> Any:
    """The program run under :func:`sanitizing` (a per-device body under ``shard_map`` on
    simulated devices); a mistake comes back as the sanitizer's own error
    (``sd.sanitizer_errors``), else the outputs are returned."""
    import safedma as sd

    with sanitizing(), sd.sanitizer_errors():
        return jax.block_until_ready(execute(program))


def execute(program: Program) -> Any:
    """Run the program on concrete values: whole under ``jax.jit``, or each device's body under
    ``jax.jit(shard_map)`` over simulated CPU devices, arguments split along the leading
    dimension over every mesh axis."""
    args = program.concrete_args()
    if not program.per_device:
        # One jitted program, as verify reads it: a kernel whose caller reads only part
        # of its output is one program with that read, not an eager call returning it all.
        return jax.jit(program.repeated())(*args)
    from jax.sharding import NamedSharding, PartitionSpec as P

    assert program.mesh is not None
    mesh = program.mesh.real()
    spec = P(program.mesh.names)
    mapped = jax.jit(
        jax.shard_map(program.repeated(), mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )
    sharding = NamedSharding(mesh, spec)
    return mapped(*(jax.device_put(a, sharding) for a in args))
