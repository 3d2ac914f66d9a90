"""Raw pltpu twins of tpu_kernels.py: the same kernels as written by hand.

Same algorithms, same pallas_call set-ups; the Mosaic identity benchmark
checks that each lowers exactly like its safedma version.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from benchmarks.tpu_kernels import HBM, ROW_BYTES, chunk_rows


def hbm_to_vmem_kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sems: Any, *, repeats: int) -> None:
    rows = bufs.shape[1]
    n = x_hbm.shape[0] // rows
    total = n * repeats

    def fetch(k: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds((k % n) * rows, rows)], bufs.at[slot], sems.at[slot]
        )

    fetch(0, 0).start()

    def step(k: Any, carry: None) -> None:
        slot = k % 2

        @pl.when(k + 1 < total)
        def _() -> None:
            fetch(k + 1, 1 - slot).start()

        fetch(k, slot).wait()
        return carry

    jax.lax.fori_loop(0, total, step, None)
    c = pltpu.make_async_copy(bufs.at[(total - 1) % 2], o_hbm, sems.at[0])
    c.start()
    c.wait()


def vmem_to_hbm_kernel(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any, *, repeats: int) -> None:
    rows = buf.shape[0]
    n = o_hbm.shape[0] // rows
    total = n * repeats
    c = pltpu.make_async_copy(x_hbm, buf, sems.at[0])
    c.start()
    c.wait()

    def store(k: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(buf, o_hbm.at[pl.ds((k % n) * rows, rows)], sems.at[slot])

    if n == 1:

        def one(k: Any, carry: None) -> None:
            s = store(k, 0)
            s.start()
            s.wait()
            return carry

        jax.lax.fori_loop(0, total, one, None)
        return

    store(0, 0).start()

    def step(k: Any, carry: None) -> None:
        slot = k % 2

        @pl.when(k + 1 < total)
        def _() -> None:
            store(k + 1, 1 - slot).start()

        store(k, slot).wait()
        return carry

    jax.lax.fori_loop(0, total, step, None)


def hbm_to_hbm_kernel(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(x_hbm, o_hbm, sem)
    c.start()
    c.wait()


def remote_copy_kernel(
    x_hbm: Any, o_hbm: Any, send_sem: Any, recv_sem: Any, *, repeats: int
) -> None:
    n = jax.lax.axis_size("x")
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={"x": (jax.lax.axis_index("x") + (n - 1)) % n})
    pl.semaphore_signal(barrier, 1, device_id={"x": (jax.lax.axis_index("x") + 1) % n})
    pl.semaphore_wait(barrier, 2)

    rows = x_hbm.shape[0]

    def step(k: Any, carry: None) -> None:
        c = pltpu.make_async_remote_copy(
            x_hbm,
            o_hbm.at[pl.ds(k * rows, rows)],
            send_sem,
            recv_sem,
            device_id={"x": (jax.lax.axis_index("x") + 1) % n},
        )
        c.start()
        c.wait_send()
        c.wait_recv()
        return carry

    jax.lax.fori_loop(0, repeats, step, None)


def hbm_to_vmem(x: jax.Array, *, repeats: int = 1) -> jax.Array:
    rows = chunk_rows(x.shape[0] * ROW_BYTES)
    body = functools.update_wrapper(
        functools.partial(hbm_to_vmem_kernel, repeats=repeats), hbm_to_vmem_kernel
    )
    result: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((rows, 128), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.VMEM((2, rows, 128), x.dtype), pltpu.SemaphoreType.DMA((2,))],
        name="hbm_to_vmem",
    )(x)
    return result


def vmem_to_hbm(x: jax.Array, *, size_bytes: int, repeats: int = 1) -> jax.Array:
    rows = chunk_rows(size_bytes)
    body = functools.update_wrapper(
        functools.partial(vmem_to_hbm_kernel, repeats=repeats), vmem_to_hbm_kernel
    )
    result: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((size_bytes // ROW_BYTES, 128), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.VMEM((rows, 128), x.dtype), pltpu.SemaphoreType.DMA((2,))],
        name="vmem_to_hbm",
    )(x[:rows])
    return result


def hbm_to_hbm(x: jax.Array) -> jax.Array:
    result: jax.Array = pl.pallas_call(
        hbm_to_hbm_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        name="hbm_to_hbm",
    )(x)
    return result


def remote_copy(x: jax.Array, *, repeats: int = 1) -> jax.Array:
    body = functools.update_wrapper(
        functools.partial(remote_copy_kernel, repeats=repeats), remote_copy_kernel
    )
    result: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((repeats * x.shape[0], *x.shape[1:]), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        name="remote_copy",
    )(x)
    return result
