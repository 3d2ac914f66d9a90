"""Scratch scoped with ``run_scoped``: buffers and semaphores that live for one block of
the kernel (many shapes at once, keyword scratch, semaphores of every kind).

* ``sd.run_scoped`` with two buffers, a 2-D DMA array, a DMA and a REGULAR semaphore,
  then keyword scratch, against ``pl.run_scoped`` (written for this suite).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._calls import TPU, local
from tests.corpus._case import OK, Case

VMEM = pltpu.VMEM((32, 128), jnp.float32)


def scoped(x: sd.DataRef, o: sd.DataRef) -> None:
    def body(
        a: sd.DataRef, b: sd.DataRef, sems: sd.SemArray2, one: sd.SemRef, flag: sd.RegularSem
    ) -> None:
        sd.LocalCopy(x, a, sems.at[0, 1]).start().wait()
        sd.LocalCopy(a, b, one).start().wait()
        sd.signal(flag)
        sd.wait(flag)

    sd.run_scoped(
        body,
        sd.vmem((32, 128), jnp.float32),
        sd.vmem((32, 128), jnp.float32),
        sd.dma_semaphores((2, 2)),
        sd.dma_semaphore(),
        sd.regular_semaphore(),
    )

    def named(*, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(buf, o, sem).start().wait()

    sd.run_scoped(named, buf=sd.vmem((32, 128), jnp.float32), sem=sd.dma_semaphore())


def scoped_raw(x: Any, o: Any) -> None:
    def body(a: Any, b: Any, sems: Any, one: Any, flag: Any) -> None:
        for src, dst, sem in [(x, a, sems.at[0, 1]), (a, b, one)]:
            c = pltpu.make_async_copy(src, dst, sem)
            c.start()
            c.wait()
        pl.semaphore_signal(flag, 1)
        pl.semaphore_wait(flag, 1)

    pl.run_scoped(
        body,
        VMEM,
        VMEM,
        pltpu.SemaphoreType.DMA((2, 2)),
        pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.REGULAR(()),
    )

    def named(*, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(buf, o, sem)
        c.start()
        c.wait()

    pl.run_scoped(named, buf=VMEM, sem=pltpu.SemaphoreType.DMA(()))


CASES: list[Case] = [
    Case(
        "run_scoped_many_shapes_and_keywords",
        "run_scoped",
        "written for this suite",
        lambda: local(scoped, mesh=TPU),
        {"mosaic": OK},
        twin=lambda: local(scoped_raw, checked=False, mesh=TPU),
    ),
]
