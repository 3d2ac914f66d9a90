"""verify_gpu on small plgpu kernels: a correct pipeline is clean, each mistake is named.

Every kernel is traced on CPU (nothing is compiled or run). Each mistake test
checks the error class, what the message names (barrier, phase, buffer) and
that it points at the kernel's own line in this file.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from safedma.testing._gpu.jax_seam import plgpu_available

if not plgpu_available():
    pytest.skip("this jax has no Pallas GPU API the checker reads", allow_module_level=True)

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from safedma.testing import (
    CopyInFlightAtExitError,
    DeadlockError,
    GpuVerifyReport,
    RaceDetectedError,
    VerificationUnsupportedError,
    verify_gpu,
)

N, T = 4, 64
X = jax.ShapeDtypeStruct((N * T, 128), jnp.float32)
HERE = __file__.rsplit("/", 1)[-1]


def _kernel(body, *, arrivals=1, barriers=2, **kw):
    def run(x):
        return plgpu.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_types=[
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=barriers),
            ],
            **kw,
        )(x)

    return run


def _pipeline(x_gmem, o_gmem, smem_in, smem_out, bars):
    """Double-buffered TMA load -> compute -> TMA store, correct."""

    def load(i, slot):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * T, T)], smem_in.at[slot], bars.at[slot])

    load(0, 0)

    def step(i, carry):
        slot = i % 2

        @pl.when(i + 1 < N)
        def _():
            load(i + 1, 1 - slot)

        plgpu.barrier_wait(bars.at[slot])
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        smem_out[slot] = smem_in[slot] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[slot], o_gmem.at[pl.ds(i * T, T)])
        return carry

    jax.lax.fori_loop(0, N, step, None)
    plgpu.wait_smem_to_gmem(0)


def test_double_buffered_pipeline_is_clean() -> None:
    report = verify_gpu(_kernel(_pipeline), X)
    assert report == GpuVerifyReport(
        kernels=1, programs=1, copies_in=N, copies_out=N, barrier_waits=N
    )


def test_pallas_call_with_gpu_compiler_params_is_checked() -> None:
    def run(x):
        return pl.pallas_call(
            _pipeline,
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

    assert verify_gpu(run, X).copies_in == N


def test_each_grid_program_is_walked_with_its_program_id() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        i = jax.lax.axis_index("g")
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(i * T, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] + 1
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(i * T, T)])
        plgpu.wait_smem_to_gmem(0)

    report = verify_gpu(_kernel(body, grid=(N,), grid_names=("g",)), X)
    assert (report.programs, report.copies_in) == (N, N)


def test_barrier_expecting_two_arrivals_with_one_copy_deadlocks() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])

    with pytest.raises(DeadlockError) as info:
        verify_gpu(_kernel(body, arrivals=2), X)
    text = str(info.value)
    assert "barrier_wait(bars[0])" in text and "phase 0" in text
    assert "only 1 of its 2 arrivals" in text
    assert HERE in text and "num_arrivals" in text


def test_second_wait_for_one_completion_deadlocks() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_wait(bars.at[0])

    with pytest.raises(DeadlockError) as info:
        verify_gpu(_kernel(body), X)
    text = str(info.value)
    assert "waits for phase 1" in text and "a second time for one completion" in text
    assert HERE in text


def test_read_before_barrier_wait_is_a_race_naming_the_copy() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        smem_out[0] = smem_in[0]  # too early
        plgpu.barrier_wait(bars.at[0])

    with pytest.raises(RaceDetectedError) as info:
        verify_gpu(_kernel(body), X)
    text = str(info.value)
    assert "a read of smem_in[0]" in text and "the copy into smem_in[0]" in text
    assert "barrier_wait(bars[0])" in text and text.count(HERE) >= 2


def test_store_without_commit_smem_is_reported() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.wait_smem_to_gmem(0)

    with pytest.raises(RaceDetectedError, match="missing commit_smem") as info:
        verify_gpu(_kernel(body), X)
    assert "smem_out[0]" in str(info.value) and "plgpu.commit_smem()" in str(info.value)


def test_smem_overwritten_before_its_store_was_waited_is_a_race() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])
        smem_out[0] = jnp.ones((T, 128), jnp.float32)  # the store may still read it
        plgpu.wait_smem_to_gmem(0)

    with pytest.raises(RaceDetectedError, match="may still be reading") as info:
        verify_gpu(_kernel(body), X)
    assert "a write of smem_out[0]" in str(info.value) and "wait_read_only=True" in str(info.value)


def test_write_after_a_read_only_wait_is_clean() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        smem_out[0] = jnp.ones((T, 128), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(T, T)])
        plgpu.wait_smem_to_gmem(0)

    assert verify_gpu(_kernel(body), X).copies_out == 2


def test_store_never_waited_at_exit_is_reported() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        smem_out[0] = jnp.zeros((T, 128), jnp.float32)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])

    with pytest.raises(CopyInFlightAtExitError, match="wait_smem_to_gmem\\(0\\)") as info:
        verify_gpu(_kernel(body), X)
    assert HERE in str(info.value)


def test_two_copies_on_a_one_arrival_barrier_overrun_it() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], smem_in.at[1], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] + smem_in[1]

    with pytest.raises(DeadlockError, match="barrier overrun") as info:
        verify_gpu(_kernel(body), X)
    text = str(info.value)
    assert "the copy into smem_in[1]" in text and "num_arrivals=1" in text


def test_two_copies_on_a_two_arrival_barrier_are_clean() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], smem_in.at[1], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] + smem_in[1]

    assert verify_gpu(_kernel(body, arrivals=2), X).barrier_waits == 1


def test_copy_never_waited_at_exit_is_reported() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])

    with pytest.raises(CopyInFlightAtExitError, match="never observed by a barrier_wait"):
        verify_gpu(_kernel(body), X)


def test_several_warpgroups_are_refused_clearly() -> None:
    with pytest.raises(VerificationUnsupportedError, match="num_threads=2"):
        verify_gpu(_kernel(_pipeline, num_threads=2, thread_name="wg"), X)


def test_branch_on_data_that_changes_the_protocol_is_refused() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])

        @pl.when(smem_in[0, 0, 0] > 0)
        def _():
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], smem_in.at[1], bars.at[1])
            plgpu.barrier_wait(bars.at[1])

    with pytest.raises(VerificationUnsupportedError, match="branch on a value"):
        verify_gpu(_kernel(body), X)


def test_importing_safedma_testing_does_not_import_pallas_gpu() -> None:
    code = (
        "import sys, safedma, safedma.testing\n"
        "assert 'jax.experimental.pallas.mosaic_gpu' not in sys.modules, 'plgpu imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_store_issued_under_a_branch_on_data_is_refused_not_reported_when_it_would_race() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0]
        plgpu.commit_smem()

        @pl.when(smem_in[0, 0, 0] > 0)
        def _():
            plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])

        smem_out[0] = smem_in[0] * 2  # races with the store, if the branch ran
        plgpu.wait_smem_to_gmem(0)

    with pytest.raises(VerificationUnsupportedError, match="only on some values of data"):
        verify_gpu(_kernel(body), X)


def test_store_issued_under_a_branch_on_data_and_waited_is_clean() -> None:
    def body(x_gmem, o_gmem, smem_in, smem_out, bars):
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0]
        plgpu.commit_smem()

        @pl.when(smem_in[0, 0, 0] > 0)
        def _():
            plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])

        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        smem_out[0] = smem_in[0] * 2

    assert verify_gpu(_kernel(body), X).copies_out == 1
