"""Strict simulation: run TPU kernels in interpret mode on CPU, where misuse fails loudly.

TPU interpret mode can simulate DMAs and semaphores over several CPU
devices, but by default a race only sets a flag (jax 0.10), a semaphore left
non-zero at kernel exit is only printed (first one per device), and a wait
that can never be satisfied hangs the process.  On a TPU those are silent
corruption, a crash and a hang.  :func:`simulate` runs a function under
interpret mode with races fatal and DMAs executed eagerly, and turns each of
those into a :class:`~safedma.testing.SimulationError` naming the device,
the semaphore and the user's line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from jax.sharding import Mesh, PartitionSpec
from jax.typing import ArrayLike

from safedma._arguments import check_callable
from safedma.testing._runner import SimulationConfig, run_simulation

__all__ = ["simulate"]

T = TypeVar("T")


def simulate(
    fn: Callable[..., T],
    *args: ArrayLike,
    mesh: Mesh | None = None,
    in_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    out_specs: PartitionSpec | Sequence[PartitionSpec] | None = None,
    timeout_s: float = 60.0,
    uninitialized_memory: Literal["nan", "zero"] = "nan",
    progress: bool | None = None,
) -> T:
    """Run ``fn(*args)`` in strict TPU interpret mode, so DMA misuse fails instead of passing.

    Every ``pallas_call`` traced inside ``fn`` runs in interpret mode with race
    detection on, races fatal and DMAs executed when started; this wins over
    any ``interpret=`` it was built with, even outside ``fn`` (``pl.kernel``
    and ``pl.core_map`` kernels too).  With ``mesh``, ``fn``
    is the per-device body: it runs as ``jax.jit(jax.shard_map(fn, mesh=mesh,
    ..., check_vma=False))`` with the arguments placed on the mesh;
    ``in_specs`` (one spec for all arguments, or one per argument) and
    ``out_specs`` default to splitting the leading dimension over all mesh
    axes.  Returns ``fn``'s outputs.

    Raises, as soon as the outcome is known: :class:`RaceDetectedError` (R1),
    :class:`KernelFailedError` (a device raised: the error itself, its device
    and line), :class:`UnsatisfiableWaitError` (R3: every device blocked and
    nothing left that could signal), :class:`SimulationTimeoutError` (still
    running after ``timeout_s`` of execution, compilation not counted),
    :class:`LeftoverSemaphoreError` (R2, R4), or
    :class:`SimulationUnsupportedError` before starting a run this JAX cannot
    simulate.  After any of them, and after a ``KeyboardInterrupt`` (which
    propagates unchanged), the run is stopped on every device and interpret
    mode is reset, so the next run starts clean.  Errors raised while tracing
    (safedma's own checks) propagate unchanged.

    Cost: jax's race detector compares every access to a buffer with every
    earlier access to it in the kernel (it keeps them all), so a kernel whose
    loop touches one buffer n times costs time quadratic in n; keep simulated
    loops to hundreds of iterations and give ``timeout_s`` room to match.
    The race check gives every copy in flight a vector-clock entry of its own
    (64 at first); a run with more copies in flight at once runs again with
    more entries (``timeout_s`` counts each run on its own), and past 1024 it
    is refused with :class:`SimulationUnsupportedError`.

    ``progress`` shows what the run is doing on a line of stderr once it has run for
    two seconds (erased at the end): True always, False never, None when stderr is a
    terminal.
    """
    check_callable(
        fn, "fn", "safedma.testing.simulate()", "Pass the function to run, then its arguments."
    )
    config = SimulationConfig(
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
        timeout_s=timeout_s,
        uninitialized_memory=uninitialized_memory,
        progress=progress,
    )
    return run_simulation(fn, args, config)
