"""Signals between the cores of one device: a core's scratch and run_scoped semaphores
are its own, allocated when it gets there, so one core signalling another's before
knowing it allocated them is R10, and the message cites jax's rule for it (the core_map
guide's barrier "to ensure resources have been allocated").

The kernel has the shape of jax's own interpret-mode test of a ``shard_map`` over a
``core_map`` (here a ``pl.kernel`` over the cores): every core signals a
``run_scoped`` REGULAR semaphore on every core and waits for all of them, as a barrier. jax's interpreter runs it; on a chip nothing
orders a sibling core's allocation before the first signal lands.

``semaphore_signal(..., core_index=k)`` signals core k of the target device (as the core
axis of a ``device_id`` dict does), not the signalling core itself; a wrong or out-of-range
core index is caught and says how to model the cores.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import (
    DeadlockError,
    SignalAfterExitError,
    SimulationError,
    abstract_mesh,
    verify,
)
from tests.corpus._case import marked_lines, names_line

HERE = Path(__file__)
CORES = 2
ROWS = 16


def _core_mesh() -> Any:
    if hasattr(pltpu, "TensorCoreMesh") and "num_cores" in str(
        getattr(pltpu.TensorCoreMesh, "__dataclass_fields__", "")
    ):
        return pltpu.TensorCoreMesh(axis_name="core", num_cores=CORES)
    return pltpu.create_tensorcore_mesh("core", num_cores=CORES)


def _scoped_semaphore_barrier() -> Any:
    rows = ROWS // CORES

    def per_core(x_ref: Any, y_ref: Any, x_vmem: Any, y_vmem: Any, dma: Any, sem: Any) -> None:
        for core in range(CORES):
            pl.semaphore_signal(sem, 1, core_index=core)  # fix: scoped_barrier
        pl.semaphore_wait(sem, CORES)
        mine = pl.ds(jax.lax.axis_index("core") * rows, rows)
        pltpu.async_copy(x_ref.at[mine], x_vmem, dma).wait()
        y_vmem[...] = x_vmem[...] + 1
        pltpu.async_copy(y_vmem, y_ref.at[mine], dma).wait()

    def body(x_ref: Any, y_ref: Any) -> None:
        pl.run_scoped(
            lambda *scoped: per_core(x_ref, y_ref, *scoped),
            pltpu.VMEM((rows, 128), jnp.float32),
            pltpu.VMEM((rows, 128), jnp.float32),
            pltpu.SemaphoreType.DMA,
            pltpu.SemaphoreType.REGULAR,
        )

    out = jax.ShapeDtypeStruct((ROWS, 128), jnp.float32)
    shape: dict[str, Any] = (
        {"out_type": out}  # jax 0.12
        if "out_type" in inspect.signature(pl.kernel).parameters
        else {"out_shape": out}  # jax 0.10
    )
    return pl.kernel(body, mesh=_core_mesh(), **shape)


def test_a_run_scoped_semaphore_as_a_barrier_between_cores_is_r10_citing_the_rule() -> None:
    with pytest.raises(SignalAfterExitError) as caught:
        verify(_scoped_semaphore_barrier(), jax.ShapeDtypeStruct((ROWS, 128), jnp.float32))
    message = str(caught.value)
    assert "core 1" in message, message
    assert "to ensure resources have been allocated" in message, message
    assert "barrier semaphore" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "scoped_barrier")), message


F32 = jnp.float32
HERE_LINE = r"test_core_signals\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ----------------------------------------- a signal to the other core by core_index


def _core_handoff(how: str) -> Any:
    """Grid (2,), "parallel": on a megacore chip each TensorCore runs one step. Core 0
    copies its half and signals core 1 (``core_index=1``, or the same by a ``device_id``
    dict, or wrongly itself); core 1 waits, then forwards core 0's half."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, ready: Any) -> None:
        core = pl.program_id(0)
        copy = pltpu.make_async_copy(
            x_ref.at[pl.ds(core * 8, 8)], o_ref.at[pl.ds(core * 8, 8)], sem
        )
        copy.start()
        copy.wait()

        @pl.when(core == 0)
        def _() -> None:
            if how == "core_index":
                pl.semaphore_signal(ready, 1, core_index=1)
            elif how == "dict":
                pl.semaphore_signal(ready, 1, device_id={"core": 1})
            else:
                pl.semaphore_signal(ready, 1, core_index=0)  # itself

        @pl.when(core == 1)
        def _() -> None:
            pl.semaphore_wait(ready, 1)
            forward = pltpu.make_async_copy(o_ref.at[pl.ds(0, 8)], buf, sem)
            forward.start()
            forward.wait()

    def fn(x: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(2,),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[
                pltpu.VMEM((8, 128), F32),
                pltpu.SemaphoreType.DMA,
                pltpu.SemaphoreType.REGULAR,
            ],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        )(x)

    return fn


@pytest.mark.parametrize("how", ["core_index", "dict"])
def test_a_signal_to_the_other_core_by_core_index_reaches_it(how: str) -> None:
    report = verify(_core_handoff(how), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5p"))
    assert report.signals == 1


def test_a_signal_by_core_index_to_the_wrong_core_is_caught() -> None:
    with pytest.raises(DeadlockError, match=HERE_LINE):
        verify(_core_handoff("self"), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5p"))


def test_a_core_index_past_the_cores_of_the_device_says_how_to_model_them() -> None:
    with pytest.raises(SimulationError, match=r"core index 1 .*tpu='v5p'"):
        verify(_core_handoff("core_index"), _s(16, 128), mesh=abstract_mesh((), (), tpu="v5e"))
