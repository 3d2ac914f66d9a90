"""Off, the sanitizer costs nothing: the kernel hands the TPU compiler the same Mosaic module.

With sanitize off (the default, ``SAFEDMA_SANITIZE`` unset or 0, or ``sanitize=False``)
a kernel lowers exactly as before the sanitizer existed: safedma's kernels to the
Mosaic of their hand-written pltpu twins, raw kernels through ``sd.pallas_call`` to
the Mosaic of plain ``pl.pallas_call``. On, the module differs (the checks are there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels import gather_pages, pipeline
from safedma.testing import assert_same_mosaic, mosaic_text
from tests.support import calls, kernels_pltpu, kernels_safedma
from tests.support.twins import gather as gather_twin
from tests.support.twins import pipeline as pipeline_twin

F32 = jnp.float32
HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((64, 128), F32)


def _raw(
    kernel: Callable[..., None], scratch: list[Any], *, via_safedma: bool, **extra: Any
) -> Any:
    def call(x: jax.Array) -> jax.Array:
        entry: Any = (
            functools.partial(sd.pallas_call, kernel)
            if via_safedma
            else functools.partial(pl.pallas_call, kernel)
        )
        result: jax.Array = entry(
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            **extra,
        )(x)
        return result

    return call


_RAW_KERNELS = [
    ("scale_copy", [pltpu.VMEM((64, 128), F32), pltpu.SemaphoreType.DMA(())]),
    ("reverse_halves", [pltpu.VMEM((64, 128), F32), pltpu.SemaphoreType.DMA((2,))]),
    (
        "double_buffered",
        [
            pltpu.VMEM((2, 8, 128), F32),
            pltpu.VMEM((8, 128), F32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA(()),
        ],
    ),
]


@pytest.mark.parametrize("off", ["unset", "zero", "explicit"])
@pytest.mark.parametrize("case", _RAW_KERNELS, ids=lambda c: c[0])
def test_raw_kernels_through_sd_pallas_call_lower_as_through_pl_pallas_call(
    case: tuple[str, list[Any]], off: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, scratch = case
    kernel = getattr(kernels_pltpu, name)
    extra: dict[str, Any] = {}
    if off == "unset":
        monkeypatch.delenv("SAFEDMA_SANITIZE", raising=False)
    elif off == "zero":
        monkeypatch.setenv("SAFEDMA_SANITIZE", "0")
    else:
        monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
        extra["sanitize"] = False
    assert_same_mosaic(
        _raw(kernel, scratch, via_safedma=True, **extra),
        _raw(kernel, scratch, via_safedma=False),
        X,
    )


def test_safedma_kernels_still_lower_to_their_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAFEDMA_SANITIZE", raising=False)
    x = jax.ShapeDtypeStruct((64, 256), F32)
    assert_same_mosaic(
        lambda v: pipeline(v, lambda c: c * 2.0, chunk_rows=8),
        lambda v: pipeline_twin.pipeline(v, lambda c: c * 2.0, chunk_rows=8),
        x,
    )
    pages = jax.ShapeDtypeStruct((6, 8, 128), F32)
    indices = jax.ShapeDtypeStruct((5,), jnp.int32)
    assert_same_mosaic(gather_pages, gather_twin.gather_pages, pages, indices)
    spec = jax.ShapeDtypeStruct((16, 128), F32)
    assert_same_mosaic(
        calls.scale_copy_call(kernels_safedma.scale_copy, spec),
        calls.scale_copy_call(kernels_pltpu.scale_copy, spec),
        spec,
    )


def test_on_the_module_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: sanitized, the same kernel lowers differently."""
    name, scratch = _RAW_KERNELS[0]
    kernel = getattr(kernels_pltpu, name)
    plain = mosaic_text(_raw(kernel, scratch, via_safedma=False), X)
    sanitized = mosaic_text(_raw(kernel, scratch, via_safedma=True, sanitize=True), X)
    assert plain != sanitized
    assert "tpu.sem_read" in sanitized and "tpu.sem_read" not in plain
