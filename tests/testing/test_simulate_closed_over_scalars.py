"""Constructs met running simulate over jax's own Pallas TPU tests.

Every kernel here is written for safedma's tests; each reproduces a construct
of jax's ``tpu_pallas_state_test.py`` (docs/simulate-jax-tests.md)
that simulate once mishandled.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import SimulationUnsupportedError, simulate
from tests.support.simulation import assert_clean_afterwards, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

I32 = jnp.int32
SHAPE = (4, 8, 128)


def _one_core_kernel(body: Any, out: jax.ShapeDtypeStruct) -> Any:
    """``pl.kernel(body)`` over one TensorCore, on either jax version."""
    params = inspect.signature(pl.kernel).parameters
    shapes = {"out_type": out} if "out_type" in params else {"out_shape": out}
    return pl.kernel(body, mesh=pltpu.create_tensorcore_mesh("core", num_cores=1), **shapes)


def _pick_row(x: jax.Array, i: Any) -> jax.Array:
    def body(x_ref: Any, o_ref: Any) -> None:
        pltpu.sync_copy(x_ref.at[i], o_ref.at[0])  # the captured index

    out: jax.Array = _one_core_kernel(body, jax.ShapeDtypeStruct((1, *SHAPE[1:]), I32))(x)
    return out


def _pick_traced_row(x: jax.Array, i: jax.Array) -> jax.Array:
    return _pick_row(x, i)  # the kernel call


def test_a_kernel_body_closing_over_a_traced_scalar_is_refused_naming_the_call() -> None:
    # jax's interpreter hands the captured scalar over as a buffer: index 2 was
    # read as buffer id 101, and a correct kernel failed with an out-of-bounds read.
    x = jnp.arange(int(np.prod(SHAPE)), dtype=I32).reshape(SHAPE)
    with pytest.raises(SimulationUnsupportedError) as caught:
        simulate(_pick_traced_row, x, jnp.int32(2))
    message = str(caught.value)
    assert "closes over a scalar value" in message, message
    assert line_of(_pick_row, "_one_core_kernel(body") in message, message
    assert "safedma.testing.verify" in message, message
    assert_clean_afterwards()


def test_a_kernel_body_with_a_constant_index_runs_clean() -> None:
    x = jnp.arange(int(np.prod(SHAPE)), dtype=I32).reshape(SHAPE)
    out = simulate(lambda x: _pick_row(x, 2), x)
    np.testing.assert_array_equal(np.asarray(out)[0], np.asarray(x)[2])
