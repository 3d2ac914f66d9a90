"""Constructs strict simulation cannot run: refused with the line and a pointer to
verify, not run wrongly or reported as another mistake.

* a DMA future started in one call and waited in the next;
* constructs jax's interpreter cannot lower, and a ref view it fails on at run time;
* a copy that signals a REGULAR semaphore (refused, not called a leftover);
* a semaphore array indexed one past its end (caught naming the line);
* a reference computation with no kernel in it is not refused for its buffer sizes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    KernelFailedError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationUnsupportedError,
    simulate,
    simulated_mesh,
)
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ a DMA future: started in one call, waited in the next


def _future_start(x_ref: Any, x_alias: Any, o_ref: Any, sem: Any) -> None:
    del x_alias
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _future_wait(x_ref: Any, o_ref: Any, sem: Any, o_alias: Any) -> None:
    del o_alias
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def _copy_through_a_future(x: jax.Array) -> jax.Array:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, sem = pl.pallas_call(
        _future_start,
        out_shape=(like, like, pltpu.SemaphoreType.DMA(())),
        in_specs=[hbm],
        out_specs=(hbm, hbm, sem_spec),
        input_output_aliases={0: 0},
    )(x)
    done: jax.Array = pl.pallas_call(
        _future_wait,
        out_shape=like,
        in_specs=[hbm, hbm, sem_spec],
        out_specs=hbm,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return done


def test_a_dma_future_across_pallas_calls_is_refused_naming_the_call_and_verify() -> None:
    # jax's interpreter failed inside its lowering ("NotImplementedError: nan +
    # dma_sem"): its semaphores live only while one kernel runs.
    with pytest.raises(SimulationUnsupportedError) as refused:
        simulate(_copy_through_a_future, example(BLOCK))
    message = str(refused.value)
    assert "future" in message and "safedma.testing.verify" in message, message
    start_line = line_of(_copy_through_a_future, "x, out, sem = pl.pallas_call(")
    assert f"at {start_line} " in message, message
    assert "returns 1 semaphore" in message, message
    assert_clean_afterwards()


def test_the_same_start_with_its_semaphore_in_scratch_is_still_simulated_and_caught() -> None:
    # The refusal is for semaphores crossing a call's boundary only: the start
    # kernel with its semaphore in scratch runs, and its missing wait is caught.
    def start_only(x: jax.Array) -> jax.Array:
        hbm = pl.BlockSpec(memory_space=pl.ANY)
        like = jax.ShapeDtypeStruct(x.shape, x.dtype)

        def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
            _future_start(x_ref, None, o_ref, sem)

        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=like,
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    with pytest.raises((LeftoverSemaphoreError, RaceDetectedError)) as caught:
        simulate(start_only, example(BLOCK))
    assert line_of(_future_start, ".start()") in str(caught.value)
    assert_clean_afterwards()


# ------------------------------------ constructs jax's interpreter cannot lower


def _exchange(x_ref: Any, o_ref: Any, ready: Any, send: Any, recv: Any, wait: bool) -> None:
    peer = 1 - lax.axis_index("x")  # an unvarying constant minus a varying index
    pl.semaphore_signal(ready, device_id=peer, device_id_type=pl.DeviceIdType.LOGICAL)
    pl.semaphore_wait(ready)
    copy = pltpu.make_async_remote_copy(
        x_ref, o_ref, send, recv, device_id=peer, device_id_type=pl.DeviceIdType.LOGICAL
    )
    copy.start()
    if wait:
        copy.wait()


def _exchange_call(wait: bool) -> Any:
    def call(x: jax.Array) -> jax.Array:
        def kernel(x_ref: Any, o_ref: Any) -> None:
            sems = (pltpu.SemaphoreType.REGULAR, pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA)
            pl.run_scoped(lambda *s: _exchange(x_ref, o_ref, *s, wait=wait), *sems)

        hbm = pl.BlockSpec(memory_space=pl.ANY)
        varying = jax.sharding.ManualAxisType(varying={"x"})
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(BLOCK, F32, manual_axis_type=varying),
            in_specs=[hbm],
            out_specs=hbm,
        )(x)
        return out

    return call


def test_an_interpreter_lowering_failure_is_refused_naming_the_line_and_verify() -> None:
    # jax's interpreter cannot lower a kernel under shard_map's check_vma=True
    # (jax's default): its own arithmetic on axis_index mixes varying and
    # unvarying values. That used to surface as jax's ValueError from inside
    # the interpreter; now it names the construct, the kernel's line and verify.
    mesh: Mesh = simulated_mesh(2, "x")
    x = jax.device_put(example((16, 128)), jax.sharding.NamedSharding(mesh, P("x")))
    checked = jax.jit(
        jax.shard_map(_exchange_call(True), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    with pytest.raises(SimulationUnsupportedError) as refused:
        simulate(checked, x)
    message = str(refused.value)
    assert "jax's TPU interpreter failed" in message, message
    assert "safedma.testing.verify" in message and "check_vma=False" in message, message
    assert f"at {line_of(_exchange, 'peer = 1 - lax.axis_index')} " in message, message
    # The same kernel under simulate's own shard_map (check_vma=False) runs ...
    out = simulate(_exchange_call(True), x, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 8, 0))
    # ... and its twin without the wait is still caught, naming its start.
    with pytest.raises((LeftoverSemaphoreError, RaceDetectedError)) as caught:
        simulate(_exchange_call(False), x, mesh=mesh)
    assert line_of(_exchange, "copy.start()") in str(caught.value)
    assert_clean_afterwards()


# ------------------------------------ a ref view the interpreter fails on at run time


def _read_through_a_view(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref.bitcast(jnp.int16)[...]  # a bitcast view of a ref


def _read_out_of_bounds(x_ref: Any, o_ref: Any) -> None:
    o_ref[0, 0] = x_ref[100, 0]


def _vmem_call(kernel: Any, out: jax.ShapeDtypeStruct) -> Any:
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    return pl.pallas_call(kernel, out_shape=out, in_specs=[vmem], out_specs=vmem)


def test_a_ref_view_the_interpreter_lacks_is_refused_naming_the_line_and_verify() -> None:
    # It was reported as the kernel failing ("KernelFailedError: AttributeError:
    # 'BitcastTransform' object has no attribute 'indices'").
    x = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)
    call = _vmem_call(_read_through_a_view, jax.ShapeDtypeStruct((16, 128), jnp.int16))
    with pytest.raises(SimulationUnsupportedError) as refused:
        simulate(call, x)
    message = str(refused.value)
    assert "does not implement" in message and "safedma.testing.verify" in message, message
    assert f"at {line_of(_read_through_a_view, 'o_ref[...] =')} " in message, message
    # A mistake the interpreter checks is still the kernel's failure, with its line.
    with pytest.raises(KernelFailedError) as failed:
        simulate(_vmem_call(_read_out_of_bounds, jax.ShapeDtypeStruct(BLOCK, F32)), example(BLOCK))
    assert line_of(_read_out_of_bounds, "x_ref[100, 0]") in str(failed.value)
    assert_clean_afterwards()


# ------------------------------------ a copy that signals a REGULAR semaphore (TPU v6+)


def _copy_on_a_regular_semaphore(x_hbm: Any, o_hbm: Any) -> None:
    def body(buf: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm, buf, sem)  # its completion adds 1 on a TPU v6
        pl.semaphore_wait(sem)
        pltpu.async_copy(buf, o_hbm, sem)
        pl.semaphore_wait(sem)

    pl.run_scoped(body, pltpu.VMEM(BLOCK, F32), pltpu.SemaphoreType.REGULAR)


def _copy_on_a_dma_semaphore(x_hbm: Any, o_hbm: Any) -> None:
    def body(buf: Any, sem: Any) -> None:
        pltpu.async_copy(x_hbm, buf, sem)  # the twin: no wait before the read
        pltpu.async_copy(buf, o_hbm, sem).wait()

    pl.run_scoped(body, pltpu.VMEM(BLOCK, F32), pltpu.SemaphoreType.DMA)


def _hbm_call(kernel: Any) -> Any:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(BLOCK, F32), in_specs=[hbm], out_specs=hbm
    )


def test_a_copy_signalling_a_regular_semaphore_is_refused_not_called_leftover() -> None:
    # jax's interpreter adds the bytes copied to the REGULAR semaphore, so this
    # correct kernel was reported as a LeftoverSemaphoreError of 8190 bytes.
    with pytest.raises(SimulationUnsupportedError) as refused:
        simulate(_hbm_call(_copy_on_a_regular_semaphore), example(BLOCK))
    message = str(refused.value)
    assert "REGULAR" in message and "safedma.testing.verify" in message, message
    assert f"at {line_of(_copy_on_a_regular_semaphore, 'async_copy(x_hbm')} " in message
    # The refusal is for regular semaphores only: a copy on a DMA semaphore
    # read before its wait is still simulated and caught.
    with pytest.raises((RaceDetectedError, LeftoverSemaphoreError)) as caught:
        simulate(_hbm_call(_copy_on_a_dma_semaphore), example(BLOCK))
    assert line_of(_copy_on_a_dma_semaphore, "async_copy(x_hbm") in str(caught.value)
    assert_clean_afterwards()


# ------------------------------------ a semaphore array indexed one past its end


def _per_step_semaphore(offset: int) -> Any:
    def kernel(x_ref: Any, o_ref: Any, sems: Any) -> None:
        step = pl.program_id(0)
        copy = pltpu.make_async_copy(x_ref.at[step], o_ref.at[step], sems.at[step + offset])
        copy.start()
        copy.wait()

    return kernel


def _steps_call(offset: int) -> Any:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        _per_step_semaphore(offset),
        out_shape=jax.ShapeDtypeStruct((2, *BLOCK), F32),
        in_specs=[hbm],
        out_specs=hbm,
        grid=(2,),
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
    )


def test_a_semaphore_index_past_the_array_is_caught_naming_the_line() -> None:
    # jax's interpreter clamps the index to the last semaphore, so the kernel
    # (sems.at[step + 1] on two semaphores) ran clean; on a TPU it is another
    # semaphore's memory.
    x = example((2, *BLOCK))
    np.testing.assert_array_equal(np.asarray(simulate(_steps_call(0), x)), np.asarray(x))
    with pytest.raises(KernelFailedError) as caught:
        simulate(_steps_call(1), x)
    message = str(caught.value)
    assert "semaphore index 2" in message and "shape (2,)" in message, message
    assert line_of(_per_step_semaphore, "copy.start()") in message, message
    assert_clean_afterwards()


# ------------------------------------ a reference computation with no kernel in it


def test_a_program_without_kernels_is_not_refused_for_its_buffer_sizes() -> None:
    # jax's tests compute the expected values with lax collectives under the
    # same shard_map; on jax 0.10 simulate refused any 8-device program with
    # 100 KiB or more per device, though the hang it avoids is in the
    # interpreter's callbacks. The same sizes with a kernel are still refused
    # there (test_runner's test_many_devices_with_large_buffers_*).
    mesh: Mesh = simulated_mesh(8, "x")
    x = example((8 * 256, 128))  # 128 KiB per device
    ring = [(i, (i + 1) % 8) for i in range(8)]
    out = simulate(lambda a: lax.ppermute(a, "x", ring), x, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 256, 0))
