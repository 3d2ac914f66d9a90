"""Sanitized kernels compile for a TPU v5e, with libtpu's own compiler, on a machine without
one: the chip run cannot fail on a compile error. Single-device programs (``in_specs=P()``)
for the kernels the chip benchmark times, a ring kernel on the 4 chips of a v5e 2x2."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma as sd
from tests.sanitize.helpers import started_never_waited
from benchmarks import tpu_kernels
from safedma._sanitize import _sites
from safedma.kernels import gather_pages, pipeline, ppermute
from safedma.testing import compile_for_tpu

F32 = jnp.float32


def _programs() -> list[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    rows = tpu_kernels.rows_of(2**20)
    x = jax.ShapeDtypeStruct((rows, 128), F32)
    return [
        ("hbm_to_vmem", lambda v: tpu_kernels.hbm_to_vmem(v, repeats=4), (x,)),
        ("vmem_to_hbm", lambda v: tpu_kernels.vmem_to_hbm(v, size_bytes=2**20, repeats=4), (x,)),
        ("pipeline", lambda v: pipeline(v, lambda c: c * 2.0 + 1.0, chunk_rows=256), (x,)),
        (
            "gather_pages",
            gather_pages,
            (jax.ShapeDtypeStruct((16, 8, 128), F32), jax.ShapeDtypeStruct((8,), jnp.int32)),
        ),
    ]


@pytest.mark.parametrize("case", _programs(), ids=lambda c: c[0])
def test_single_device_kernels_compile_sanitized_for_v5e(
    case: tuple[str, Callable[..., Any], tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, fn, args = case
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    before = _sites.registered()
    report = compile_for_tpu(fn, *args, topology="v5e:2x2", in_specs=P(), out_specs=P())
    assert _sites.registered() > before, "nothing was instrumented"
    assert report.device_kind.startswith("TPU v5")
    assert name in report.kernel_names


def test_a_ring_kernel_compiles_sanitized_for_v5e(monkeypatch: pytest.MonkeyPatch) -> None:
    def per_device(x: jax.Array) -> jax.Array:
        return ppermute(x, axis="x", collective_id=0)

    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    before = _sites.registered()
    compile_for_tpu(per_device, jax.ShapeDtypeStruct((4 * 8, 128), F32), topology="v5e:2x2")
    assert _sites.registered() > before


def test_sanitize_options_reach_the_compiled_kernel() -> None:
    """A hang bound of its own compiles too (it is a constant in the kernel)."""
    body = functools.partial(tpu_kernels.hbm_to_vmem_kernel, repeats=2)

    def fn(v: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            body,
            jax.ShapeDtypeStruct((8, 128), F32),
            in_specs=[tpu_kernels.HBM],
            out_specs=tpu_kernels.HBM,
            scratch_shapes=[sd.vmem((2, 8, 128), F32), sd.dma_semaphores(2)],
            sanitize=sd.SanitizeOptions(hang_after_s=1.0),
        )(v)
        return out

    compile_for_tpu(
        fn, jax.ShapeDtypeStruct((64, 128), F32), topology="v5e:2x2", in_specs=P(), out_specs=P()
    )


def _never_waited(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[1]))


@pytest.mark.parametrize("slots", [2, 12])
def test_the_dma_exit_drain_compiles_for_v5e(slots: int) -> None:
    """libtpu takes the drain's DMA waits on SMEM windows (unrolled slots, and a loop)."""

    def fn(v: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            _never_waited,
            jax.ShapeDtypeStruct((8, 128), F32),
            in_specs=[tpu_kernels.HBM],
            out_specs=tpu_kernels.HBM,
            scratch_shapes=[sd.vmem((8, 128), F32), pltpu.SemaphoreType.DMA((slots,))],
            sanitize=True,
        )(v)
        return out

    compile_for_tpu(
        fn, jax.ShapeDtypeStruct((64, 128), F32), topology="v5e:2x2", in_specs=P(), out_specs=P()
    )
