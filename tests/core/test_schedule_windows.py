"""A schedule read in windows into SMEM, double-buffered across a loop (vLLM
tpu-inference's stacked-RPA sliding-window decode): each window is a copy of a traced
length, the next one prefetched into the other buffer while the current one is waited on
rebuilt descriptors and drives an ``emit_pipeline``.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import _compat
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

SAFE, RAW = True, False
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


# --- a schedule read in windows into SMEM, double-buffered across a loop ------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Schedule:
    """The schedule: a step count and a per-step table (a pytree operand and in-spec)."""

    steps: Any
    rows: Any


WINDOW = 4  # schedule entries per window
SCHED_SPEC = pl.BlockSpec((8, 128), lambda i: (i, 0))


def _windows(safe: bool, seed: str | None = None) -> Callable[..., None]:
    """tpu-inference's stacked-RPA sliding-window decode (``rpa_kernel``): the schedule is
    copied HBM -> SMEM one window at a time (copies of a traced length); the first window
    is started before a ``fori_loop`` over windows, each iteration prefetches the next
    window into the other SMEM buffer under a parity ``pl.when`` and, under another, waits
    its own window on rebuilt descriptors (``jax.tree.map`` over the list) and runs an
    ``emit_pipeline`` whose allocations are ``BufferedRef``s given in ``scratch_shapes``."""

    def kernel(sched: _Schedule, x_hbm: Any, o_hbm: Any, allocs: Any, bufs: Any, sems: Any) -> None:
        steps = sched.steps[0]
        windows = pl.cdiv(steps, WINDOW)

        def copies(window: Any, slot: int) -> list[Any]:
            n = jnp.minimum(steps - window * WINDOW, WINDOW)
            src = sched.rows.at[pl.ds(pl.multiple_of(window * WINDOW, WINDOW), n)]
            dst = bufs[slot].at[pl.ds(0, n)]
            if seed == "whole_buffer":
                dst = bufs[slot]
            sem = sems if seed == "semaphore_array" else sems.at[slot]
            if safe:
                return [sd.LocalCopy(src, dst, sem)]  # DESCRIBED
            return [pltpu.make_async_copy(src, dst, sem)]

        for copy in copies(0, 0):
            copy.start()

        def run(w: Any, slot: int) -> None:
            waited = 0 if seed == "one_slot_waited" else slot
            jax.tree.map(lambda c: (c.started_elsewhere() if safe else c).wait(), copies(w, waited))

            def step(x_ref: Any, o_ref: Any) -> None:
                o_ref[...] = x_ref[...] + bufs[slot][0].astype(jnp.float32)

            emit = sd.emit_pipeline if safe else pltpu.emit_pipeline
            steps_here = jnp.minimum(steps - w * WINDOW, WINDOW)
            pipeline = emit(step, grid=(steps_here,), in_specs=[SCHED_SPEC], out_specs=[SCHED_SPEC])
            pipeline(x_hbm, o_hbm, allocations=allocs)

        def window(w: Any, carry: None) -> None:
            even = w % 2 == 0
            more = w + 1 < windows

            @pl.when(jnp.logical_and(more, even))
            def _prefetch_1() -> None:
                for copy in copies(w + 1, 1):
                    copy.start()  # PREFETCHED

            @pl.when(jnp.logical_and(more, jnp.logical_not(even)))
            def _prefetch_0() -> None:
                for copy in copies(w + 1, 0):
                    copy.start()

            @pl.when(even)
            def _compute_0() -> None:
                run(w, 0)

            @pl.when(jnp.logical_not(even))
            def _compute_1() -> None:
                run(w, 1)

            return carry

        lax.fori_loop(0, windows, window, None)

    return kernel


def _windows_call(safe: bool, seed: str | None = None) -> Any:
    allocs = (
        pltpu.BufferedRef.input(SCHED_SPEC, jnp.float32),
        pltpu.BufferedRef.output(SCHED_SPEC, jnp.float32),
    )
    smem = (sd.smem if safe else pltpu.SMEM)((WINDOW,), jnp.int32)
    sems = sd.dma_semaphores(2) if safe else pltpu.SemaphoreType.DMA((2,))
    call = sd.pallas_call if safe else pl.pallas_call
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)

    def per_call(steps: jax.Array, rows: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = call(
            _windows(safe, seed),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[_Schedule(pl.BlockSpec(memory_space=pltpu.SMEM), hbm), hbm],
                out_specs=hbm,
                # The pipeline's BufferedRef allocations are scratch entries, as the author
                # declares them; then the two SMEM windows and the semaphores.
                scratch_shapes=(allocs, (smem, smem), sems),
            ),
            compiler_params=pltpu.CompilerParams(disable_semaphore_checks=True),
        )(_Schedule(steps, rows), x)
        return out

    return per_call


WINDOW_ARGS = (
    jax.ShapeDtypeStruct((1,), jnp.int32),
    jax.ShapeDtypeStruct((16 * WINDOW,), jnp.int32),
    jax.ShapeDtypeStruct((16 * WINDOW * 8, 128), jnp.float32),
)


def _windows_seed(seed: str) -> None:
    mosaic_text(_windows_call(SAFE, seed), *WINDOW_ARGS, mesh=abstract_mesh((), (), tpu="v5p"))


def test_schedule_windows_double_buffered_in_smem_match_raw() -> None:
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(_windows_call(SAFE), _windows_call(RAW), *WINDOW_ARGS, mesh=mesh)


def test_schedule_window_wait_on_the_other_slot_is_t7_naming_the_prefetch() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        _windows_seed("one_slot_waited")
    message = str(err.value)
    assert f"started at {__file__}:{line_in(_windows, '# PREFETCHED')}" in message, message
    assert "LocalCopy sched.rows.at[...]" in message, message


def test_schedule_window_into_the_whole_buffer_is_t1_at_the_users_line() -> None:
    # The window's traced length against the SMEM buffer's fixed 4 entries .
    with pytest.raises(sd.CopyShapeMismatchError, match=r"\(\?,\) and \(4,\)") as err:
        _windows_seed("whole_buffer")
    built = "# DESCRIBED" if _compat.waits_compare_shapes() else "copy.start()"
    assert line_in(_windows, built) in raising_lines(err, __file__)


def test_schedule_window_on_the_semaphore_array_is_s2_at_the_users_line() -> None:
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        _windows_seed("semaphore_array")
    assert line_in(_windows, "# DESCRIBED") in raising_lines(err, __file__)
