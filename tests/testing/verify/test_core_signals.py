"""Signals between the cores of one device: a core's scratch and run_scoped semaphores
are its own, allocated when it gets there, so one core signalling another's before
knowing it allocated them is R10, and the message cites jax's rule for it (the core_map
guide's barrier "to ensure resources have been allocated").

The kernel has the shape of jax's own interpret-mode test of a ``shard_map`` over a
``core_map`` (here a ``pl.kernel`` over the cores): every core signals a
``run_scoped`` REGULAR semaphore on every core and waits for all of them, as a barrier. jax's interpreter runs it; on a chip nothing
orders a sibling core's allocation before the first signal lands.
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

from safedma.testing import SignalAfterExitError, verify
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
