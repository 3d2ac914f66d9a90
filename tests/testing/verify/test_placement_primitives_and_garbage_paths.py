"""Correct programs verify once rejected (a future through a placement primitive, padding
and garbage through loads and stores), each with
a seeded twin that is still caught.

* Placement primitives (``lax.optimization_barrier``, ``with_sharding_constraint``,
  ``device_put``) outside the kernels: docs/verify-model.md says a DMA future's destination
  passes through them to its done kernel, but the verifier evaluated them like any
  XLA operation, so the array lost its buffer and the semaphore its identity: a
  done kernel behind a barrier waited a fresh semaphore (a false deadlock), and a
  kernel output whose padding rows the program slices off after a barrier counted
  as read in full (a false R6). Each result is now its operand, for the walk and for
  what the program reads of a kernel output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import (
    RaceDetectedError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    verify,
)
from tests.corpus.futures import copy_done, copy_start
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((16, 128), F32)
CPU = jax.devices("cpu")[0]

PLACEMENTS: dict[str, Callable[[Any], Any]] = {
    "optimization_barrier": lax.optimization_barrier,
    "sharding_constraint": lambda t: jax.tree.map(
        lambda a: lax.with_sharding_constraint(a, jax.sharding.SingleDeviceSharding(CPU)), t
    ),
    "device_put": lambda t: jax.tree.map(jax.device_put, t),
}


def _future_behind(place: Callable[[Any], Any], *, read: bool) -> Callable[[Any], Any]:
    """A DMA future (start kernel, done kernel: jax's async-copy pattern) whose
    source and future pass through a placement primitive between the two kernels."""

    def fn(x: jax.Array) -> Any:
        x, fut = copy_start(x)
        x, fut = place((x, fut))
        if read:
            early = jnp.sum(fut[0])  # the early read
            return copy_done(x, fut), early
        return copy_done(x, fut)

    return fn


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_a_future_through_a_placement_primitive_verifies_clean(name: str) -> None:
    report = verify(_future_behind(PLACEMENTS[name], read=False), X)
    assert len(report.kernels) == 2 and report.dmas == 1


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_reading_the_future_after_the_placement_is_still_a_race(name: str) -> None:
    with pytest.raises(RaceDetectedError) as caught:
        verify(_future_behind(PLACEMENTS[name], read=True), X)
    text = str(caught.value)
    assert f"{__file__}:{marker_line(__file__, '# the early read')}" in text, text
    assert "reduce_sum" in text and "DMA future" in text, text


def _first_half_kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref.at[0:8], o_ref.at[0:8], sem)  # rows 0:8 only
    copy.start()
    copy.wait()


def _first_half(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        _first_half_kernel,
        out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_padding_dropped_after_a_placement_primitive_is_not_read(name: str) -> None:
    place = PLACEMENTS[name]
    assert verify(lambda x: place(_first_half(x))[:8] * 2, X).dmas == 1


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_padding_read_after_a_placement_primitive_is_r6(name: str) -> None:
    place = PLACEMENTS[name]
    with pytest.raises(UnwrittenReadError) as caught:
        verify(lambda x: place(_first_half(x))[4:12] * 2, X)
    text = str(caught.value)
    assert "R6" in text and "nothing wrote o_ref[8:12, 0:128]" in text, text


# * An XLA operation that overwrites part of a kernel output (``out.at[8:].set(0)``:
#   a scatter, or ``lax.dynamic_update_slice`` with constant starts) read all of it,
#   so a wrapper that zeroes the padding rows a kernel leaves unwritten was a false
#   R6. The window it overwrites is not read (docs/verify.md, Limits).
OVERWRITES: dict[str, Callable[[Any, int], Any]] = {
    "at_set": lambda out, row: out.at[row:].set(0.0),
    "at_set_update": lambda out, row: out.at[row:, :].set(jnp.ones((16 - row, 128), F32)),
    "dynamic_update_slice": lambda out, row: lax.dynamic_update_slice(
        out, jnp.zeros((16 - row, 128), F32), (row, 0)
    ),
}


@pytest.mark.parametrize("name", sorted(OVERWRITES))
def test_padding_overwritten_outside_the_kernel_is_not_read(name: str) -> None:
    overwrite = OVERWRITES[name]
    assert verify(lambda x: overwrite(_first_half(x), 8) * 2, X).dmas == 1


@pytest.mark.parametrize("name", sorted(OVERWRITES))
def test_padding_left_by_the_overwrite_is_still_r6(name: str) -> None:
    overwrite = OVERWRITES[name]
    with pytest.raises(UnwrittenReadError) as caught:
        verify(lambda x: overwrite(_first_half(x), 10) * 2, X)
    text = str(caught.value)
    assert "R6" in text and "nothing wrote o_ref[8:10, 0:128]" in text, text


def test_an_overwrite_at_a_start_not_known_reads_the_whole_output() -> None:
    """The window of ``dynamic_update_slice`` at a traced start is not known: the
    rest of the output counts as read (the documented bound)."""

    def fn(x: jax.Array, row: jax.Array) -> jax.Array:
        return lax.dynamic_update_slice(_first_half(x), jnp.zeros((8, 128), F32), (row, 0))

    with pytest.raises(UnwrittenReadError, match="R6"):
        verify(fn, X, jax.ShapeDtypeStruct((), jnp.int32))


# * Misses of the garbage rule (docs/verify-model.md, rule 12): ``pltpu.load`` and
#   ``pltpu.store`` (``pl.store``) bind masked_load / masked_swap, which were never
#   followed, nor were ``pltpu.roll`` and ``pltpu.bitcast``; without a mask they move
#   every element like ``ref[...]``. A masked one is still not followed: only some
#   elements move, and the masked ones are the kernel's padding.
I32 = jnp.int32
GARBAGE_PATHS: dict[str, Callable[[Any, Any], None]] = {
    "pltpu.load": lambda scratch, o_ref: o_ref.__setitem__(..., pltpu.load(scratch) + 1),
    "pltpu.store": lambda scratch, o_ref: pltpu.store(o_ref, scratch[...] + 1),
    "pltpu.roll": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.roll(scratch[...], shift=3, axis=1)
    ),
    "pltpu.bitcast": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.bitcast(pltpu.bitcast(scratch[...], I32), F32)
    ),
}
MASKED_PATHS: dict[str, Callable[[Any, Any], None]] = {
    "pltpu.load(mask)": lambda scratch, o_ref: o_ref.__setitem__(
        ..., pltpu.load(scratch, mask=lax.broadcasted_iota(I32, (8, 128), 0) < 0)
    ),
    "pltpu.store(mask)": lambda scratch, o_ref: (
        o_ref.__setitem__(..., jnp.zeros((8, 128), F32)),
        pltpu.store(o_ref, scratch[...], mask=lax.broadcasted_iota(I32, (8, 128), 0) < 0),
    ),
}


def _scratch_to_output(path: Callable[[Any, Any], None], *, write: bool) -> Callable[[Any], Any]:
    def kernel(x_ref: Any, o_ref: Any, scratch: Any) -> None:
        if write:
            scratch[...] = x_ref[...]
        path(scratch, o_ref)  # the garbage path

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch_shapes=[pltpu.VMEM((8, 128), F32)],
        )(x)
        return out

    return fn


SMALL = jax.ShapeDtypeStruct((8, 128), F32)


@pytest.mark.parametrize("name", sorted(GARBAGE_PATHS))
def test_garbage_through_load_store_roll_bitcast_is_r6(name: str) -> None:
    with pytest.raises(UnwrittenReadError) as caught:
        verify(_scratch_to_output(GARBAGE_PATHS[name], write=False), SMALL)
    text = str(caught.value)
    assert "R6" in text and "scratch" in text, text
    assert (
        f"called at test_placement_primitives_and_garbage_paths.py:{marker_line(__file__, '# the garbage path')}"
        in text
    ), text


@pytest.mark.parametrize("name", sorted(GARBAGE_PATHS))
def test_the_same_paths_from_written_scratch_are_clean(name: str) -> None:
    assert verify(_scratch_to_output(GARBAGE_PATHS[name], write=True), SMALL).kernels


@pytest.mark.parametrize("name", sorted(MASKED_PATHS))
def test_masked_loads_and_stores_are_not_followed(name: str) -> None:
    assert verify(_scratch_to_output(MASKED_PATHS[name], write=False), SMALL).kernels


# * ``jax.checkpoint`` / ``jax.remat`` bind the primitive ``remat2`` (jax 0.10 and
#   0.12); the verifier's call table named only ``remat`` and ``checkpoint``, so the
#   kernels inside a checkpointed function were never run (a future never waited
#   there verified clean, with no copy counted), and a future passed into one read
#   as an XLA operation (a false race). Its body now runs like a nested jit's.
def test_a_future_waited_inside_jax_checkpoint_verifies_clean() -> None:
    def fn(x: jax.Array) -> jax.Array:
        x, fut = copy_start(x)
        done: jax.Array = jax.checkpoint(copy_done)(x, fut)
        return done

    report = verify(fn, X)
    assert len(report.kernels) == 2 and report.dmas == 1


def test_a_future_never_waited_inside_jax_checkpoint_is_caught() -> None:
    def fn(x: jax.Array) -> jax.Array:
        x, fut = copy_start(x)
        done: jax.Array = jax.checkpoint(lambda a, f: copy_done(a, f, wait=False))(x, fut)
        return done

    with pytest.raises(RaceDetectedError) as caught:
        verify(fn, X)
    assert "_done_without_wait_kernel" in str(caught.value), caught.value


def test_kernels_inside_jax_remat_are_run() -> None:
    """The R6 of an output whose padding the program reads is found inside a remat."""
    with pytest.raises(UnwrittenReadError, match="R6"):
        verify(jax.remat(lambda x: _first_half(x) * 2), X)
    assert verify(jax.remat(lambda x: _first_half(x)[:8] * 2), X).dmas == 1


def test_kernels_under_a_primitive_without_a_rule_are_unsupported_not_skipped() -> None:
    """The general form of the remat2 miss: a primitive the verifier has no rule for
    (here ``custom_vmap_call``) whose body calls kernels was evaluated as an XLA
    operation, its kernels never run. It now says so, naming the primitive and line."""
    from jax.custom_batching import custom_vmap

    def start_and_forget(x: jax.Array) -> jax.Array:
        x, fut = copy_start(x)
        done: jax.Array = copy_done(x, fut, wait=False)
        return done

    batched = custom_vmap(start_and_forget)
    batched.def_vmap(lambda size, batched_in, x: (start_and_forget(x), True))
    with pytest.raises(VerificationUnsupportedError) as caught:
        verify(lambda x: batched(x), X)  # the custom_vmap call
    text = str(caught.value)
    assert "'custom_vmap_call'" in text and "simulate" in text, text
    assert f"{__file__}:{marker_line(__file__, '# the custom_vmap call')}" in text, text


# * Buffer names in messages: a kernel whose parameters are pytrees (megablox gmm's
#   ``group_metadata`` tuple, its ``existing_out=None`` that has no operand) was named
#   from its ``def`` line, one name per parameter, so every later operand took its
#   neighbour's name (gmm's output was called ``acc_scratch``). jax's own names of the
#   operands (``group_metadata[0]``, ...) are kept unless they are a forwarded *args.
def _pair_kernel(pair: Any, o_ref: Any, sem: Any) -> None:
    first, _ = pair
    copy = pltpu.make_async_copy(first.at[0:8], o_ref.at[0:8], sem)  # rows 0:8 only
    copy.start()
    copy.wait()


def test_operands_of_pytree_parameters_keep_their_names() -> None:
    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            _pair_kernel,
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            in_specs=[(ANY, ANY)],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )((x, x))
        return out

    with pytest.raises(UnwrittenReadError) as caught:
        verify(fn, X)
    text = str(caught.value)
    assert "nothing wrote o_ref[8:16, 0:128]" in text, text
