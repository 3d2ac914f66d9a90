"""``pl.run_state`` around stateful pallas_calls that close over its refs, with a DMA future
between them, under verify.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import LeftoverSemaphoreError, verify

F32 = jnp.float32
HERE = r"test_run_state\.py:\d+"
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------------------ run_state around stateful kernels


def _stateful_future(*, wait: bool) -> Any:
    """``pl.run_state`` makes refs of two arrays; one pallas_call, closing over them,
    starts a copy and returns its semaphore; a second one waits for it."""

    def fn(x: Any) -> Any:
        def body(refs: Any) -> None:
            x_ref, y_ref = refs

            def start_kernel(sem: Any) -> None:
                pltpu.make_async_copy(x_ref, y_ref, sem).start()

            def done_kernel(sem: Any) -> None:
                if wait:
                    pltpu.make_async_copy(x_ref, y_ref, sem).wait()

            sem = pl.pallas_call(
                start_kernel, out_shape=pltpu.SemaphoreType.DMA(()), out_specs=SEM
            )()
            pl.pallas_call(done_kernel, out_shape=(), in_specs=[SEM])(sem)

        _, y = pl.run_state(body)((x, jnp.zeros_like(x)))
        return y

    return fn


def test_a_stateful_future_inside_run_state_is_verified() -> None:
    assert verify(_stateful_future(wait=True), X).waits == 1


def test_a_stateful_future_never_waited_is_caught() -> None:
    with pytest.raises(LeftoverSemaphoreError, match=HERE):
        verify(_stateful_future(wait=False), X)
