"""verify never hangs: a loop that cannot end is reported, anything else is bounded.

A kernel ``while`` loop whose state is the same after an iteration as before it,
where neither the condition nor the next state reads memory, can never end (the
TPU hangs): verify says so at once, naming the loop's line. A loop whose progress
depends on memory (an SMEM step), or a grid too large for the time given, stops at
``timeout_s`` with :class:`SimulationTimeoutError` naming where it was.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import KernelFailedError, SimulationTimeoutError, verify
from tests.support.source_lines import marker_line

_X = jnp.zeros((8, 128), jnp.float32)


def _copy_loop(step: Callable[[Any, Any], Any]) -> Callable[..., jax.Array]:
    """A kernel copying x into o in a while loop ``i < 4`` whose next ``i`` is
    ``step(i, n_ref)`` (``n_ref``: an SMEM operand)."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, sem: Any) -> None:
        def body(i: Any) -> Any:
            copy = pltpu.make_async_copy(x_ref, o_ref, sem)
            copy.start()
            copy.wait()
            return step(i, n_ref)

        lax.while_loop(lambda i: i < 4, body, 0)  # the loop

    def fn(n: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[
                pl.BlockSpec(memory_space=pltpu.SMEM),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(n, x)
        return out

    return fn


def test_a_loop_that_never_advances_is_reported_at_its_line() -> None:
    fn = _copy_loop(lambda i, n_ref: i)  # the counter is never advanced
    with pytest.raises(KernelFailedError) as caught:
        verify(fn, jnp.ones((1,), jnp.int32), _X)
    msg = str(caught.value)
    assert f"test_termination.py:{marker_line(__file__, '# the loop')}" in msg
    assert "never ends on device 0" in msg and "carry (0)" in msg
    assert "advance the loop's counter" in msg


@pytest.mark.parametrize("step", [lambda i, n_ref: i + 1, lambda i, n_ref: i + n_ref[0]])
def test_loops_that_advance_are_clean(step: Callable[[Any, Any], Any]) -> None:
    # the second reads its step from memory (1 here): never judged from its state
    report = verify(_copy_loop(step), jnp.ones((1,), jnp.int32), _X)
    assert report.dmas == 4 and report.waits == 4


def test_a_loop_stuck_on_a_value_in_memory_stops_at_the_timeout() -> None:
    fn = _copy_loop(lambda i, n_ref: i + n_ref[0])  # n_ref[0] == 0: stuck, from memory
    t0 = time.monotonic()
    with pytest.raises(SimulationTimeoutError) as caught:
        verify(fn, jnp.zeros((1,), jnp.int32), _X, timeout_s=1.0)
    assert time.monotonic() - t0 < 60  # bounded (tracing is inside the budget too)
    msg = str(caught.value)
    assert "timeout_s=1" in msg and "device 0 was still in the while loop at" in msg
    assert (
        f"test_termination.py:{marker_line(__file__, '# the loop')}" in msg
        and "larger timeout_s" in msg
    )


def test_a_grid_too_large_for_the_time_given_stops_at_the_timeout() -> None:
    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            grid=(10**8,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
        )(x)
        return out

    with pytest.raises(SimulationTimeoutError, match=r"still in the grid of kernel kernel at"):
        verify(fn, _X, timeout_s=1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_the_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        verify(lambda x: x, _X, timeout_s=bad)


@pytest.mark.parametrize("grid", [(), (3,), (2, 0), (2, 3, 2), (1, 1)])
def test_grid_points_are_made_lazily_in_row_major_order(grid: tuple[int, ...]) -> None:
    from safedma.testing._verify.walk.blocks import grid_points

    assert list(grid_points(grid)) == list(itertools.product(*[range(g) for g in grid]))
