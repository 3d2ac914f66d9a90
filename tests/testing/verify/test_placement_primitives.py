"""Placement primitives and higher-order primitives around kernels under verify.

``lax.optimization_barrier``, ``with_sharding_constraint`` and ``device_put`` outside the
kernels pass a DMA future's destination to its done kernel: each result is its operand,
for the walk and for what the program reads of a kernel output. Kernels inside
``jax.checkpoint`` / remat are run; under a primitive without a rule they are unsupported,
not skipped.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
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
