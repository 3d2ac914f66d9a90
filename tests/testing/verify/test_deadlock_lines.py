"""A deadlock on many devices at one wait is one line, not one per device.

A ring of 256 devices all blocked at the same wait printed 256 identical lines; the
same wait (line, semaphore, amount, count held) on three or more devices is now one
line naming how many, the first two and the last, and who fed the semaphore (one
example when each device's feeder differs). Waits that differ stay apart.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnsatisfiableWaitError, abstract_mesh, verify

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _ring(kernel: Any, n: int) -> str:
    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    x = jax.ShapeDtypeStruct((n * 8, 128), jnp.float32)
    with pytest.raises(UnsatisfiableWaitError) as caught:
        verify(per_device, x, mesh=abstract_mesh((n,), ("x",)))
    return str(caught.value)


def _line_of(fn: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _nobody_sends(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})

    @pl.when(me < 0)
    def _never() -> None:
        copy.start()

    copy.wait_send()  # every device blocks here


def _waits_twice(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})
    copy.start()
    copy.wait_send()
    copy.wait_recv()
    copy.wait_recv()  # one copy came in: every device blocks here


def _two_apart(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})

    @pl.when(me != 1)
    def _send() -> None:
        copy.start()

    copy.wait_send()  # device 1 blocks here
    copy.wait_recv()  # device 2 blocks here


def test_a_ring_blocked_at_one_wait_is_one_line() -> None:
    text = _ring(_nobody_sends, 256)
    line = _line_of(_nobody_sends, "every device blocks here")
    blocked = [row for row in text.splitlines() if row.startswith("  ")]
    assert len(blocked) == 1, text
    assert re.search(
        rf"256 devices \(device 0 \(x=0\), device 1 \(x=1\), \.\.\., device 255 \(x=255\)\) "
        rf"each wait at \S*test_deadlock_lines\.py:{line} .*DMA semaphore send for 4096 bytes; "
        r"each holds 0 bytes, which nothing signalled",
        blocked[0],
    ), text


def test_devices_fed_by_different_neighbours_name_one_feeder() -> None:
    text = _ring(_waits_twice, 8)
    line = _line_of(_waits_twice, "every device blocks here")
    blocked = [row for row in text.splitlines() if row.startswith("  ")]
    assert len(blocked) == 1, text
    assert f"test_deadlock_lines.py:{line}" in blocked[0], text
    assert "8 devices (device 0 (x=0), device 1 (x=1), ..., device 7 (x=7))" in blocked[0]
    assert "each fed so far by other devices (e.g. device 0 (x=0) by device 7 (x=7))" in blocked[0]


def test_different_waits_stay_one_line_per_device() -> None:
    text = _ring(_two_apart, 4)
    blocked = [row for row in text.splitlines() if row.startswith("  ")]
    assert [row.split(" waits at ")[0].strip() for row in blocked] == [
        "device 1 (x=1)",
        "device 2 (x=2)",
    ], text
    assert "it holds 0 bytes" in text and "each holds" not in text
