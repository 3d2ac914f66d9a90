"""Issue 13 item 4: DMA futures across pallas_calls.

``start_async`` / ``finish_async`` build the raw pair of pallas_calls (semaphore
as an output, source and buffer aliased); neither half is a false alarm; a
future dropped, finished twice, started with no copy or finished with no wait
is an error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_kernels
from tests.support import census_kernels as ck
from tests.support.twins import census as twin
from tests.support.patterns import X, trace

DST = jax.ShapeDtypeStruct(X.shape, X.dtype)


def test_pair_matches_raw_including_aliases() -> None:
    assert_same_mosaic(ck.copy_through_future, twin.copy_through_future, X)
    start, done = mosaic_kernels(ck.copy_through_future, X)
    assert "operand_index = 0" in start.aliases
    assert "operand_index = 1" in done.aliases


def test_dropped_future_is_an_error() -> None:
    @sd.checked_futures
    def dropped(x: jax.Array) -> jax.Array:
        sd.start_async(ck.future_start, x, dst=DST)
        return x

    with pytest.raises(sd.FutureDroppedError) as err:
        trace(dropped)
    assert "future_start" in str(err.value) and "test_patterns_futures.py" in str(err.value)


def test_futures_dropped_at_one_site_are_one_line_with_their_count() -> None:
    @sd.checked_futures
    def dropped(x: jax.Array) -> jax.Array:
        for _ in range(3):
            sd.start_async(ck.future_start, x, dst=DST)  # LOOP
        sd.start_async(ck.future_start, x, dst=DST)  # ONCE
        return x

    with pytest.raises(sd.FutureDroppedError) as err:
        trace(dropped)
    listed = [row for row in str(err.value).splitlines() if row.startswith("  - ")]
    assert len(listed) == 2, listed
    assert listed[0].startswith("  - 3 futures of future_start, started at "), listed
    assert listed[1].startswith("  - future_start, started at "), listed
    assert "4 DMA future(s) were started" in str(err.value)


def test_future_finished_twice_is_an_error() -> None:
    @sd.checked_futures
    def twice(x: jax.Array) -> jax.Array:
        future = sd.start_async(ck.future_start, x, dst=DST)
        sd.finish_async(ck.future_done, future)
        return sd.finish_async(ck.future_done, future)

    with pytest.raises(sd.FutureConsumedTwiceError, match="finished at .* and again at"):
        trace(twice)


def test_a_returned_future_is_handed_on_not_dropped() -> None:
    @sd.checked_futures
    def start_only(x: jax.Array) -> sd.DmaFuture:
        return sd.start_async(ck.future_start, x, dst=DST)

    @sd.checked_futures
    def finish_only(future: sd.DmaFuture) -> jax.Array:
        return sd.finish_async(ck.future_done, future)

    future = jax.eval_shape(start_only, X)
    assert isinstance(future, sd.DmaFuture)
    trace(finish_only, future)


def test_start_kernel_that_starts_nothing_is_an_error() -> None:
    def starts_nothing(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        del x, o, sem

    with pytest.raises(sd.FutureNotWaitedError, match="'starts_nothing' started no copy"):
        trace(lambda x: sd.start_async(starts_nothing, x, dst=DST).buffer)


def test_done_kernel_that_never_waits_is_an_error() -> None:
    def waits_nothing(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        del x, o, sem

    def program(x: jax.Array) -> jax.Array:
        return sd.finish_async(waits_nothing, sd.start_async(ck.future_start, x, dst=DST))

    with pytest.raises(sd.FutureNotWaitedError, match="never waited"):
        trace(program)


def test_done_kernel_may_wait_by_size() -> None:
    def done_by_size(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.wait_bytes(sem, o)

    @sd.checked_futures
    def program(x: jax.Array) -> jax.Array:
        return sd.finish_async(done_by_size, sd.start_async(ck.future_start, x, dst=DST))

    start, done = mosaic_kernels(program, X)
    assert "%arg1, %arg1" in done.module  # the self-descriptor wait on the buffer


def test_errors_in_a_half_name_the_body_parameters() -> None:
    def start(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x_ref.at[0], o_ref, sem).start()

    with pytest.raises(sd.CopyShapeMismatchError, match=r"x_ref.at\[...\] float32\[128\]"):
        trace(lambda x: sd.start_async(start, x, dst=DST).buffer)


def test_start_kernel_still_checks_other_copies() -> None:
    """Only the future's semaphore is handed on: another copy left in flight is reported."""

    def leaks(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        def body(other: sd.SemRef) -> None:
            sd.LocalCopy(x, o, other).start()

        sd.LocalCopy(x, o, sem).start()
        sd.run_scoped(body, sd.dma_semaphore())

    with pytest.raises(sd.CopyNeverWaitedError):
        trace(lambda x: sd.start_async(leaks, x, dst=DST).buffer)


def test_vmem_destination_matches_raw() -> None:
    def raw(x: jax.Array) -> jax.Array:
        from jax.experimental import pallas as pl

        hbm = pl.BlockSpec(memory_space=pl.ANY)
        vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
        sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)

        def start(x_ref, alias, o_ref, sem):  # type: ignore[no-untyped-def]
            pltpu.make_async_copy(x_ref, o_ref, sem).start()

        def done(x_ref, o_ref, sem, alias):  # type: ignore[no-untyped-def]
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

        x, out, sem = pl.pallas_call(
            start,
            out_shape=(
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                pltpu.VMEM(x.shape, x.dtype),
                pltpu.SemaphoreType.DMA(()),
            ),
            in_specs=[hbm],
            out_specs=(hbm, vmem, sem_spec),
            input_output_aliases={0: 0},
        )(x)
        result: jax.Array = pl.pallas_call(
            done,
            out_shape=pltpu.VMEM(x.shape, x.dtype),
            in_specs=[hbm, vmem, sem_spec],
            out_specs=vmem,
            input_output_aliases={1: 0},
        )(x, out, sem)
        return result

    @sd.checked_futures
    def ours(x: jax.Array) -> jax.Array:
        dst = jax.ShapeDtypeStruct(x.shape, x.dtype)
        future = sd.start_async(ck.future_start, x, dst=dst, dst_memory_space=pltpu.VMEM)
        return sd.finish_async(ck.future_done, future)

    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(ours, raw, jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh=mesh)
