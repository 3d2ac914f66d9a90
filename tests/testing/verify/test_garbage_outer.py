"""Garbage a kernel leaves in its output, followed through the program around kernels.

A padded MoE (maxtext's grouped matmuls) has a kernel write only the real rows of a
padded output; ``silu`` runs on all rows, a second kernel reads the rows it needs and
the program slices the padding off. Verify used to report R6 at the first kernel's
return, because ``silu`` (any operation but a slice, transpose or reshape) counted as
reading all of the output. Now element-wise operations keep garbage in its rows,
layout operations move it, a later kernel gets it as unwritten parts of its input
buffer (its own rules judge what it does with them), and only uses that mix rows
(a contraction over the padded rows, a reduction) or the program's result read it.
docs/verify-model.md, rule 12.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify
from tests.support.source_lines import marker_line

F32 = jnp.float32
TM, M, REAL, K = 64, 256, 192, 128  # row tile, padded rows, real rows, width
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((M, K), F32)
W = jax.ShapeDtypeStruct((K, K), F32)


def gmm(x: jax.Array, w: jax.Array, tiles: int) -> jax.Array:
    """A grouped matmul reduced to its layout: row tiles ``0..tiles-1`` of a padded
    ``(M, K)`` output are computed; the rest is never visited (never written)."""

    def kernel(x_ref: Any, w_ref: Any, o_ref: Any) -> None:
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)

    out: jax.Array = pl.pallas_call(
        kernel,
        grid=(tiles,),
        in_specs=[
            pl.BlockSpec((TM, K), lambda i: (i, 0)),
            pl.BlockSpec((K, K), lambda i: (0, 0)),
        ],
        out_specs=pl.BlockSpec((TM, K), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, K), F32),
    )(x, w)
    return out


def shift(x: jax.Array, tiles: int) -> jax.Array:
    """An element-wise kernel (``x + 1``) over row tiles ``0..tiles-1``: garbage it
    loads is stored garbage (docs/verify-model.md, rule 12)."""

    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + 1.0

    out: jax.Array = pl.pallas_call(
        kernel,
        grid=(tiles,),
        in_specs=[pl.BlockSpec((TM, K), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((TM, K), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, K), F32),
    )(x)
    return out


def copy_rows(x: jax.Array, src: int, dst: int, n: int) -> jax.Array:
    """A DMA kernel: rows ``src:src+n`` of ``x`` into rows ``dst:dst+n`` of a new
    ``(M, K)`` output; its other rows are never written."""

    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(src, n)], o_ref.at[pl.ds(dst, n)], sem)
        copy.start()
        copy.wait()

    out: jax.Array = pl.pallas_call(
        kernel,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct((M, K), F32),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


def fill(prev: jax.Array, x: jax.Array, first: int, tiles: int, *, in_place: bool) -> jax.Array:
    """Row tiles ``first..first+tiles-1`` of ``prev`` (aliased to the output, in HBM
    or in blocks) computed from ``x``; the other rows keep what ``prev`` held."""

    def kernel(prev_ref: Any, x_ref: Any, o_ref: Any) -> None:
        del prev_ref
        o_ref[...] = x_ref[...] * 2.0

    rows = pl.BlockSpec((TM, K), lambda i: (i + first, 0))
    out: jax.Array = pl.pallas_call(
        kernel,
        grid=(tiles,),
        in_specs=[ANY if in_place else rows, rows],
        out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((M, K), F32),
        input_output_aliases={0: 0},
    )(prev, x)
    return out


# ---------------------------------------------------------------- padded MoE


@pytest.mark.parametrize("second_tiles", [REAL // TM, M // TM])
def test_padded_moe_slicing_the_padding_off_is_clean(second_tiles: int) -> None:
    """gmm writes the real rows, silu runs on all, the second gmm reads the real rows
    (or all of them: a contraction of garbage rows gives garbage rows, never read)."""

    def moe(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.nn.silu(gmm(x, w1, REAL // TM))
        return gmm(h, w2, second_tiles)[:REAL]

    assert verify(moe, X, W, W).invocations == 1


def test_padded_moe_with_kernels_back_to_back_is_clean() -> None:
    def moe(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        return gmm(gmm(x, w1, REAL // TM), w2, M // TM)[:REAL]

    assert verify(moe, X, W, W).invocations == 1


def test_padded_moe_returning_the_padding_is_reported() -> None:
    def moe(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.nn.silu(gmm(x, w1, REAL // TM))
        return gmm(h, w2, REAL // TM)  # the padding rows go out unwritten

    with pytest.raises(UnwrittenReadError, match=r"o_ref\[192:256, 0:128\]"):
        verify(moe, X, W, W)


MEGABLOX = "jax.experimental.pallas.ops.tpu.megablox.gmm"


@pytest.mark.slow
@pytest.mark.parametrize("sliced", [True, False])
def test_jax_megablox_padded_moe(sliced: bool) -> None:
    """jax's own grouped matmul in the padded MoE: 192 routed rows of 256 (groups
    64, 0, 64, 64), ``gmm -> silu -> gmm``. Slicing the padding off is clean (R6 before
    this rule); returning it is R6 for the rows no group covers."""
    gmm_ops = importlib.import_module(MEGABLOX)
    sizes = np.array([64, 0, 64, 64], np.int32)
    tiling = (TM, K, K)

    def moe(x: jax.Array, w1: jax.Array, w2: jax.Array, groups: jax.Array) -> jax.Array:
        h = jax.nn.silu(gmm_ops.gmm(x, w1, groups, tiling=tiling))
        y: jax.Array = gmm_ops.gmm(h, w2, groups, tiling=tiling)
        return y[:REAL] if sliced else y

    experts = jax.ShapeDtypeStruct((4, K, K), F32)
    if sliced:
        assert verify(moe, X, experts, experts, sizes).invocations == 1
        return
    with pytest.raises(UnwrittenReadError, match=r"nothing wrote out\[192:256, 0:128\]"):
        verify(moe, X, experts, experts, sizes)


@pytest.mark.parametrize("in_place", [True, False])
def test_an_aliased_output_that_fills_the_garbage_rows_is_clean(in_place: bool) -> None:
    """Group-sharded grouped matmuls: the first writes rows 0:128, the second (its
    output aliased to the first's, ``existing_out``) rows 128:256."""

    def program(x: jax.Array) -> jax.Array:
        return fill(jnp.exp(copy_rows(x, 0, 0, 128)), x, 2, 2, in_place=in_place)

    assert verify(program, X).dmas == 1


@pytest.mark.parametrize("in_place", [True, False])
def test_an_aliased_output_that_keeps_garbage_rows_is_reported(in_place: bool) -> None:
    def program(x: jax.Array) -> jax.Array:
        return fill(jnp.exp(copy_rows(x, 0, 0, 128)), x, 2, 1, in_place=in_place)

    # in place, the output is the aliased input's memory (named prev_ref)
    with pytest.raises(UnwrittenReadError) as err:
        verify(program, X)
    text = str(err.value)
    assert re.search(r"nothing wrote (o_ref|prev_ref)\[192:256, 0:128\]", text), text
    assert "passed on by exp at" in text, text


@pytest.mark.slow
@pytest.mark.parametrize("both", [True, False])
def test_jax_megablox_group_shards_into_one_output(both: bool) -> None:
    """jax's grouped matmul sharded by groups: ``group_offset=0`` writes the first two
    groups' rows, ``group_offset=2`` with ``existing_out`` the other two (R6 before
    this rule: the aliased input counted as a read of all of it)."""
    gmm_ops = importlib.import_module(MEGABLOX)
    sizes = np.array([64, 64, 64, 64], np.int32)
    tiling = (TM, K, K)

    def program(x: jax.Array, wa: jax.Array, wb: jax.Array, groups: jax.Array) -> jax.Array:
        zero, two = jnp.array(0, jnp.int32), jnp.array(2, jnp.int32)
        out: jax.Array = gmm_ops.gmm(x, wa, groups, tiling=tiling, group_offset=zero)
        if both:
            out = gmm_ops.gmm(x, wb, groups, tiling=tiling, group_offset=two, existing_out=out)
        return out

    shard = jax.ShapeDtypeStruct((2, K, K), F32)
    if both:
        assert verify(program, X, shard, shard, sizes).invocations == 1
        return
    with pytest.raises(UnwrittenReadError, match=r"nothing wrote out\[128:256, 0:128\]"):
        verify(program, X, shard, shard, sizes)


# ---------------------------------------------------------------- element-wise chains

CHAINS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "unary": lambda o: jnp.exp(o)[:REAL],
    "binary": lambda o: (o * 2.0 + o)[:REAL],
    "cast": lambda o: o.astype(jnp.bfloat16)[:REAL].astype(F32),
    "where": lambda o: jnp.where(o > 0, o, 0.0)[:REAL],
    "jit": lambda o: jax.jit(lambda v: jnp.tanh(v) - 1.0)(o)[:REAL],
    "transpose": lambda o: (o.T * 2.0).T[:REAL],
    "reshape": lambda o: jnp.sin(o.reshape(M // 2, 2 * K))[: REAL // 2],
    "two slices": lambda o: jnp.concatenate([(o + 1.0)[:64], jnp.abs(o)[128:REAL]]),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_an_element_wise_chain_keeps_garbage_in_its_rows(name: str) -> None:
    def program(x: jax.Array) -> jax.Array:
        return CHAINS[name](copy_rows(x, 0, 0, REAL))

    assert verify(program, X).dmas == 1


@pytest.mark.parametrize("name", ["unary", "jit", "transpose", "reshape"])
def test_an_element_wise_chain_that_keeps_a_garbage_row_is_reported(name: str) -> None:
    """The same chains with one garbage row more in the kernel's output."""

    def program(x: jax.Array) -> jax.Array:
        return CHAINS[name](copy_rows(x, 0, 0, REAL - 2))

    with pytest.raises(UnwrittenReadError, match=r"nothing wrote o_ref\[190:19[12]"):
        verify(program, X)


# ---------------------------------------------------------------- uses that mix rows


def _mixing(use: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    def program(x: jax.Array) -> jax.Array:
        return use(jnp.exp(copy_rows(x, 0, 0, REAL)))

    return program


def test_a_contraction_over_the_padded_rows_reads_the_garbage() -> None:
    program = _mixing(lambda h: h.T @ h)  # MIX-CONTRACTION
    with pytest.raises(UnwrittenReadError) as err:
        verify(program, X)
    text = str(err.value)
    line = marker_line(__file__, "MIX-CONTRACTION")
    assert "nothing wrote o_ref[192:256, 0:128]" in text, text
    assert f"read by dot_general at {__file__}:{line}" in text, text


def test_a_reduction_over_the_padded_rows_reads_the_garbage() -> None:
    program = _mixing(lambda h: jnp.max(h, axis=0))  # MIX-REDUCTION
    with pytest.raises(UnwrittenReadError) as err:
        verify(program, X)
    line = marker_line(__file__, "MIX-REDUCTION")
    assert f"read by reduce_max at {__file__}:{line}" in str(err.value), str(err.value)


def test_a_contraction_over_the_real_rows_only_is_clean() -> None:
    assert verify(_mixing(lambda h: h[:REAL].T @ h[:REAL]), X).dmas == 1


ROW_KEEPING: dict[str, Callable[[jax.Array], jax.Array]] = {
    "contraction over columns": lambda h: (h @ h[:K].T)[:REAL],
    "batched contraction": lambda h: jnp.einsum("rik,rjk->rij", h[:, None], h[:, None])[:REAL],
    "reduction over columns": lambda h: jnp.sum(h, axis=1)[:REAL],
    "argmax over columns": lambda h: jnp.argmax(h, axis=-1)[:REAL],
    "broadcast": lambda h: jnp.broadcast_to(h[:, None, :], (M, 2, K))[:REAL],
    "squeeze": lambda h: jnp.squeeze(h[:, None, :], axis=1)[:REAL],
}


@pytest.mark.parametrize("name", list(ROW_KEEPING))
def test_a_use_that_keeps_rows_apart_keeps_garbage_in_its_rows(name: str) -> None:
    """A contraction or reduction over other dimensions than the padded rows: each
    result row reads one row of the output, so the garbage rows stay garbage rows."""
    assert verify(_mixing(ROW_KEEPING[name]), X).dmas == 1


def test_a_row_keeping_result_that_keeps_the_garbage_rows_is_reported() -> None:
    program = _mixing(lambda h: h @ h[:K].T)
    with pytest.raises(UnwrittenReadError, match=r"nothing wrote o_ref\[192:256, 0:128\]"):
        verify(program, X)


def test_an_xla_matmul_between_two_kernels_carries_the_garbage_rows() -> None:
    def twin(src: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
        def program(x: jax.Array, w: jax.Array) -> jax.Array:
            h = jax.nn.silu(gmm(x, w, REAL // TM)) @ w  # rows 192:256 stay garbage
            return copy_rows(h, src, 0, 128)[:128]

        return program

    assert verify(twin(0), X, W).dmas == 1
    with pytest.raises(UnwrittenReadError, match=r"nothing wrote o_ref\[64:128, 0:128\]"):
        verify(twin(128), X, W)  # copies rows 192:256 of h into rows 64:128


def _ragged(x: jax.Array, real: int) -> jax.Array:
    """A (200, K) array whose rows ``real:`` a kernel never writes, then the element-wise
    kernel over 64-row blocks: the last block (rows 192:200) is partial."""

    def first(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(0, real)], o_ref.at[pl.ds(0, real)], sem)
        copy.start()
        copy.wait()

    h: jax.Array = pl.pallas_call(
        first,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct((200, K), F32),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)

    def add(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + 1.0

    out: jax.Array = pl.pallas_call(
        add,
        grid=(4,),
        in_specs=[pl.BlockSpec((TM, K), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((TM, K), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((200, K), F32),
    )(jnp.exp(h))
    return out


@pytest.mark.parametrize("real", [192, 196])
def test_garbage_in_a_partial_last_block_sliced_off_is_clean(real: int) -> None:
    """Garbage rows ``real:200`` reach the second kernel's partial last block (rows
    192:200 of a 64-row block); the program slices them off."""
    x = jax.ShapeDtypeStruct((200, K), F32)
    assert verify(lambda v: _ragged(v, real)[:real], x).dmas == 1


def test_a_partial_last_block_of_garbage_returned_is_reported() -> None:
    """All of the last block's rows are garbage: the kernel stores garbage into the
    output rows the program returns."""
    x = jax.ShapeDtypeStruct((200, K), F32)
    with pytest.raises(UnwrittenReadError) as err:
        verify(lambda v: _ragged(v, 192), x)
    assert "the pipeline copies out" in str(err.value), str(err.value)


def test_garbage_into_a_kernels_control_data_is_a_read() -> None:
    """A kernel output passed on as another kernel's scalar-prefetch operand steers
    that kernel (its index maps, its control flow): all of it is read."""

    def indices(x: jax.Array) -> jax.Array:
        def kernel(x_ref: Any, o_ref: Any) -> None:
            o_ref[0:4] = x_ref[0:4]  # o_ref[4:8] stays garbage

        out: jax.Array = pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM)],
            out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
            out_shape=jax.ShapeDtypeStruct((8,), jnp.int32),
        )(x)
        return out

    def program(x: jax.Array, y: jax.Array) -> jax.Array:
        idx = indices(x) + 0

        def kernel(idx_ref: Any, y_ref: Any, o_ref: Any) -> None:
            o_ref[...] = y_ref[...]

        out: jax.Array = pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(1,),
                in_specs=[pl.BlockSpec((8, K), lambda i, idx: (0, 0))],
                out_specs=pl.BlockSpec((8, K), lambda i, idx: (0, 0)),
            ),
            out_shape=jax.ShapeDtypeStruct((8, K), F32),
        )(idx, y)
        return out

    with pytest.raises(UnwrittenReadError, match=r"nothing wrote o_ref\[4:8\]"):
        verify(program, jax.ShapeDtypeStruct((8,), jnp.int32), jax.ShapeDtypeStruct((8, K), F32))


# ---------------------------------------------------------------- inside a later kernel


def test_a_later_kernel_that_copies_garbage_rows_into_what_is_read_is_reported() -> None:
    def program(x: jax.Array) -> jax.Array:
        h = jax.nn.silu(copy_rows(x, 0, 0, REAL))  # FIRST-COPY
        return copy_rows(h, 128, 0, 128)[:128]  # rows 192:256 of h are garbage

    with pytest.raises(UnwrittenReadError) as err:
        verify(program, X)
    text = str(err.value)
    assert "o_ref[64:128, 0:128]" in text, text
    # the fix names where the garbage began: the first kernel's output
    first = marker_line(__file__, "FIRST-COPY")
    assert f"Fix: write o_ref of kernel kernel at {__file__}:" in text, text
    assert f"(copy_rows, called at test_garbage_outer.py:{first} in" in text, text


def test_a_later_kernel_that_copies_only_written_rows_is_clean() -> None:
    def program(x: jax.Array) -> jax.Array:
        h = jax.nn.silu(copy_rows(x, 0, 0, REAL))
        return copy_rows(h, 64, 0, 128)[:128]

    assert verify(program, X).dmas == 2


def test_a_later_kernel_that_stores_loaded_garbage_where_it_is_read_is_reported() -> None:
    def program(x: jax.Array, w: jax.Array) -> jax.Array:
        h = jax.nn.silu(gmm(x, w, REAL // TM))  # SILU
        return shift(h, M // TM)  # tile 3 loads garbage and stores it; all is returned

    with pytest.raises(UnwrittenReadError) as err:
        verify(program, X, W)
    text = str(err.value)
    assert "the pipeline copies out" in text, text
    # the note says where the garbage left the first kernel and which line passed it on
    silu = marker_line(__file__, "# SILU")
    assert re.search(rf"passed on by \w+ at {re.escape(__file__)}:{silu} ", text), text
    assert "Fix: write o_ref of kernel kernel at" in text, text


def test_a_later_kernel_that_stores_loaded_garbage_where_nothing_reads_it_is_clean() -> None:
    def program(x: jax.Array, w: jax.Array) -> jax.Array:
        h = jax.nn.silu(gmm(x, w, REAL // TM))
        return shift(h, M // TM)[:REAL]

    assert verify(program, X, W).invocations == 1
