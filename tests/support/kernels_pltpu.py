"""Hand-written pltpu twins of kernels_safedma.py: what a careful author writes by hand."""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 8


def scale_copy(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait()
    buf[...] = buf[...] * 2.0 + 1.0
    c = pltpu.make_async_copy(buf, o_hbm, sem)
    c.start()
    c.wait()


def reverse_halves(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    half = x_hbm.shape[0] // 2
    c1 = pltpu.make_async_copy(x_hbm.at[pl.ds(0, half)], buf.at[pl.ds(half, half)], sems.at[0])
    c2 = pltpu.make_async_copy(x_hbm.at[pl.ds(half, half)], buf.at[pl.ds(0, half)], sems.at[1])
    c1.start()
    c2.start(priority=1)
    c1.wait()
    c2.wait()
    c3 = pltpu.make_async_copy(buf, o_hbm, sems.at[0])
    c3.start()
    c3.wait()


def double_buffered(
    x_hbm: Any, o_hbm: Any, bufs: Any, out_buf: Any, in_sems: Any, out_sem: Any
) -> None:
    steps = x_hbm.shape[0] // CHUNK

    def fetch(step: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], in_sems.at[slot]
        )

    fetch(0, 0).start()

    def body(step: Any, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _() -> None:
            fetch(step + 1, 1 - slot).start()

        fetch(step, slot).wait()
        out_buf[...] = bufs[slot] * 3.0
        c = pltpu.make_async_copy(out_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem)
        c.start()
        c.wait()
        return carry

    jax.lax.fori_loop(0, steps, body, None)


def ring_permute(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    c = pltpu.make_async_remote_copy(
        x_ref, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % n}
    )
    c.start()
    c.wait()


def ring_kernel(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    """:func:`ring_permute` with a positional device id (the compile and Mosaic tests'
    kernel, named ``ring_kernel`` in their reports)."""
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=((me + 1) % n,))
    copy.start()
    copy.wait()
