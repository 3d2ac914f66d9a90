"""A deadlock or leftover on many devices at one line is one line, not one per device.

A ring of 256 devices all blocked at the same wait printed 256 identical lines; the
same wait (line, semaphore, amount, count held) on three or more devices is now one
line naming how many, the first two and the last, and who fed the semaphore (one
example when each device's feeder differs). Semaphores left non-zero the same way on
three or more devices (the same text once each device's own label and the peers it
names are set aside) are one line too. Waits and leftovers that differ stay apart,
in device order.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import LeftoverSemaphoreError, UnsatisfiableWaitError, abstract_mesh, verify
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _ring(kernel: Any, n: int, error: type[Exception] = UnsatisfiableWaitError) -> str:
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
    with pytest.raises(error) as caught:
        verify(per_device, x, mesh=abstract_mesh((n,), ("x",)))
    return str(caught.value)


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
    line = line_in(_nobody_sends, "every device blocks here")
    blocked = [row for row in text.splitlines() if row.startswith("  ")]
    assert len(blocked) == 1, text
    assert re.search(
        rf"256 devices \(device 0 \(x=0\), device 1 \(x=1\), \.\.\., device 255 \(x=255\)\) "
        rf"each wait at \S*test_grouped_lines\.py:{line} .*DMA semaphore send for 4096 bytes; "
        r"each holds 0 bytes, which nothing signalled",
        blocked[0],
    ), text


def test_devices_fed_by_different_neighbours_name_one_feeder() -> None:
    text = _ring(_waits_twice, 8)
    line = line_in(_waits_twice, "every device blocks here")
    blocked = [row for row in text.splitlines() if row.startswith("  ")]
    assert len(blocked) == 1, text
    assert f"test_grouped_lines.py:{line}" in blocked[0], text
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


def _leaves_counts(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    pltpu.make_async_copy(x_ref, o_ref, recv).start()  # never waited
    right = pltpu.make_async_remote_copy(o_ref, x_ref, send, send, device_id={"x": (me + 1) % n})
    del right


def _sends_unwaited(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})
    copy.start()
    copy.wait_recv()  # the send side is never waited


def test_the_same_leftover_on_every_device_is_one_line() -> None:
    text = _ring(_leaves_counts, 16, LeftoverSemaphoreError)
    rows = [row for row in text.splitlines() if row.startswith("  ")]
    assert text.startswith("16 semaphore counts not back to zero"), text
    assert len(rows) == 1, text
    assert rows[0].startswith(
        "  16 devices (device 0 (x=0), device 1 (x=1), ..., device 15 (x=15)) each: "
        "DMA semaphore recv holds 4096 bytes"
    ), text


def test_leftovers_naming_each_devices_peer_are_one_line_with_an_example() -> None:
    """A receive never waited names the copy's sender, a different device on each
    device of a ring: the lines differ only in device labels, so they are one line
    showing the first device's text."""
    from safedma.testing._verify.model.semantics import _leftover_lines

    labels = [f"device {i} (x={i})" for i in range(8)]
    items = [
        (
            i,
            "leaves the kernel",
            f"{labels[i]}: DMA semaphore recv holds 4096 bytes: the copy from "
            f"{labels[(i - 1) % 8]} started at k.py:9 (4096 bytes) was never waited",
        )
        for i in range(8)
    ]
    rows = _leftover_lines(labels, items)
    assert rows == [
        "  8 devices (device 0 (x=0), device 1 (x=1), ..., device 7 (x=7)) each: DMA "
        "semaphore recv holds 4096 bytes: the copy from device 7 (x=7) started at k.py:9 "
        "(4096 bytes) was never waited (as on device 0 (x=0); on the others with their "
        "own peers) (when it leaves the kernel)"
    ]
    # two devices: one line each, as before
    assert len(_leftover_lines(labels[:2], items[:2])) == 2


def test_leftovers_on_two_devices_stay_one_line_each_in_device_order() -> None:
    text = _ring(_sends_unwaited, 2, LeftoverSemaphoreError)
    rows = [row for row in text.splitlines() if row.startswith("  ")]
    assert [row.split(":")[0].strip() for row in rows] == ["device 0 (x=0)", "device 1 (x=1)"]
