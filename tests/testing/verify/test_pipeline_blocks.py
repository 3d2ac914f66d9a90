"""Pallas's pipeline: output blocks visited again, and blocks outside their array.

An output block visited again after the pipeline copied it out:
Pallas keeps an output block in VMEM only while consecutive grid points map to
it (jax's ``RevisitMode`` docs); a later visit starts from undefined contents and
its copy-out overwrites what the earlier visits wrote. jax's interpret mode raises
"Revisited block"; ``verify`` reports it with the grid points and the fix, and
keeps jax's exemption of outputs aliased to an input. A BlockSpec asking for
``RevisitMode.ANY`` (Mosaic restores the block with extra DMAs) is accepted by
verify; interpret mode ignores that mode and still raises (pinned below).

A block index whose block starts outside its array (an input or an output): the
pipeline would copy memory that is not the array's; a partial block at the end is
fine (Pallas pads it). Interpret mode raises "Out-of-bounds block index"; verify
raises ``OutOfBoundsDmaError`` naming the operand, the grid point and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    KernelFailedError,
    OutOfBoundsDmaError,
    abstract_mesh,
    simulate,
    verify,
)
from tests.support.source_lines import marker_line

_ROWS, _COLS = 16, 256
_BLOCK = (8, 128)


def _copy_block(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


def _call(
    index_map: Callable[[Any, Any], tuple[Any, Any]],
    pipeline_mode: Any = None,
    alias: bool = False,
) -> Callable[[jax.Array], jax.Array]:
    """A (2, 4) grid copying one input block into the output block ``index_map`` names."""
    extra = {} if pipeline_mode is None else {"pipeline_mode": pipeline_mode}

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(  # the line every message names
            _copy_block,
            out_shape=jax.ShapeDtypeStruct((_ROWS, _COLS), jnp.float32),
            grid=(2, 4),
            in_specs=[pl.BlockSpec(_BLOCK, lambda i, j: (0, 0))],
            out_specs=pl.BlockSpec(_BLOCK, index_map, **extra),
            input_output_aliases={0: 0} if alias else {},
        )(x)
        return out

    return fn


_CALL_LINE = marker_line(__file__, "# the line every message names")
_X = jnp.zeros((_ROWS, _COLS), jnp.float32)


def _revisiting(i: Any, j: Any) -> tuple[Any, Any]:
    return j % 2, i  # (0, 0), (1, 0), (0, 0) again at grid point (0, 2)


def test_a_revisited_output_block_is_reported_with_its_grid_points_and_the_fix() -> None:
    with pytest.raises(KernelFailedError) as caught:
        verify(_call(_revisiting), _X)
    msg = str(caught.value)
    assert f"test_pipeline_blocks.py:{_CALL_LINE}" in msg
    assert "grid point (0, 2) revisits block [0:8, 0:128] of output o_ref" in msg
    assert "copied out after grid points (0, 0) through (0, 0)" in msg
    assert "revisit=pl.RevisitMode.ANY" in msg and "consecutive" in msg


def test_simulate_agrees_on_the_revisit() -> None:
    with pytest.raises(KernelFailedError, match="Revisited block"):
        simulate(_call(_revisiting), _X)


def test_consecutive_visits_of_each_block_are_clean() -> None:
    # the last grid dimension is ignored by the index map: each block's visits are
    # consecutive (the accumulator pattern)
    def rows_then_steps(i: Any, j: Any) -> tuple[Any, Any]:
        return i, 0

    fn = _call(rows_then_steps)

    def whole(x: jax.Array) -> jax.Array:
        return fn(x)[:, :128]

    assert verify(whole, _X).devices == 1
    simulate(whole, _X)


def test_an_output_aliased_to_an_input_may_be_revisited() -> None:
    # jax's interpret mode exempts aliased outputs; so does verify
    verify(_call(_revisiting, alias=True), _X)
    simulate(_call(_revisiting, alias=True), _X)


def test_revisit_mode_any_is_accepted_where_interpret_mode_still_raises() -> None:
    mode = pl.Buffered(1, revisit=pl.RevisitMode.ANY)
    verify(_call(_revisiting, pipeline_mode=mode), _X)
    # interpret mode does not read pipeline_mode (jax 0.10.2 and 0.12): a known
    # disagreement in which verify follows Mosaic's lowering (revisit_mode<any>)
    with pytest.raises(KernelFailedError, match="Revisited block"):
        simulate(_call(_revisiting, pipeline_mode=mode), _X)


def test_the_message_names_the_device_on_a_mesh() -> None:
    def per_device(x: jax.Array) -> jax.Array:
        return _call(_revisiting)(x)

    with pytest.raises(KernelFailedError) as caught:
        verify(
            per_device,
            jnp.zeros((2 * _ROWS, _COLS), jnp.float32),
            mesh=abstract_mesh((2,), ("x",)),
            in_specs=P("x"),
            out_specs=P("x"),
        )
    msg = str(caught.value)
    assert f"test_pipeline_blocks.py:{_CALL_LINE}" in msg
    assert (
        "(_call.<locals>.fn, called at test_pipeline_blocks.py:" in msg
    )  # and the shard_map'd caller
    assert " on device 1 (x=1): grid point (0, 2) revisits block" in msg


def _shifted(rows: int, in_shift: int, out_shift: int) -> Callable[[jax.Array], jax.Array]:
    """A (4,) grid of 4-row blocks, each index map shifted by a number of blocks."""

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            _copy_block,
            out_shape=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
            grid=(4,),
            in_specs=[pl.BlockSpec((4, 128), lambda i: (i + in_shift, 0))],
            out_specs=pl.BlockSpec((4, 128), lambda i: (i + out_shift, 0)),
        )(x)
        return out

    return fn


def test_a_partial_block_at_the_end_is_clean() -> None:
    x = jnp.zeros((14, 128), jnp.float32)  # the last 4-row block holds 2 rows
    assert verify(_shifted(14, 0, 0), x).devices == 1
    simulate(_shifted(14, 0, 0), x)


@pytest.mark.parametrize(
    ("rows", "in_shift", "out_shift", "role", "point", "index"),
    [
        (16, 1, 0, "input x_ref", "(3,)", "(4, 0)"),
        (14, 1, 0, "input x_ref", "(3,)", "(4, 0)"),
        (16, 0, 2, "output o_ref", "(2,)", "(4, 0)"),
        (16, -1, 0, "input x_ref", "(0,)", "(-1, 0)"),
    ],
)
def test_a_block_outside_its_array_is_reported(
    rows: int, in_shift: int, out_shift: int, role: str, point: str, index: str
) -> None:
    x = jnp.zeros((rows, 128), jnp.float32)
    with pytest.raises(OutOfBoundsDmaError) as caught:
        verify(_shifted(rows, in_shift, out_shift), x)
    msg = str(caught.value)
    assert f"at grid point {point} the index map of {role} gives block index {index}" in msg
    assert "test_pipeline_blocks.py" in msg and "jnp.minimum" in msg
    if in_shift >= 0:
        # interpret mode agrees (a negative block index makes it fail differently)
        with pytest.raises(KernelFailedError, match="Out-of-bounds block index"):
            simulate(_shifted(rows, in_shift, out_shift), x)
