"""Lines of copies jax builds inside its helpers, under simulate.

``pltpu.sync_copy`` starts its copy inside a ``run_scoped`` body jax traces itself; jax
records, for an equation traced in a sub-jaxpr, only the frames since that sub-trace
began, so an out-of-range ``sync_copy`` was reported with no line. Every equation whose
traceback has no user frame gets the line of the nearest enclosing equation that has one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import KernelFailedError, simulate
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ 1: a copy jax builds inside sync_copy


def _write_window(s_ref: Any, x_ref: Any, o_ref: Any) -> None:
    pltpu.sync_copy(x_ref, o_ref.at[pl.ds(s_ref[0], 8)])  # the window's start from SMEM


def _read_window(s_ref: Any, x_ref: Any, o_ref: Any) -> None:
    pltpu.sync_copy(x_ref.at[pl.ds(s_ref[0], 8)], o_ref)


def _write_scratch_window(s_ref: Any, x_ref: Any, o_ref: Any, buf: Any) -> None:
    pltpu.sync_copy(x_ref, buf.at[pl.ds(s_ref[0], 8)])
    pltpu.sync_copy(buf.at[pl.ds(0, 8)], o_ref)


def _windowed(kernel: Any, scratch: bool = False) -> Any:
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM(BLOCK, F32)] if scratch else [],
    )


@pytest.mark.parametrize(
    ("kernel", "scratch", "what"),
    [
        (_write_window, False, "Out-of-bounds write"),
        (_read_window, False, "Out-of-bounds read"),
        (_write_scratch_window, True, "Out-of-bounds write"),
    ],
    ids=["hbm-write", "hbm-read", "vmem-write"],
)
def test_an_out_of_range_sync_copy_names_the_users_line(
    kernel: Any, scratch: bool, what: str
) -> None:
    with pytest.raises(KernelFailedError) as failed:
        simulate(_windowed(kernel, scratch), jnp.array([4], jnp.int32), example(BLOCK))
    message = str(failed.value)
    assert what in message, message
    line = line_of(kernel, "x_ref, buf.at" if scratch else "pltpu.sync_copy(")
    assert f"at {line} " in message, message
    assert_clean_afterwards()


@pytest.mark.parametrize("kernel", [_write_window, _read_window], ids=["write", "read"])
def test_the_same_sync_copy_in_range_runs_clean(kernel: Any) -> None:
    x = example(BLOCK)
    out = simulate(_windowed(kernel), jnp.array([0], jnp.int32), x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def _helper_copy(src: Any, dst: Any) -> None:
    # A helper of the user's own that builds the copy inside a run_scoped body:
    # the copy's traceback has the helper's frame, which is the user's.
    def body(sem: Any) -> None:
        copy = pltpu.make_async_copy(src, dst, sem)
        copy.start()
        copy.wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA(()))


def _write_window_by_helper(s_ref: Any, x_ref: Any, o_ref: Any) -> None:
    _helper_copy(x_ref, o_ref.at[pl.ds(s_ref[0], 8)])


def test_a_users_own_helper_is_still_named_by_its_own_line() -> None:
    with pytest.raises(KernelFailedError) as failed:
        simulate(_windowed(_write_window_by_helper), jnp.array([4], jnp.int32), example(BLOCK))
    assert f"at {line_of(_helper_copy, 'copy.start()')} " in str(failed.value)
