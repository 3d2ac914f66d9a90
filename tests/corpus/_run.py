"""How each tool runs a corpus program: one function per tool, shared by the drivers in
tests/tools/ and by the subject tests that take their kernels from the corpus."""

from __future__ import annotations

import contextlib
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
