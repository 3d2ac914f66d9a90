"""Zero fills by priority copies (a grouped matmul): started with ``priority=1`` in
``fori_loop`` bodies and waited once by their total size (``wait_bytes``) after an
``emit_pipeline``, which must not hide an unwaited copy.

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

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

SAFE, RAW = True, False


def _tpu_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- zero fill by priority copies in fori_loops, one wait by size, an emit_pipeline -----

SUB, ROWS, COLS, ZERO_ROWS = 8, 64, 256, 16


def _zero_fill(
    safe: bool, *, drop_wait: bool = False, priority: int = 1, raw_pipeline: bool = False
) -> Callable[..., None]:
    def kernel(offset_ref: Any, x_ref: Any, o_ref: Any, zero_ref: Any, sems: Any) -> None:
        zero_ref[...] = jnp.zeros_like(zero_ref)
        zero = zero_ref.reshape(-1, SUB, 128)
        out = o_ref.reshape(-1, SUB, o_ref.shape[-1])
        rows = zero.shape[0]
        end = offset_ref[0] // SUB

        def fill(i: Any, total: Any) -> Any:
            start = i * rows
            size = jnp.minimum(start + rows, end) - start
            for col in range(0, out.shape[-1], 128):
                src, dst = zero.at[pl.ds(0, size)], out.at[pl.ds(start, size), :, col : col + 128]
                if safe:
                    sd.LocalCopy(src=src, dst=dst, sem=sems.at[0]).start(priority=priority)  # USER
                else:
                    pltpu.make_async_copy(src_ref=src, dst_ref=dst, sem=sems.at[0]).start(
                        priority=1
                    )
            return total + size

        total = jax.lax.fori_loop(0, pl.cdiv(end, rows), fill, 0)
        pipeline = (sd.emit_pipeline if safe and not raw_pipeline else pltpu.emit_pipeline)(
            _copy_block,
            grid=(ROWS // SUB - end,),
            in_specs=(pl.BlockSpec((None, SUB, COLS), lambda g: (g + end, 0, 0)),),
            out_specs=pl.BlockSpec((None, SUB, COLS), lambda g: (g + end, 0, 0)),
        )
        pipeline(x_ref.reshape(-1, SUB, COLS), out)
        if drop_wait:
            return
        if safe:
            sd.wait_bytes(sems.at[0], out.at[pl.ds(0, total)])
        else:
            pltpu.make_async_copy(
                out.at[pl.ds(0, total)], out.at[pl.ds(0, total)], sems.at[0]
            ).wait()

    return kernel


def _copy_block(x_block: Any, o_block: Any) -> None:
    o_block[...] = x_block[...]


def _zero_call(kernel: Callable[..., None], entry: Any) -> Any:
    def run(offset: jax.Array, x: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.HBM),
            scratch_shapes=[pltpu.VMEM((ZERO_ROWS, 128), jnp.float32), sd.dma_semaphores(1)],
        )
        shape = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)
        return entry(kernel, out_shape=shape, grid_spec=grid_spec)(offset, x)

    return jax.jit(run)


def _zero_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32))


def test_priority_zero_fill_waited_by_size_after_a_pipeline_matches_raw() -> None:
    assert_same_mosaic(
        _zero_call(_zero_fill(SAFE), sd.pallas_call),
        _zero_call(_zero_fill(RAW), pl.pallas_call),
        *_zero_args(),
        mesh=_tpu_mesh(),
    )


@pytest.mark.parametrize("pipeline", ["safedma", "raw"])
def test_an_emit_pipeline_does_not_hide_an_unwaited_copy(pipeline: str) -> None:
    # the pipeline's own waits (on semaphores it allocates) stood for every
    # semaphore of the body, so dropping the zero fill's wait passed at trace time.
    kernel = _zero_fill(SAFE, drop_wait=True, raw_pipeline=pipeline == "raw")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_zero_call(kernel, sd.pallas_call), *_zero_args(), mesh=_tpu_mesh())
    message = str(err.value)
    assert f"{__file__}:{line_in(_zero_fill, '# USER')}" in message, message
    # a size read at run time is shown as '?', not as a tracer's repr.
    assert "float32[?,8,128]" in message and "Tracer" not in message, message


def test_zero_fill_priority_2_is_rejected_at_the_users_line() -> None:
    broken = _zero_call(_zero_fill(SAFE, priority=2), sd.pallas_call)
    with pytest.raises(sd.PriorityError) as err:
        mosaic_text(broken, *_zero_args(), mesh=_tpu_mesh())
    assert line_in(_zero_fill, "# USER") in raising_lines(err, __file__)
