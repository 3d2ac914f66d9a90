"""Copies between HBM and pinned host memory (``pl.HOST``): checked like any copy, on the
semaphore they are started on.

* a copy to pinned host memory (vLLM tpu-inference's ``distributed/kv_transfer.py``,
  ``copy_to_host``): the copy started and waited at once on a semaphore scoped with
  ``pl.run_scoped(body, pltpu.SemaphoreType.DMA)``;
* a host <-> HBM copy on a ``run_scoped`` semaphore (tpu-inference's
  ``kernels/dma/host_dma.py``), both directions.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.ring_twins import ALONG_X, sharded
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- a chunked copy as a DMA future -----------------------------------------------------

ROWS = 64


# --- a copy to pinned host memory -------------------------------------------------------


def _to_host(safe: bool, space: Any, seed: str | None = None) -> Any:
    def kernel(src: Any, host_in: Any, host_out: Any) -> None:
        del host_in
        if safe:

            def body(sem: sd.SemRef) -> None:
                handle = sd.LocalCopy(src, host_out, sem).start()  # TO HOST
                if seed != "wait_dropped":
                    handle.wait()

            sd.run_scoped(body, sd.dma_semaphore())
        else:

            def raw_body(sem: Any) -> None:
                pltpu.async_copy(src, host_out, sem).wait()

            pl.run_scoped(raw_body, pltpu.SemaphoreType.DMA)

    entry: Any = sd.pallas_call if safe else pl.pallas_call

    def run(src: jax.Array, dest: jax.Array) -> jax.Array:
        out: jax.Array = entry(
            kernel,
            in_specs=[ANY, pl.BlockSpec(memory_space=space)],
            out_specs=pl.BlockSpec(memory_space=space),
            input_output_aliases={1: 0},
            out_shape=jax.ShapeDtypeStruct(dest.shape, dest.dtype),
        )(src, dest)
        return out

    return jax.jit(run)


@pytest.mark.parametrize("space", [pltpu.HBM, pl.HOST], ids=["hbm", "host"])
def test_copy_to_host_matches_raw(space: Any) -> None:
    x = jax.ShapeDtypeStruct((ROWS, 8, 128), jnp.bfloat16)
    assert_same_mosaic(_to_host(SAFE, space), _to_host(RAW, space), x, x, mesh=_v5p())


def test_copy_to_host_never_waited_is_t7() -> None:
    x = jax.ShapeDtypeStruct((ROWS, 8, 128), jnp.bfloat16)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_to_host(SAFE, pl.HOST, "wait_dropped"), x, x, mesh=_v5p())
    assert f"{__file__}:{line_in(_to_host, '# TO HOST')}" in str(err.value)


# --- a per-lane ring rotation between a window's lanes -----------------------------------

N = 4


# --- a host <-> HBM copy on a run_scoped semaphore ----------------------------------------

HOST = pl.BlockSpec(memory_space=pl.HOST)


def _host_dma(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def safe_kernel(x_ref: sd.DataRef, y_ref: sd.DataRef) -> None:
        def body(sem: sd.SemRef) -> None:
            if seed == "not_waited":
                sd.LocalCopy(x_ref, y_ref, sem).start()  # STARTED
            elif seed == "value_as_semaphore":
                sd.LocalCopy(x_ref, y_ref, sd.read(sem)).start().wait()  # type: ignore[arg-type]  # USER
            else:
                sd.LocalCopy(x_ref, y_ref, sem).start().wait()

        sd.run_scoped(body, sd.dma_semaphore())

    def raw_kernel(x_ref: Any, y_ref: Any) -> None:
        def body(sem: Any) -> None:
            pltpu.async_copy(x_ref, y_ref, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    return safe_kernel if safe else raw_kernel


def _host_shape(x: jax.Array, mesh: Any) -> Any:
    """The output on the host: jax 0.10.2 spells it ``pl.HOST(shape, dtype)``; 0.12 dropped
    that call and takes a pinned-host sharding (with the HOST out-spec) instead."""
    if callable(pl.HOST):
        return pl.HOST(shape=x.shape, dtype=x.dtype)
    host = NamedSharding(mesh, P(), memory_kind="pinned_host")
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host)


def _d2h(safe: bool, mesh: Any, seed: str | None = None) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            _host_dma(safe, seed),
            _host_shape(x, mesh),
            in_specs=[ANY],
            out_specs=HOST,
            name="d2h_dma_kernel",
        )(x)
        return out

    return sharded(per_device, mesh, (ALONG_X,) * 1)


def _h2d(safe: bool, mesh: Any, seed: str | None = None) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            _host_dma(safe, seed),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HOST],
            out_specs=ANY,
            name="h2d_dma_kernel",
        )(x)
        return out

    return sharded(per_device, mesh, (ALONG_X,) * 1)


def _host_args(mesh: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((N * 16, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))


@pytest.mark.parametrize("direction", [_d2h, _h2d], ids=["device_to_host", "host_to_device"])
def test_host_dma_on_a_scoped_semaphore_matches_raw(direction: Any) -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")  # host memory asks for the generation
    text = mosaic_text(direction(SAFE, mesh), _host_args(mesh), mesh=mesh)
    assert "memory_space<host>" in text, text
    assert_same_mosaic(direction(SAFE, mesh), direction(RAW, mesh), _host_args(mesh), mesh=mesh)


@pytest.mark.parametrize("direction", [_d2h, _h2d], ids=["device_to_host", "host_to_device"])
def test_host_dma_not_waited_is_t7_on_the_scoped_semaphore(direction: Any) -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(direction(SAFE, mesh, "not_waited"), _host_args(mesh), mesh=mesh)
    start = line_in(_host_dma, "# STARTED")
    assert (
        f"LocalCopy x_ref float32[16,128] -> y_ref float32[16,128], started at {__file__}:{start}"
        in str(err.value)
    )


def test_host_dma_semaphore_value_for_the_semaphore_is_s1() -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    with pytest.raises(sd.NotARefError) as err:
        mosaic_text(_d2h(SAFE, mesh, "value_as_semaphore"), _host_args(mesh), mesh=mesh)
    assert line_in(_host_dma, "# USER") in raising_lines(err, __file__)
