"""T9 in a raw-pltpu kernel: the barrier semaphore under a pallas_call with no collective_id.

jax's interpreter fails on it with ``TypeError: int(None)`` and Mosaic refuses
it when lowering for a TPU; neither names the mistake. ``simulate`` and
``verify`` both read the kernel's program first and raise safedma's
``MissingCollectiveIdError`` naming the line that takes the barrier and the
fix; the same kernel with a ``collective_id`` runs clean under both.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, simulate, simulated_mesh, verify

_signal: Callable[..., None] = getattr(pl, "semaphore_signal", None) or pltpu.semaphore_signal
_wait: Callable[..., None] = getattr(pl, "semaphore_wait", None) or pltpu.semaphore_wait


def _neighbour_barrier(x_ref: Any, o_ref: Any) -> None:
    barrier = pltpu.get_barrier_semaphore()
    right = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
    _signal(barrier, 1, device_id=(right,), device_id_type=pl.DeviceIdType.MESH)
    _wait(barrier, 1)
    o_ref[...] = x_ref[...]


_BARRIER_LINE = next(
    f"{__file__}:{inspect.getsourcelines(_neighbour_barrier)[1] + i}"
    for i, line in enumerate(inspect.getsourcelines(_neighbour_barrier)[0])
    if "get_barrier_semaphore" in line
)


def _program(collective_id: int | None) -> Callable[[jax.Array], jax.Array]:
    def per_device(x: jax.Array) -> jax.Array:
        return pl.pallas_call(
            _neighbour_barrier,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(x)

    return per_device


_X = jnp.zeros((4 * 8, 128), jnp.float32)
_CHECKS: dict[str, Callable[[Callable[..., Any]], object]] = {
    "simulate": lambda fn: simulate(
        fn, _X, mesh=simulated_mesh(4, ("x",)), in_specs=P("x"), out_specs=P("x")
    ),
    "verify": lambda fn: verify(
        fn, _X, mesh=abstract_mesh((4,), ("x",)), in_specs=P("x"), out_specs=P("x")
    ),
}


@pytest.mark.parametrize("check", sorted(_CHECKS))
def test_a_barrier_without_collective_id_names_the_line_and_the_fix(check: str) -> None:
    with pytest.raises(sd.MissingCollectiveIdError) as err:
        _CHECKS[check](_program(None))
    message = str(err.value)
    assert _BARRIER_LINE in message, message
    assert "compiler_params=pltpu.CompilerParams(collective_id=0)" in message


@pytest.mark.parametrize("check", sorted(_CHECKS))
def test_the_same_barrier_with_a_collective_id_is_clean(check: str) -> None:
    _CHECKS[check](_program(0))
