"""Pass: the APIs of the common DMA patterns, typed end to end with no cast or ignore.

Shared waits by size, DMA futures, pipelines and sync_copy, counted copies on a
REGULAR semaphore, logical device ids, a priority from a variable, select_ref.
Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing_extensions import assert_type

import safedma
from safedma import DataRef, RegularSem, SemArray, SemRef


def moe_style(x: DataRef, o: DataRef, sem: SemRef) -> None:
    local = safedma.LocalCopy(x.at[pl.ds(0, 8)], o.at[pl.ds(0, 8)], sem)
    local.start()
    remote = (
        safedma.RemoteCopy(x.at[pl.ds(8, 8)], o.at[pl.ds(8, 8)], sem)
        .with_send_sem(sem)
        .to(safedma.neighbour("x"))
    )
    remote.start()
    assert_type(safedma.wait_copies(sem, local, remote), None)
    assert_type(safedma.wait_bytes(sem, o.at[pl.ds(0, 8)]), None)


def start_body(x: DataRef, o: DataRef, sem: SemRef) -> None:
    safedma.LocalCopy(x, o, sem).start()


def done_body(x: DataRef, o: DataRef, sem: SemRef) -> None:
    safedma.LocalCopy(x, o, sem).started_elsewhere().wait()


@safedma.checked_futures
def futures(x: jax.Array) -> jax.Array:
    future = safedma.start_async(start_body, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert_type(future, safedma.DmaFuture)
    assert_type(future.buffer, jax.Array)
    return safedma.finish_async(done_body, future)


def double(x_vmem: DataRef, o_vmem: DataRef) -> None:
    o_vmem[...] = x_vmem[...] * 2


def index_map(i: jax.Array) -> tuple[jax.Array, int]:
    return i, 0


def pipelined(x: DataRef, o: DataRef, buf: DataRef) -> None:
    spec = pl.BlockSpec((8, 128), index_map)
    safedma.emit_pipeline(double, grid=(4,), in_specs=[spec], out_specs=[spec])(x, o)
    safedma.sync_copy(o.at[pl.ds(0, 8)], buf)


def counted(x: DataRef, o: DataRef, flag: RegularSem, level: int) -> None:
    handle = safedma.CountedCopy(x, o, flag).start(priority=safedma.priority(level))
    assert_type(handle, safedma.CountedHandle)
    handle.wait()
    safedma.CountedCopy(x, o, flag).start()
    safedma.wait_counted(flag, 1)


def logical(x: DataRef, o: DataRef, send: SemRef, recv: SemRef, target: jax.Array) -> None:
    device = safedma.logical_device(target)
    assert_type(device, safedma.Device)
    safedma.RemoteCopy(x, o, recv).with_send_sem(send).to(device).start().wait()


def selected(x: DataRef, a: DataRef, b: DataRef, sems: SemArray, i: jax.Array) -> None:
    buf = safedma.select_ref(i, a, b)
    assert_type(buf, DataRef)
    sem = safedma.select_ref(i, sems.at[0], sems.at[1])
    assert_type(sem, SemRef)
    safedma.LocalCopy(x, buf, sem).start(priority=safedma.priority(1)).wait()


def scratch() -> list[object]:
    return [pltpu.VMEM((8, 128), jnp.float32), safedma.dma_semaphores((2, 4))]
