"""A copy that lands after its kernel returned under verify: a permute whose receiver
returns without ``wait_recv`` is reported as the copy landing after its target left (R8,
naming the copy), not as an output nothing wrote.

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

from safedma.testing import SignalAfterExitError, UnwrittenReadError, abstract_mesh, verify

F32 = jnp.float32
HERE = r"test_copies_after_return\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------------- a receive never waited before return


def _permute(*, wait_recv: bool, send: bool = True) -> Any:
    """Each of two devices sends its block to the other (after a handshake)."""

    def kernel(x_ref: Any, y_ref: Any, ready: Any, send_sem: Any, recv_sem: Any) -> None:
        other = 1 - jax.lax.axis_index("x")
        pl.semaphore_signal(ready, device_id=other, device_id_type=pl.DeviceIdType.LOGICAL)
        pl.semaphore_wait(ready)
        if not send:
            return
        copy = pltpu.make_async_remote_copy(
            x_ref, y_ref, send_sem, recv_sem, other, device_id_type=pl.DeviceIdType.LOGICAL
        )
        copy.start()
        copy.wait_send()
        if wait_recv:
            copy.wait_recv()

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR] + [pltpu.SemaphoreType.DMA] * 2,
        )(x)

    return fn


def test_a_permute_that_waits_its_receive_is_clean() -> None:
    assert verify(_permute(wait_recv=True), X, mesh=abstract_mesh((2,), ("x",))).remote_dmas == 2


def test_a_receive_never_waited_is_reported_as_the_copy_landing_after_return() -> None:
    with pytest.raises(SignalAfterExitError, match=r"remote copy into y_ref.*" + HERE):
        verify(_permute(wait_recv=False), X, mesh=abstract_mesh((2,), ("x",)))


def test_an_output_nothing_writes_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match="y_ref"):
        verify(_permute(wait_recv=True, send=False), X, mesh=abstract_mesh((2,), ("x",)))
