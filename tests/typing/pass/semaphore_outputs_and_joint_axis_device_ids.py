"""Pass: patterns from jax's own Pallas TPU tests.

* DMA futures through ``safedma.pallas_call``: semaphores returned as outputs
  (``safedma.dma_semaphore()`` in ``out_shape`` gives a typed tuple of arrays; jax's
  unannotated ``pltpu.SemaphoreType.DMA(())`` gives ``Any`` but no "untyped call"),
  a tuple of semaphores as one kernel argument;
* device ids over axes taken jointly: ``device({("y", "x"): i})``, ``my_index`` and
  ``axis_size`` of a tuple of axes.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_type

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import DataRef, RegularSem, SemRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)


def start(x_ref: DataRef, keep: DataRef, o_ref: DataRef, sems: tuple[SemRef, SemRef]) -> None:
    del keep
    safedma.LocalCopy(x_ref, o_ref, sems[0]).start()


def done(x_ref: DataRef, o_ref: DataRef, sem: SemRef, keep: DataRef) -> None:
    del keep
    safedma.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def future(x: jax.Array) -> jax.Array:
    like = ShapeDtype(x.shape, x.dtype)
    sems = (safedma.dma_semaphore(), safedma.dma_semaphore())
    x, out, (sem, _) = safedma.pallas_call(
        start,
        (like, like, sems),
        in_specs=[ANY],
        out_specs=(ANY, ANY, (SEM, SEM)),
        input_output_aliases={0: 0},
    )(x)
    finish = safedma.pallas_call(
        done, like, in_specs=[ANY, ANY, SEM], out_specs=ANY, input_output_aliases={1: 0}
    )
    assert_type(finish, safedma.KernelCall[jax.Array])
    return finish(x, out, sem)


def one_semaphore_out() -> tuple[jax.Array, ...]:
    def body(x_ref: DataRef, sem: SemRef) -> None:
        del x_ref, sem

    like = ShapeDtype((8, 128), "float32")
    call = safedma.pallas_call(body, (like, safedma.dma_semaphore()), out_specs=(ANY, SEM))
    assert_type(call, safedma.KernelCall[tuple[jax.Array, jax.Array]])
    return call()


def raw_semaphore_out() -> None:
    def body(sem: RegularSem) -> None:
        del sem

    sem: Any = safedma.pallas_call(body, pltpu.SemaphoreType.REGULAR(()), out_specs=SEM)()
    del sem


def joint_axes(x_ref: DataRef, y_ref: DataRef, send: SemRef, recv: SemRef) -> None:
    size = safedma.axis_size(("y", "x"))
    assert_type(size, int)
    me = safedma.my_index(("y", "x"))
    target = safedma.device({("y", "x"): jax.lax.rem(me + 1, size)})
    copy = safedma.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(target)
    copy.start().wait()
    held = {
        ("y", "x"): jax.lax.rem(me + 2, size)
    }  # a dict in a variable: dict[tuple[str, str], ...]
    mixed: dict[str | tuple[str, ...], jax.Array] = {
        "x": me,
        ("y",): me,
    }  # mypy joins the keys otherwise
    safedma.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(
        safedma.device(mixed)
    ).start().wait()
    safedma.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(
        safedma.device(held)
    ).start().wait()
