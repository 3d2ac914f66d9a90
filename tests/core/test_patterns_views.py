"""Issue 13 item 2: ``DataRef.reshape(*shape)`` and ``DataRef.bitcast(dtype)`` views as
copy operands: the raw Mosaic, and the copy checks see the view's own shape and dtype."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import assert_same_mosaic
from tests.support.patterns import X, local_call, trace


def _views(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x.reshape(16, 256), buf.bitcast(jnp.float32), sem).start().wait()
    sd.LocalCopy(buf, o.bitcast(jnp.int32).reshape(16, 256), sem).start().wait()
    half = x.at[pl.ds(0, 16)].reshape(8, 256)
    sd.LocalCopy(half, buf.bitcast(jnp.float32).at[pl.ds(0, 8)], sem).start().wait()


def _views_raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
    for src, dst in [
        (x.reshape(16, 256), buf.bitcast(jnp.float32)),
        (buf, o.bitcast(jnp.int32).reshape(16, 256)),
        (x.at[pl.ds(0, 16)].reshape(8, 256), buf.bitcast(jnp.float32).at[pl.ds(0, 8)]),
    ]:
        c = pltpu.make_async_copy(src, dst, sem)
        c.start()
        c.wait()


def test_views_match_raw() -> None:
    ours = local_call(_views, [sd.vmem((16, 256), jnp.int32), sd.dma_semaphore()])
    theirs = local_call(
        _views_raw,
        [pltpu.VMEM((16, 256), jnp.int32), pltpu.SemaphoreType.DMA(())],
        checked=False,
    )
    assert_same_mosaic(ours, theirs, X)


def test_a_view_whose_shape_differs_is_caught() -> None:
    def kernel(x: Any, o: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x.reshape(16, 256), buf, sem).start().wait()

    with pytest.raises(sd.CopyShapeMismatchError) as err:
        trace(local_call(kernel, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]))
    assert "(16, 256)" in str(err.value) and "(32, 128)" in str(err.value)


def test_a_bitcast_view_whose_dtype_differs_is_caught() -> None:
    def kernel(x: Any, o: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x.bitcast(jnp.int32), buf, sem).start().wait()

    with pytest.raises(sd.CopyDtypeMismatchError) as err:
        trace(local_call(kernel, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]))
    assert "int32" in str(err.value) and "float32" in str(err.value)


def test_a_view_of_the_right_size_passes_the_checks() -> None:
    def kernel(x: Any, o: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x.reshape(64, 64).bitcast(jnp.uint32), buf, sem).start().wait()
        sd.LocalCopy(buf.bitcast(jnp.float32).reshape(32, 128), o, sem).start().wait()

    trace(local_call(kernel, [sd.vmem((64, 64), jnp.uint32), sd.dma_semaphore()]))
