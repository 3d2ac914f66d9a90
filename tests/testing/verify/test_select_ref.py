"""``pl.select_ref`` under verify: each iteration's copy source and semaphore are the refs it
picks, past its last ref (the last one), nested and reshaped.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, verify

F32 = jnp.float32
HERE = r"test_select_ref\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((8, 128), F32)


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
