"""The kernels of the trace-and-lower benchmark, each written twice: safedma and raw pltpu.

Every ``make_*`` call returns brand-new Python functions (bodies and the
program around them), so that tracing them again can never hit a jax cache
keyed on the function: each repetition pays the full trace and lowering.

* ``straight``: 256 local DMAs in straight-line code, in 16 groups of 8
  HBM -> VMEM copies (started together, then waited) and 8 copies back.
* ``double_buffer``: a ``fori_loop`` streaming two inputs through VMEM with
  double-buffered fetches and write-backs (prefetch, started-elsewhere
  waits, ``pl.when``), the pattern of a real elementwise kernel.
* ``remote``: 64 remote DMAs in straight-line code to neighbours at shifts
  1 to 3 around a ring, in groups of 8 (both sides waited), inside
  ``jax.shard_map``: the device ids go through ``safedma.neighbour``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

Program = Callable[[jax.Array], jax.Array]
HBM = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
ROWS, COLS, GROUP = 8, 128, 8

STRAIGHT_COPIES = 256
STRAIGHT_GROUPS = STRAIGHT_COPIES // (2 * GROUP)
STRAIGHT_INPUT = jax.ShapeDtypeStruct((STRAIGHT_GROUPS * GROUP * ROWS, COLS), F32)

LOOP_STEPS, LOOP_CHUNK = 64, 16
LOOP_INPUT = jax.ShapeDtypeStruct((LOOP_STEPS * LOOP_CHUNK, COLS), F32)

REMOTE_COPIES = 64
REMOTE_BLOCK = (REMOTE_COPIES * ROWS, COLS)


# ---------------------------------------------------------------- straight-line, 256 copies


def make_straight_safedma() -> Program:
    def body(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sems: sd.SemArray) -> None:
        for g in range(STRAIGHT_GROUPS):
            rows = [pl.ds((g * GROUP + j) * ROWS, ROWS) for j in range(GROUP)]
            fetched = [
                sd.LocalCopy(x_hbm.at[rows[j]], buf.at[j], sems.at[j]).start() for j in range(GROUP)
            ]
            for handle in fetched:
                handle.wait()
            buf[...] = buf[...] * 2.0
            stored = [
                sd.LocalCopy(buf.at[j], o_hbm.at[rows[j]], sems.at[j]).start() for j in range(GROUP)
            ]
            for handle in stored:
                handle.wait()

    def program(x: jax.Array) -> jax.Array:
        return sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[sd.vmem((GROUP, ROWS, COLS), F32), sd.dma_semaphores(GROUP)],
        )(x)

    return program


def make_straight_pltpu() -> Program:
    def body(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
        for g in range(STRAIGHT_GROUPS):
            rows = [pl.ds((g * GROUP + j) * ROWS, ROWS) for j in range(GROUP)]
            fetched = [
                pltpu.make_async_copy(x_hbm.at[rows[j]], buf.at[j], sems.at[j])
                for j in range(GROUP)
            ]
            for copy in fetched:
                copy.start()
            for copy in fetched:
                copy.wait()
            buf[...] = buf[...] * 2.0
            stored = [
                pltpu.make_async_copy(buf.at[j], o_hbm.at[rows[j]], sems.at[j])
                for j in range(GROUP)
            ]
            for copy in stored:
                copy.start()
            for copy in stored:
                copy.wait()

    def program(x: jax.Array) -> jax.Array:
        result: jax.Array = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[
                pltpu.VMEM((GROUP, ROWS, COLS), F32),
                pltpu.SemaphoreType.DMA((GROUP,)),
            ],
        )(x)
        return result

    return program


# ---------------------------------------------------------------- double-buffered loop


def make_loop_safedma() -> Program:
    def body(
        a_hbm: sd.DataRef,
        b_hbm: sd.DataRef,
        o_hbm: sd.DataRef,
        a_bufs: sd.DataRef,
        b_bufs: sd.DataRef,
        o_bufs: sd.DataRef,
        a_sems: sd.SemArray,
        b_sems: sd.SemArray,
        o_sems: sd.SemArray,
    ) -> None:
        def rows(step: jax.Array | int) -> Any:  # pl.ds: a Slice (jax 0.10: or a slice)
            return pl.ds(step * LOOP_CHUNK, LOOP_CHUNK)

        def fetch_a(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
            return sd.LocalCopy(a_hbm.at[rows(step)], a_bufs.at[slot], a_sems.at[slot])

        def fetch_b(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
            return sd.LocalCopy(b_hbm.at[rows(step)], b_bufs.at[slot], b_sems.at[slot])

        def store(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
            return sd.LocalCopy(o_bufs.at[slot], o_hbm.at[rows(step)], o_sems.at[slot])

        fetch_a(0, 0).start()
        fetch_b(0, 0).start()

        def step_body(step: jax.Array, carry: None) -> None:
            slot = step % 2

            @pl.when(step + 1 < LOOP_STEPS)
            def _prefetch() -> None:
                fetch_a(step + 1, 1 - slot).start()
                fetch_b(step + 1, 1 - slot).start()

            fetch_a(step, slot).started_elsewhere().wait()
            fetch_b(step, slot).started_elsewhere().wait()

            @pl.when(step >= 2)
            def _free() -> None:
                store(step - 2, slot).started_elsewhere().wait()

            o_bufs[slot] = a_bufs[slot] + b_bufs[slot]
            store(step, slot).start()
            return carry

        jax.lax.fori_loop(0, LOOP_STEPS, step_body, None)
        for step in range(LOOP_STEPS - 2, LOOP_STEPS):
            store(step, step % 2).started_elsewhere().wait()

    def program(x: jax.Array) -> jax.Array:
        chunk = (2, LOOP_CHUNK, COLS)
        return sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM, HBM],
            out_specs=HBM,
            scratch_shapes=[
                sd.vmem(chunk, F32),
                sd.vmem(chunk, F32),
                sd.vmem(chunk, F32),
                sd.dma_semaphores(2),
                sd.dma_semaphores(2),
                sd.dma_semaphores(2),
            ],
        )(x, x)

    return program


def make_loop_pltpu() -> Program:
    def body(
        a_hbm: Any,
        b_hbm: Any,
        o_hbm: Any,
        a_bufs: Any,
        b_bufs: Any,
        o_bufs: Any,
        a_sems: Any,
        b_sems: Any,
        o_sems: Any,
    ) -> None:
        def rows(step: Any) -> Any:
            return pl.ds(step * LOOP_CHUNK, LOOP_CHUNK)

        def fetch_a(step: Any, slot: Any) -> Any:
            return pltpu.make_async_copy(a_hbm.at[rows(step)], a_bufs.at[slot], a_sems.at[slot])

        def fetch_b(step: Any, slot: Any) -> Any:
            return pltpu.make_async_copy(b_hbm.at[rows(step)], b_bufs.at[slot], b_sems.at[slot])

        def store(step: Any, slot: Any) -> Any:
            return pltpu.make_async_copy(o_bufs.at[slot], o_hbm.at[rows(step)], o_sems.at[slot])

        fetch_a(0, 0).start()
        fetch_b(0, 0).start()

        def step_body(step: Any, carry: None) -> None:
            slot = step % 2

            @pl.when(step + 1 < LOOP_STEPS)
            def _() -> None:
                fetch_a(step + 1, 1 - slot).start()
                fetch_b(step + 1, 1 - slot).start()

            fetch_a(step, slot).wait()
            fetch_b(step, slot).wait()

            @pl.when(step >= 2)
            def _() -> None:
                store(step - 2, slot).wait()

            o_bufs[slot] = a_bufs[slot] + b_bufs[slot]
            store(step, slot).start()
            return carry

        jax.lax.fori_loop(0, LOOP_STEPS, step_body, None)
        for step in range(LOOP_STEPS - 2, LOOP_STEPS):
            store(step, step % 2).wait()

    def program(x: jax.Array) -> jax.Array:
        chunk = (2, LOOP_CHUNK, COLS)
        result: jax.Array = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM, HBM],
            out_specs=HBM,
            scratch_shapes=[
                pltpu.VMEM(chunk, F32),
                pltpu.VMEM(chunk, F32),
                pltpu.VMEM(chunk, F32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        )(x, x)
        return result

    return program


# ---------------------------------------------------------------- straight-line, 64 remote copies


def make_remote_safedma() -> Program:
    def body(
        x_hbm: sd.DataRef, o_hbm: sd.DataRef, send_sems: sd.SemArray, recv_sems: sd.SemArray
    ) -> None:
        for g in range(REMOTE_COPIES // GROUP):
            handles = []
            for j in range(GROUP):
                rows = pl.ds((g * GROUP + j) * ROWS, ROWS)
                copy = (
                    sd.RemoteCopy(x_hbm.at[rows], o_hbm.at[rows], recv_sems.at[j])
                    .with_send_sem(send_sems.at[j])
                    .to(sd.neighbour("x", 1 + (g + j) % 3))
                )
                handles.append(copy.start())
            for handle in handles:
                handle.wait()

    def per_device(block: jax.Array) -> jax.Array:
        return sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[sd.dma_semaphores(GROUP), sd.dma_semaphores(GROUP)],
        )(block)

    return per_device


def make_remote_pltpu() -> Program:
    def body(x_hbm: Any, o_hbm: Any, send_sems: Any, recv_sems: Any) -> None:
        n = jax.lax.axis_size("x")
        for g in range(REMOTE_COPIES // GROUP):
            copies = []
            for j in range(GROUP):
                rows = pl.ds((g * GROUP + j) * ROWS, ROWS)
                target = (jax.lax.axis_index("x") + (1 + (g + j) % 3) % n) % n
                copy = pltpu.make_async_remote_copy(
                    x_hbm.at[rows],
                    o_hbm.at[rows],
                    send_sems.at[j],
                    recv_sems.at[j],
                    device_id={"x": target},
                )
                copy.start()
                copies.append(copy)
            for copy in copies:
                copy.wait_send()
                copy.wait_recv()

    def per_device(block: jax.Array) -> jax.Array:
        result: jax.Array = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA((GROUP,)), pltpu.SemaphoreType.DMA((GROUP,))],
        )(block)
        return result

    return per_device
