"""Patterns of the DMA/semaphore kernels in jax's own Pallas TPU test-suite.

verify had never run on them (docs/verify.md, "jax's own Pallas TPU tests", lists
the tests and verdicts). Each kernel here is written for this file in raw pltpu
and reproduces one construct that made verify crash or raise a false alarm; each
correct one must verify clean and each seeded mistake must still be caught,
naming this file's line.

* a DMA future whose destination is a VMEM-resident output (``out_shape`` made
  with ``pltpu.VMEM(...)``): the array lives in VMEM between the two calls, so
  Pallas copies nothing out of it while the copy is in flight;
* a REGULAR semaphore returned by one call (after an all-device barrier) and
  signalled remotely by a later call with ``skip_device_barrier``: it exists
  from the call that returned it, so the later call needs no barrier of its own;
* ``pl.select_ref`` choosing a copy's source and semaphore per iteration, past
  its last ref, nested and reshaped;
* an array of PRNG keys as an operand (an extended dtype: no host values);
* ``pl.run_state`` around stateful pallas_calls that close over its refs (a DMA
  future between them) and around ``pl.core_map``;
* a copy of a region onto itself (emit_pipeline with ``no_pipelining``);
* pytree arguments (a tuple of arrays with a None, as jax.jit takes them);
* a permute whose receiver returns without ``wait_recv``: reported as the copy
  that lands after its target left (R8, naming the copy), not as an output
  nothing wrote.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import (
    LeftoverSemaphoreError,
    UnwrittenReadError,
    RaceDetectedError,
    SignalAfterExitError,
    abstract_mesh,
    verify,
)

F32 = jnp.float32
HERE = r"test_select_ref_prng_keys_and_returned_semaphores\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------------------- DMA future into a VMEM output


def _future_into_vmem(*, wait: bool, touch: bool) -> Any:
    """Start a copy of ``x`` into a VMEM-resident output; a second call waits for it."""

    def start_kernel(x_ref: Any, x_alias: Any, o_ref: Any, sem: Any) -> None:
        del x_alias
        pltpu.make_async_copy(x_ref, o_ref, sem).start()
        if touch:
            o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)  # while the copy writes it

    def done_kernel(x_ref: Any, o_ref: Any, sem: Any, o_alias: Any) -> None:
        del o_alias
        if wait:
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    def fn(x: Any) -> Any:
        x, out, sem = pl.pallas_call(
            start_kernel,
            out_shape=(
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                pltpu.VMEM(x.shape, x.dtype),
                pltpu.SemaphoreType.DMA(()),
            ),
            in_specs=[ANY],
            out_specs=(ANY, VMEM, SEM),
            input_output_aliases={0: 0},
        )(x)
        return pl.pallas_call(
            done_kernel,
            out_shape=pltpu.VMEM(x.shape, x.dtype),
            in_specs=[ANY, VMEM, SEM],
            out_specs=VMEM,
            input_output_aliases={1: 0},
        )(x, out, sem)

    return fn


def test_a_future_into_a_vmem_output_is_not_copied_out_while_in_flight() -> None:
    report = verify(_future_into_vmem(wait=True, touch=False), X)
    assert (report.dmas, report.waits) == (1, 1)


def test_a_future_into_a_vmem_output_never_waited_is_caught() -> None:
    # the second call returns the buffer the copy may still write
    with pytest.raises((RaceDetectedError, LeftoverSemaphoreError), match=HERE):
        verify(_future_into_vmem(wait=False, touch=False), X)


def test_a_store_into_a_vmem_output_in_flight_is_caught() -> None:
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_future_into_vmem(wait=True, touch=True), X)


# ------------------------------------- a returned semaphore signalled by a later call

N = 4


def _signal_returned_semaphore(*, barrier: bool) -> Any:
    """Call 1 returns a REGULAR semaphore (behind an all-device barrier when
    ``barrier``); call 2, without a device barrier, signals it on every device."""

    def alloc_kernel(sem_out: Any) -> None:
        del sem_out
        if barrier:
            b = pltpu.get_barrier_semaphore()
            for d in range(N):
                pl.semaphore_signal(b, device_id=d)
            pl.semaphore_wait(b, N)

    def use_kernel(x_ref: Any, sem: Any, o_ref: Any) -> None:
        for d in range(N):
            pl.semaphore_signal(sem, device_id=d)
        pl.semaphore_wait(sem, N)
        o_ref[...] = x_ref[...]

    def fn(x: Any) -> Any:
        sem = pl.pallas_call(
            alloc_kernel,
            in_specs=[],
            out_specs=SEM,
            out_shape=pltpu.SemaphoreType.REGULAR(()),
            compiler_params=pltpu.CompilerParams(collective_id=0)
            if barrier
            else pltpu.CompilerParams(skip_device_barrier=True),
        )()
        return pl.pallas_call(
            use_kernel,
            in_specs=[VMEM, SEM],
            out_specs=VMEM,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(skip_device_barrier=True),
        )(x, sem)

    return fn


def test_a_returned_semaphore_exists_from_the_call_that_returned_it() -> None:
    report = verify(_signal_returned_semaphore(barrier=True), X, mesh=abstract_mesh((N,), ("x",)))
    assert report.signals == 2 * N * N


def test_a_returned_semaphore_signalled_before_its_owner_entered_is_caught() -> None:
    with pytest.raises(SignalAfterExitError, match=HERE):
        verify(_signal_returned_semaphore(barrier=False), X, mesh=abstract_mesh((N,), ("x",)))


# ---------------------------------------------------------------- pl.select_ref

needs_select_ref = pytest.mark.skipif(
    not hasattr(pl, "select_ref"), reason="pl.select_ref is new in jax 0.12"
)


def _selected_copies(*, same_slot: bool) -> Any:
    """Copy refs a and b into the two halves of the output, each chosen by
    ``pl.select_ref``, with semaphore slot i (or slot 0 for both)."""

    def kernel(a_ref: Any, b_ref: Any, o_ref: Any, sems: Any) -> None:
        copies = []
        for i in range(2):
            slot = 0 if same_slot else i
            copy = pltpu.make_async_copy(
                pl.select_ref(i, a_ref, b_ref),
                o_ref.at[pl.ds(8 * i, 8)],
                pl.select_ref(slot, sems.at[0], sems.at[1]),
            )
            copy.start()
            copies.append(copy)
        copies[0].wait()
        o_ref[0:8, :] = o_ref[0:8, :] + 1  # needs copy 0, not whichever landed first
        copies[1].wait()

    def fn(a: Any, b: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY, ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
        )(a, b)

    return fn


@needs_select_ref
def test_select_ref_picks_each_copys_source_and_semaphore() -> None:
    report = verify(_selected_copies(same_slot=False), X, X)
    assert (report.dmas, report.waits) == (2, 2)


@needs_select_ref
def test_select_ref_onto_one_shared_slot_is_caught() -> None:
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_selected_copies(same_slot=True), X, X)


def _selected_semaphore_past_the_end(*, wait_each: bool) -> Any:
    """Three copies whose semaphore is ``pl.select_ref(i, sems.at[0], sems.at[1])``:
    Mosaic picks the last ref for an index past the end, so copies 1 and 2 share
    ``sems.at[1]``; waiting each copy before the next start keeps them apart."""

    def kernel(x_ref: Any, o_ref: Any, sems: Any) -> None:
        def copy(i: int) -> Any:
            return pltpu.make_async_copy(
                x_ref, o_ref.at[pl.ds(8 * i, 8)], pl.select_ref(i, sems.at[0], sems.at[1])
            )

        if wait_each:
            for i in range(3):
                copy(i).start()
                copy(i).wait()
            return
        copy(1).start()
        copy(2).start()
        copy(1).wait()
        o_ref[8:16, :] = o_ref[8:16, :] + 1  # copy 2's bytes may have released the wait
        copy(2).wait()

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct((24, 128), F32),
            scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
        )(x)

    return fn


@needs_select_ref
def test_select_ref_past_the_end_picks_the_last_ref() -> None:
    report = verify(_selected_semaphore_past_the_end(wait_each=True), X)
    assert (report.dmas, report.waits) == (3, 3)


@needs_select_ref
def test_select_ref_past_the_end_shares_the_last_slot() -> None:
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_selected_semaphore_past_the_end(wait_each=False), X)


def _nested_select(*, wait: bool) -> Any:
    """``pl.select_ref`` of ``pl.select_ref``s of column halves, then reshaped: a
    transform of a multi-ref nests one TransformedRef in another."""

    def kernel(a_ref: Any, b_ref: Any, o_ref: Any, sem: Any) -> None:
        for i in range(2):
            halves = [pl.select_ref(1, r.at[:, :128], r.at[:, 128:]) for r in (a_ref, b_ref)]
            copy = pltpu.make_async_copy(
                pl.select_ref(i, *halves).reshape(8, 128), o_ref.at[pl.ds(8 * i, 8)], sem
            )
            copy.start()
            if wait:
                copy.wait()
        if not wait:
            copy.wait()  # only the last copy: the first is never waited

    def fn(a: Any, b: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY, ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(a, b)

    return fn


@needs_select_ref
def test_a_reshaped_nested_select_ref_is_resolved() -> None:
    wide = jax.ShapeDtypeStruct((8, 256), F32)
    assert verify(_nested_select(wait=True), wide, wide).waits == 2


@needs_select_ref
def test_a_reshaped_nested_select_ref_never_waited_is_caught() -> None:
    wide = jax.ShapeDtypeStruct((8, 256), F32)
    with pytest.raises(LeftoverSemaphoreError, match=HERE):
        verify(_nested_select(wait=False), wide, wide)


# ---------------------------------------------------------------- PRNG key operand


def _copy_keys(*, wait: bool) -> Any:
    """Copy an array of PRNG keys (an extended dtype) through VMEM."""

    def kernel(k_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(k_ref, buf, sem)
        copy.start()
        if wait:
            copy.wait()
        pltpu.sync_copy(buf, o_ref)

    def fn(keys: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(keys.shape, keys.dtype),
            scratch_shapes=[pltpu.VMEM(keys.shape, keys.dtype), pltpu.SemaphoreType.DMA],
        )(keys)

    return fn


def test_an_array_of_prng_keys_is_an_operand_without_host_values() -> None:
    keys = jax.random.split(jax.random.key(0), 8)
    assert verify(_copy_keys(wait=True), keys).dmas == 2


def test_a_prng_key_copy_read_before_its_wait_is_caught() -> None:
    keys = jax.random.split(jax.random.key(0), 8)
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_copy_keys(wait=False), keys)


# ------------------------------------------- a receive never waited before return


def _permute(*, wait_recv: bool, send: bool = True) -> Any:
    """Each of two devices sends its block to the other (after a handshake)."""

    def kernel(x_ref: Any, y_ref: Any, ready: Any, send_sem: Any, recv_sem: Any) -> None:
        other = 1 - jax.lax.axis_index("x")
        pl.semaphore_signal(ready, device_id=other, device_id_type=pl.DeviceIdType.LOGICAL)
        pl.semaphore_wait(ready)
        if not send:
            return
        copy = pltpu.make_async_remote_copy(
            x_ref, y_ref, send_sem, recv_sem, other, device_id_type=pl.DeviceIdType.LOGICAL
        )
        copy.start()
        copy.wait_send()
        if wait_recv:
            copy.wait_recv()

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.REGULAR] + [pltpu.SemaphoreType.DMA] * 2,
        )(x)

    return fn


def test_a_permute_that_waits_its_receive_is_clean() -> None:
    assert verify(_permute(wait_recv=True), X, mesh=abstract_mesh((2,), ("x",))).remote_dmas == 2


def test_a_receive_never_waited_is_reported_as_the_copy_landing_after_return() -> None:
    with pytest.raises(SignalAfterExitError, match=r"remote copy into y_ref.*" + HERE):
        verify(_permute(wait_recv=False), X, mesh=abstract_mesh((2,), ("x",)))


def test_an_output_nothing_writes_is_still_reported() -> None:
    with pytest.raises(UnwrittenReadError, match="y_ref"):
        verify(_permute(wait_recv=True, send=False), X, mesh=abstract_mesh((2,), ("x",)))


# ------------------------- a VMEM prefetch buffer handed on with one slot filled


def _prefetch_slot_zero(*, read_slot: int) -> Any:
    """A future fills slot 0 of a two-slot VMEM buffer; a third kernel reads one slot.

    The buffer is storage handed between kernels (a pipeline's prefetched window):
    its empty slot is not an error until something reads it.
    """

    def start_kernel(x_ref: Any, buf_ref: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_ref, buf_ref.at[0], sem).start()

    def done_kernel(x_ref: Any, buf_ref: Any, sem: Any, buf_alias: Any) -> None:
        del buf_alias
        pltpu.make_async_copy(x_ref, buf_ref.at[0], sem).wait()

    def use_kernel(buf_ref: Any, o_ref: Any) -> None:
        pltpu.sync_copy(buf_ref.at[read_slot], o_ref)

    def fn(x: Any) -> Any:
        buf, sem = pl.pallas_call(
            start_kernel,
            in_specs=[ANY],
            out_specs=(VMEM, SEM),
            out_shape=(pltpu.VMEM((2, *x.shape), x.dtype), pltpu.SemaphoreType.DMA(())),
        )(x)
        buf = pl.pallas_call(
            done_kernel,
            in_specs=[ANY, VMEM, SEM],
            out_specs=VMEM,
            out_shape=pltpu.VMEM((2, *x.shape), x.dtype),
            input_output_aliases={1: 0},
        )(x, buf, sem)
        return pl.pallas_call(
            use_kernel,
            in_specs=[VMEM],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(buf)

    return fn


def test_a_vmem_buffer_handed_on_with_an_empty_slot_is_clean() -> None:
    assert verify(_prefetch_slot_zero(read_slot=0), X).dmas == 2  # the future, sync_copy


def test_a_read_of_the_empty_slot_of_a_handed_on_buffer_is_caught() -> None:
    with pytest.raises(UnwrittenReadError, match=HERE):
        verify(_prefetch_slot_zero(read_slot=1), X)


# ------------------------------------------------ a copy of a region onto itself


def _self_copy(*, store_in_flight: bool) -> Any:
    """Copy rows 0:8 of a VMEM buffer onto themselves (what emit_pipeline with
    ``no_pipelining`` does with a VMEM operand that is its own window)."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        pltpu.sync_copy(x_ref, buf)
        copy = pltpu.make_async_copy(buf.at[0:8], buf.at[0:8], sem)
        copy.start()
        if store_in_flight:
            buf[0:8, :] = jnp.zeros((8, 128), F32)  # the copy may still read these rows
        copy.wait()
        pltpu.sync_copy(buf, o_ref)

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def test_a_copy_of_a_region_onto_itself_does_not_race_with_itself() -> None:
    wide = jax.ShapeDtypeStruct((16, 128), F32)
    assert verify(_self_copy(store_in_flight=False), wide).dmas == 3


def test_a_store_while_a_self_copy_is_in_flight_is_caught() -> None:
    wide = jax.ShapeDtypeStruct((16, 128), F32)
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_self_copy(store_in_flight=True), wide)


# ------------------------------------------------ run_state around stateful kernels


def _stateful_future(*, wait: bool) -> Any:
    """``pl.run_state`` makes refs of two arrays; one pallas_call, closing over them,
    starts a copy and returns its semaphore; a second one waits for it."""

    def fn(x: Any) -> Any:
        def body(refs: Any) -> None:
            x_ref, y_ref = refs

            def start_kernel(sem: Any) -> None:
                pltpu.make_async_copy(x_ref, y_ref, sem).start()

            def done_kernel(sem: Any) -> None:
                if wait:
                    pltpu.make_async_copy(x_ref, y_ref, sem).wait()

            sem = pl.pallas_call(
                start_kernel, out_shape=pltpu.SemaphoreType.DMA(()), out_specs=SEM
            )()
            pl.pallas_call(done_kernel, out_shape=(), in_specs=[SEM])(sem)

        _, y = pl.run_state(body)((x, jnp.zeros_like(x)))
        return y

    return fn


def test_a_stateful_future_inside_run_state_is_verified() -> None:
    assert verify(_stateful_future(wait=True), X).waits == 1


def test_a_stateful_future_never_waited_is_caught() -> None:
    with pytest.raises(LeftoverSemaphoreError, match=HERE):
        verify(_stateful_future(wait=False), X)


# ------------------------------------------------------------ pytree arguments


def _pair_copy(*, wait: bool) -> Any:
    """fn takes a pytree (a tuple of two arrays and a None), as jax.jit allows."""

    def kernel(a_ref: Any, b_ref: Any, o_ref: Any, sem: Any) -> None:
        del b_ref
        copy = pltpu.make_async_copy(a_ref, o_ref, sem)
        copy.start()
        if wait:
            copy.wait()

    def fn(pair: Any) -> Any:
        a, b, nothing = pair
        assert nothing is None
        return pl.pallas_call(
            kernel,
            in_specs=[ANY, ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(a, b)

    return fn


def test_pytree_arguments_are_verified_by_their_leaves() -> None:
    assert verify(_pair_copy(wait=True), (X, jnp.zeros((8, 128)), None)).dmas == 1


def test_pytree_arguments_with_a_dropped_wait_are_caught() -> None:
    with pytest.raises((LeftoverSemaphoreError, RaceDetectedError), match=HERE):
        verify(_pair_copy(wait=False), (X, jnp.zeros((8, 128)), None))
