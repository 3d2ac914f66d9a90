"""safedma.checked on raw plgpu kernel bodies: each mistake named at trace time, correct
code (loops, ``% 2`` slots, predicated prefetches, two-arrival barriers, warpgroups)
passes.

Every kernel is traced on CPU (nothing is compiled or run). Each mistake test checks the
error class, that the message names the kernel's own line in this file (marked with a
comment) and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from safedma.testing._gpu.jax_seam import plgpu_available

if not plgpu_available():
    pytest.skip("this jax has no Pallas GPU API the check reads", allow_module_level=True)

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import safedma
from examples import gpu_double_buffer as example
from safedma.gpu import BarrierPhaseError
from tests.gpu.test_verify_gpu_rules import _pipeline

T = 64
X = jax.ShapeDtypeStruct((4 * T, 128), jnp.float32)
_SOURCE = Path(__file__).read_text().splitlines()


def _line(marker: str) -> str:
    """``file:line`` of the line of this file that ends with ``# marker``."""
    (number,) = [i + 1 for i, text in enumerate(_SOURCE) if text.endswith(f"# {marker}")]
    return f"{Path(__file__).name}:{number}"


def _trace(body: Any, *, arrivals: int = 1, **kwargs: Any) -> None:
    """Trace ``body`` under safedma.checked as a plgpu.kernel over X."""

    def run(x: Any) -> Any:
        return plgpu.kernel(
            safedma.checked(body),
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_types=[
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=2),
            ],
            **kwargs,
        )(x)

    jax.make_jaxpr(run)(X)


def _load(x_gmem: Any, smem_in: Any, bars: Any, block: Any, slot: Any, bar: Any) -> None:
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(block * T, T)], smem_in.at[slot], bars.at[bar])


# -- each mistake, named -------------------------------------------------------------


def test_two_copies_on_a_one_arrival_barrier_before_its_wait_is_a_phase_error() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        _load(x_gmem, smem_in, bars, 1, 1, 0)
        plgpu.barrier_wait(bars.at[0])  # overfull wait

    with pytest.raises(BarrierPhaseError) as caught:
        _trace(body)
    message = str(caught.value)
    assert "barrier_wait(bars.at[0]) at " in message
    assert _line("overfull wait") in message
    assert "num_arrivals=1, but 2 arrivals" in message
    assert "give each copy in flight a barrier slot of its own" in message
    assert "plgpu.Barrier(num_arrivals=2)" in message


def test_barrier_arrivals_past_the_next_phase_are_a_phase_error() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_arrive(bars.at[0])
        plgpu.barrier_arrive(bars.at[0])
        plgpu.barrier_wait(bars.at[0])  # second phase overfull

    with pytest.raises(BarrierPhaseError) as caught:
        _trace(body)
    message = str(caught.value)
    assert _line("second phase overfull") in message
    assert "waits for phase 1" in message and "3 arrivals" in message
    assert "one barrier_wait per 1 arrival" in message
    assert "num_arrivals=3" not in message  # one phase was already waited


def test_one_copy_on_a_two_arrival_barrier_then_a_wait_hangs() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        plgpu.barrier_wait(bars.at[0])  # short wait

    with pytest.raises(safedma.WaitExceedsCopiesError) as caught:
        _trace(body, arrivals=2)
    message = str(caught.value)
    assert _line("short wait") in message
    assert "at most 1 arrival(s)" in message and "1 short" in message
    assert "issue 1 more copy or barrier_arrive on it before the wait" in message


def test_a_wait_no_arrival_precedes_hangs() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.barrier_wait(bars.at[1])  # lonely wait
        _load(x_gmem, smem_in, bars, 0, 1, 1)

    with pytest.raises(safedma.WaitNeverSignalledError) as caught:
        _trace(body)
    message = str(caught.value)
    assert _line("lonely wait") in message
    assert "barrier_wait(bars.at[1])" in message
    assert "Issue the copy with barrier=bars.at[1]" in message


def test_a_second_wait_on_one_completion_hangs() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] * 2
        plgpu.barrier_wait(bars.at[0])  # waited twice

    with pytest.raises(safedma.WaitExceedsCopiesError) as caught:
        _trace(body)
    message = str(caught.value)
    assert _line("waited twice") in message
    assert "second wait on one completion" in message
    assert "remove the extra wait" in message


def test_a_store_no_wait_follows_is_never_waited() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.wait_smem_to_gmem(0)  # too early to cover the store below
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])  # unwaited store

    with pytest.raises(safedma.CopyNeverWaitedError) as caught:
        _trace(body)
    message = str(caught.value)
    assert _line("unwaited store") in message
    assert "plgpu.wait_smem_to_gmem(0, wait_read_only=True) after the last store" in message


def test_a_store_in_a_loop_with_no_wait_anywhere_is_never_waited() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()

        def step(i, carry):
            plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(i * T, T)])  # loop store
            return carry

        jax.lax.fori_loop(0, 4, step, None)

    with pytest.raises(safedma.CopyNeverWaitedError, match=re.escape(_line("loop store"))):
        _trace(body)


def test_the_phase_error_is_raised_under_a_gpu_pallas_call_too() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        _load(x_gmem, smem_in, bars, 1, 1, 0)
        plgpu.barrier_wait(bars.at[0])  # overfull under pallas_call

    def run(x: Any) -> Any:
        return pl.pallas_call(
            safedma.checked(body),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
            out_specs=pl.BlockSpec(memory_space=plgpu.GMEM),
            scratch_shapes=[
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.Barrier(num_arrivals=1, num_barriers=2),
            ],
            compiler_params=plgpu.CompilerParams(),
        )(x)

    with pytest.raises(BarrierPhaseError, match=re.escape(_line("overfull under pallas_call"))):
        jax.make_jaxpr(run)(X)


# -- correct code passes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "steps"),
    [
        (example.raw_body, example.STEPS),
        (example.typed_body, example.STEPS),
        (example.raw_loop_body, example.LOOP_STEPS),
        (example.typed_loop_body, example.LOOP_STEPS),
    ],
    ids=["raw", "typed", "raw_loop", "typed_loop"],
)
def test_the_double_buffer_example_and_its_raw_twin_pass(body: Any, steps: int) -> None:
    x = jax.ShapeDtypeStruct((steps * example.ROWS, example.COLS), jnp.float32)
    jax.make_jaxpr(example.kernel(safedma.checked(body)))(x)


def test_a_fori_loop_pipeline_with_slots_modulo_two_passes() -> None:
    _trace(_pipeline)


def test_a_pallas_call_pipeline_passes() -> None:
    def run(x: Any) -> Any:
        return pl.pallas_call(
            safedma.checked(_pipeline),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=plgpu.GMEM)],
            out_specs=pl.BlockSpec(memory_space=plgpu.GMEM),
            scratch_shapes=[
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.Barrier(num_arrivals=1, num_barriers=2),
            ],
            compiler_params=plgpu.CompilerParams(),
        )(x)

    jax.make_jaxpr(run)(X)


def test_two_copies_on_a_two_arrival_barrier_pass() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        _load(x_gmem, smem_in, bars, 1, 1, 0)
        plgpu.barrier_wait(bars.at[0])
        _load(x_gmem, smem_in, bars, 2, 0, 0)
        plgpu.barrier_arrive(bars.at[0])
        plgpu.barrier_wait(bars.at[0])

    _trace(body, arrivals=2)


def test_an_arrival_for_the_next_phase_before_a_wait_passes() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        _load(x_gmem, smem_in, bars, 1, 1, 0)
        plgpu.barrier_arrive(bars.at[0])  # the next phase's first of two
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_arrive(bars.at[0])
        plgpu.barrier_wait(bars.at[0])

    _trace(body, arrivals=2)


def test_two_slots_in_flight_then_waited_in_order_pass() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        _load(x_gmem, smem_in, bars, 1, 1, 1)
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_wait(bars.at[1])
        _load(x_gmem, smem_in, bars, 2, 0, 0)
        plgpu.barrier_wait(bars.at[0])

    _trace(body)


def test_slots_computed_from_the_program_id_pass() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        i = jax.lax.axis_index("g")
        _load(x_gmem, smem_in, bars, i, i % 2, i % 2)
        _load(x_gmem, smem_in, bars, i, 1 - i % 2, 1 - i % 2)
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_wait(bars.at[1])

    _trace(body, grid=(4,), grid_names=("g",))


def test_a_predicated_prefetch_before_an_unconditional_wait_passes() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        i = jax.lax.axis_index("g")

        @pl.when(i < 3)
        def _():
            _load(x_gmem, smem_in, bars, i, 0, 0)

        @pl.when(i >= 3)
        def _():
            _load(x_gmem, smem_in, bars, 0, 0, 0)

        plgpu.barrier_wait(bars.at[0])

    _trace(body, grid=(4,), grid_names=("g",))


def test_waits_in_a_loop_after_arrivals_in_a_loop_pass() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        def issue(i, carry):
            _load(x_gmem, smem_in, bars, i, i % 2, i % 2)
            return carry

        def drain(i, carry):
            plgpu.barrier_wait(bars.at[i % 2])
            return carry

        jax.lax.fori_loop(0, 2, issue, None)
        jax.lax.fori_loop(0, 2, drain, None)
        plgpu.barrier_wait(bars.at[0])  # after the loops: read as unknown, not a hang
        _load(x_gmem, smem_in, bars, 2, 0, 0)
        plgpu.barrier_wait(bars.at[0])

    _trace(body)


def test_warpgroups_arriving_on_a_shared_barrier_pass() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.barrier_arrive(bars.at[0])  # each of the two warpgroups arrives once
        plgpu.barrier_wait(bars.at[0])

    _trace(body, arrivals=2, num_threads=2, thread_name="wg")


def test_a_barrier_a_helper_receives_is_not_taken_for_fresh() -> None:
    @safedma.checked
    def consume(bars):
        plgpu.barrier_wait(bars.at[0])  # the copy was issued by the caller

    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        _load(x_gmem, smem_in, bars, 0, 0, 0)
        consume(bars)

    _trace(body)


def test_a_store_waited_after_a_helper_returns_passes() -> None:
    @safedma.checked
    def store(smem_out, o_gmem):
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])

    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        store(smem_out, o_gmem)
        plgpu.wait_smem_to_gmem(0)

    _trace(body)


def test_a_store_a_later_loop_iteration_waits_is_left_to_verify_gpu() -> None:
    """The last iteration's store is in flight at exit, but every other one is waited: not
    wrong on every path, so not reported at trace time (verify_gpu walks the iterations)."""

    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()

        def step(i, carry):
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)
            plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(i * T, T)])
            return carry

        jax.lax.fori_loop(0, 4, step, None)

    _trace(body)


def test_a_second_wait_on_a_run_scoped_barrier_hangs_and_names_it() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        def scoped(ready):
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], ready)
            plgpu.barrier_wait(ready)
            plgpu.barrier_wait(ready)  # scoped twice

        pl.run_scoped(scoped, plgpu.Barrier(num_arrivals=1))

    with pytest.raises(safedma.WaitExceedsCopiesError) as caught:
        _trace(body)
    message = str(caught.value)
    assert "barrier_wait(ready) at " in message and _line("scoped twice") in message
    assert "second wait on one completion" in message


def test_a_run_scoped_barrier_in_a_loop_waited_once_per_iteration_passes() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        def step(i, carry):
            def scoped(ready):
                plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * T, T)], smem_in.at[0], ready)
                plgpu.barrier_wait(ready)

            pl.run_scoped(scoped, plgpu.Barrier(num_arrivals=1))
            return carry

        jax.lax.fori_loop(0, 4, step, None)

    _trace(body)


def test_two_copies_on_one_slot_before_its_wait_in_a_loop_body_are_a_phase_error() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        def step(i, carry):
            _load(x_gmem, smem_in, bars, i, 0, i % 2)
            _load(x_gmem, smem_in, bars, i, 1, i % 2)
            plgpu.barrier_wait(bars.at[i % 2])  # overfull in the loop
            return carry

        jax.lax.fori_loop(0, 4, step, None)

    with pytest.raises(BarrierPhaseError) as caught:
        _trace(body)
    message = str(caught.value)
    assert _line("overfull in the loop") in message
    assert "the loop body or branch around it issues 2 arrivals" in message


def test_two_copies_before_a_wait_in_a_branch_are_a_phase_error() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        @pl.when(jax.lax.axis_index("g") == 0)
        def _():
            _load(x_gmem, smem_in, bars, 0, 0, 1)
            plgpu.barrier_arrive(bars.at[1])
            plgpu.barrier_wait(bars.at[1])  # overfull in the branch

    with pytest.raises(BarrierPhaseError, match=re.escape(_line("overfull in the branch"))):
        _trace(body, grid=(2,), grid_names=("g",))
