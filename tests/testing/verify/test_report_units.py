"""verify's report gives the unit of each semaphore's most-in-flight count: bytes for a DMA
semaphore, signals for a REGULAR one (the same number means either)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import verify

HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def copy_and_signal(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any, flag: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    pl.semaphore_signal(flag, 2)
    pl.semaphore_wait(flag, 2)
    out = pltpu.make_async_copy(buf, o_hbm, sem)
    out.start()
    out.wait()


def test_the_report_says_bytes_for_dma_semaphores_and_signals_for_regular_ones() -> None:
    def fn(x: Any) -> Any:
        return pl.pallas_call(
            copy_and_signal,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[
                pltpu.VMEM((8, 128), jnp.float32),
                pltpu.SemaphoreType.DMA(()),
                pltpu.SemaphoreType.REGULAR,
            ],
        )(x)

    report = verify(fn, X)
    text = str(report)
    assert "sem: 4096 bytes" in text, text
    assert "flag: 2 signals" in text, text
    assert set(report.in_flight_units.values()) == {"bytes", "signals"}
    assert "in_flight_units=" in repr(report)
