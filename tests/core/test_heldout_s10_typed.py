"""SparseCore DMA the typed API could not express (docs/held-out.md, session 10, typed API).

* a push stream without a semaphore (jax 0.12): on SparseCore a local copy from VMEM to
  HBM, VMEM_SHARED or SMEM is a push stream, whose completion the hardware tracks without
  a destination semaphore; jax warns when one is given ("pass ``sem=None``") and lowers
  ``sem=None``. ``sd.LocalCopy`` required a semaphore (T6). The kernel here double-buffers
  rows through VMEM: each block gathered in on a DMA semaphore, doubled, and pushed out with
  ``sem=None``; the push from a buffer is waited (``started_elsewhere()``) before the next
  gather into that buffer, the last two after the loop.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import _compat
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

SAFE, RAW = True, False
ROWS, BLOCK, LANES = 64, 8, 16
BLOCKS = ROWS // BLOCK

needs_012 = pytest.mark.skipif(_compat.JAX_VERSION < (0, 12), reason="push streams: jax 0.12")


def _sc_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- a push stream without a semaphore ---------------------------------------------------


def _push_rows(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, shared: Any, sems: Any) -> None:
        def rows(b: Any) -> Any:
            return pl.ds(b * BLOCK, BLOCK)

        def gather(b: Any, slot: Any) -> None:
            if safe:
                sd.LocalCopy(x_hbm.at[rows(b)], bufs.at[slot], sems.at[slot]).start().wait()
            else:
                pltpu.async_copy(x_hbm.at[rows(b)], bufs.at[slot], sems.at[slot]).wait()

        def push(b: Any, slot: Any) -> None:
            if safe:
                dst = o_hbm.at[rows(b)]
                if seed == "pull_without_semaphore":
                    sd.LocalCopy(dst, bufs.at[slot], None).start()  # PULL
                    return
                sd.LocalCopy(bufs.at[slot], dst, None).start()  # PUSH
            else:
                pltpu.make_async_copy(bufs.at[slot], o_hbm.at[rows(b)]).start()

        def push_done(b: Any, slot: Any) -> None:
            if safe:
                pushed = sd.LocalCopy(bufs.at[slot], o_hbm.at[rows(b)], None)  # PUSH DONE
                pushed.started_elsewhere().wait()
            else:
                pltpu.make_async_copy(bufs.at[slot], o_hbm.at[rows(b)]).wait()

        @pl.loop(0, BLOCKS)
        def _(b: Any) -> None:
            slot = b % 2

            @pl.when(b >= 2)
            def _() -> None:
                if seed != "push_never_waited":
                    push_done(b - 2, slot)

            gather(b, slot)
            bufs[slot] = bufs[slot] * 2
            push(b, slot)

        for b in (BLOCKS - 2, BLOCKS - 1):
            if seed != "push_never_waited":
                push_done(b, b % 2)
        if safe and seed == "scatter_without_semaphore":
            idx = jnp.arange(BLOCK, dtype=jnp.int32)
            sd.LocalCopy(bufs.at[0], shared.at[idx], None).start().wait()  # SCATTER

    return kernel


def _push(safe: bool, seed: str | None = None) -> Any:
    def run(x: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        entry: Any = sd.core_kernel if safe else pl.kernel
        return entry(
            _push_rows(safe, seed),
            jax.ShapeDtypeStruct((ROWS, LANES), jnp.int32),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((2, BLOCK, LANES), jnp.int32),
                pltpu.VMEM_SHARED((BLOCK, LANES), jnp.int32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        )(x)

    return jax.jit(run)


X = jax.ShapeDtypeStruct((ROWS, LANES), jnp.int32)


@needs_012
def test_push_stream_without_a_semaphore_matches_raw() -> None:
    # Before the fix: MissingSemaphoreError (T6) for the push, which jax asks to write so.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # jax's push-stream warning would mean a semaphore
        assert_same_mosaic(_push(SAFE), _push(RAW), X, mesh=_sc_mesh())
    text = mosaic_text(_push(SAFE), X, mesh=_sc_mesh())
    # The push: enqueue_dma with no semaphore operand (source, target only).
    assert "operandSegmentSizes = array<i32: 1, 0, 1, 0, 0, 0, 0>" in text


@pytest.mark.skipif(_compat.JAX_VERSION >= (0, 12), reason="jax 0.10.2 has no push streams")
def test_push_stream_without_a_semaphore_on_jax_0_10_names_the_version() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE), X, mesh=_sc_mesh())
    # The first copy without a semaphore traced: the wait for block b - 2's push.
    assert line_in(_push_rows, "# PUSH DONE") in raising_lines(err, __file__)
    assert "jax 0.12 lets a SparseCore push stream go without one" in str(err.value)
    assert jax.__version__ in str(err.value)


@needs_012
def test_pull_without_a_semaphore_is_t6_naming_the_memory_spaces() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE, "pull_without_semaphore"), X, mesh=_sc_mesh())
    assert line_in(_push_rows, "# PULL") in raising_lines(err, __file__)
    text = str(err.value)
    assert "o_hbm.at[...] int32[8,16] (hbm) -> bufs.at[...] int32[8,16] (vmem)" in text
    assert "from VMEM to HBM, VMEM_SHARED or SMEM" in text and "safedma.dma_semaphore()" in text


@needs_012
def test_scatter_without_a_semaphore_is_t6() -> None:
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(_push(SAFE, "scatter_without_semaphore"), X, mesh=_sc_mesh())
    assert line_in(_push_rows, "# SCATTER") in raising_lines(err, __file__)
    assert "scatter or gather" in str(err.value)


@needs_012
def test_push_never_waited_is_t7_at_its_start() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_push(SAFE, "push_never_waited"), X, mesh=_sc_mesh())
    assert f"{__file__}:{line_in(_push_rows, '# PUSH')}" in str(err.value)


def _tensor_core_push(x: jax.Array) -> jax.Array:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        sd.LocalCopy(x_hbm, buf, sem).start().wait()
        sd.LocalCopy(buf, o_hbm, None).start().wait()  # TC PUSH

    out: jax.Array = sd.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


def test_a_tensor_core_copy_without_a_semaphore_is_t6_naming_tensor_cores() -> None:
    # VMEM -> ANY is a push stream by its memory spaces, but sd.pallas_call runs on a
    # TensorCore, whose lowering rejects sem=None ("Local DMA semaphore cannot be None").
    with pytest.raises(sd.MissingSemaphoreError) as err:
        mosaic_text(jax.jit(_tensor_core_push), X, mesh=abstract_mesh((1,), ("x",), tpu="v5p"))
    assert line_in(_tensor_core_push, "# TC PUSH") in raising_lines(err, __file__)
    if _compat.JAX_VERSION >= (0, 12):
        assert "this kernel runs on TensorCores" in str(err.value)
