"""Pass: raw pltpu code with N-D semaphore arrays and ref views, annotated with the brands
(once the most frequent false positives on production kernels)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSemArray2, SemArray2, SemArray3


def paged_prefetch(pages_hbm: DataRef, bufs: DataRef, sems: SemArray2, slot: jax.Array) -> None:
    for p in range(4):
        pltpu.make_async_copy(pages_hbm.at[p], bufs.at[slot, p], sems.at[slot, p]).start()
    for p in range(4):
        pltpu.make_async_copy(pages_hbm.at[p], bufs.at[slot, p], sems.at[slot].at[p]).wait()


def views(x_hbm: DataRef, buf: DataRef, sems: SemArray3, flags: RegularSemArray2) -> None:
    copy = pltpu.make_async_copy(x_hbm.reshape(16, 256).bitcast(jnp.int32), buf, sems.at[0, 1, 2])
    copy.start()
    copy.wait()
    by_tuple = pltpu.make_async_copy(x_hbm.reshape((16, 256)), buf.reshape(-1, 256), sems.at[1, 0, 0])
    by_tuple.start()
    by_tuple.wait()
    pl.semaphore_signal(flags.at[0, 1])
    pl.semaphore_wait(flags.at[0, 1])
