"""Patterns of kernels from other authors that verify had never seen (session 6).

docs/verify.md, "Kernels from other authors (session 6)", lists the kernels and
verdicts. Each kernel here is written for this file in raw pltpu and reproduces
one construct that made verify raise a false alarm or an unclear message; each
correct one must verify clean and each seeded mistake must still be caught,
naming this file's line.

* an output block whose index map reads a scalar-prefetch table (a ragged kernel
  maps each logical tile to its physical output block through it) and that the
  kernel writes only at the last step on that block: Pallas copies the block out
  only when the index map's answer changes, which verify must compute with the
  table, not treat as "changes every step"; and an output block the kernel does not
  write at its step is garbage even if it wrote the previous block;
* a sparse grid whose output index map skips some blocks (jax's block-sparse
  guide): the blocks never copied out are garbage unless the output is aliased to
  an input (the guide aliases a zeros array for this reason);
* a race between an ``emit_pipeline``'s own copy-out and a copy of the user's
  (maxtext's grouped matmul zero-fills the rows the pipeline does not write):
  jax wraps the pipeline's functions in ``jax.named_scope``, whose frame is
  Python's ``contextlib``; the message names the user's line, never the stdlib;
* a cross-step prefetch chain in a grid whose first dimension is "parallel"
  (axlearn's paged attention in megacore mode, grid ``(num_cores, ...)``): verify
  runs the grid in order on one core, where a chain started only at the very first
  step deadlocks; the deadlock says that a megacore split is not modelled;
* a start/wait split (google-deepmind/simply's ragged all-to-all): the start call
  returns its semaphores with the copies in flight, and a wait call that forgets
  a wait returns the output while a copy still writes it: the race names the
  wait call's line, not only the kernel's name;
* several kernels with one name (every ``emit_pipeline`` body is ``wrapped``): the
  report counts and names each by its line.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import DeadlockError, RaceDetectedError, UnwrittenReadError, verify

F32 = jnp.float32
HERE = r"test_heldout_s6\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------------- an output block picked through a prefetch table


def _tiled_sum(write_last: bool) -> Any:
    """Sum the kv blocks of each logical tile into the output tile the table names.

    Grid (logical tile, kv block); ``tile_of[t]`` is the physical output tile of
    logical tile t (two logical tiles share tile 0). The output is written once,
    at the last kv block of the last logical tile on it, from a VMEM accumulator:
    the ragged paged attention layout (torch_xla, megablox metadata).
    """

    def kernel(tile_of: Any, x_ref: Any, o_ref: Any, acc: Any) -> None:
        t, k = pl.program_id(0), pl.program_id(1)
        nt, nk = pl.num_programs(0), pl.num_programs(1)

        @pl.when(k == 0)
        def _() -> None:
            acc[...] = jnp.zeros_like(acc)

        acc[...] += x_ref[...]
        nxt = jnp.minimum(t + 1, nt - 1)
        leaving = jnp.logical_or(t == nt - 1, tile_of[t] != tile_of[nxt])

        @pl.when(jnp.logical_and(k == nk - 1, leaving if write_last else t == 0))
        def _() -> None:
            o_ref[...] = acc[...]

    def fn(tile_of: Any, x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(3, 2),
                in_specs=[pl.BlockSpec((8, 128), lambda t, k, tile_of: (t, k))],
                out_specs=pl.BlockSpec((8, 128), lambda t, k, tile_of: (tile_of[t], 0)),
                scratch_shapes=[pltpu.VMEM((8, 128), F32)],
            ),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        )(tile_of, x)

    return fn


TILE_OF = np.array([0, 0, 1], np.int32)


def test_output_block_from_a_prefetch_table_written_at_its_last_step_is_clean() -> None:
    assert verify(_tiled_sum(write_last=True), TILE_OF, _s(24, 256)) is not None


def test_output_block_from_a_prefetch_table_never_written_is_caught() -> None:
    # tile 1 (logical tile 2) is never written: its copy-out is garbage
    with pytest.raises(UnwrittenReadError, match=r"o_ref\[8:16, 0:128\]|o_ref\[0:8, 0:128\]"):
        verify(_tiled_sum(write_last=False), TILE_OF, _s(24, 256))


# ------------------------------------------------ kernels that share one name


def _double(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2


def test_kernels_with_one_name_are_each_listed_by_line() -> None:
    def fn(x: Any) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        y = pl.pallas_call(_double, out_shape=out)(x)
        return pl.pallas_call(_double, out_shape=out)(y)

    report = verify(fn, _s(8, 128))
    assert len(report.kernels) == 2
    assert all(k.startswith("_double (") and "test_heldout_s6.py:" in k for k in report.kernels)


def test_one_kernel_called_twice_from_one_line_is_listed_once() -> None:
    def fn(x: Any) -> Any:
        for _ in range(2):
            x = pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return x

    assert verify(fn, _s(8, 128)).kernels == ("_double",)


# ------------------------------- emit_pipeline copy-out racing a zero-fill copy


def _zero_fill_then_pipeline(first_row_block: int) -> Any:
    """Zero rows [0:16) of the output with a DMA from a VMEM zero tile while an
    emit_pipeline writes row blocks ``first_row_block``.. of it; wait at the end."""

    def kernel(x_hbm: Any, o_hbm: Any, zeros: Any, sem: Any) -> None:
        zeros[...] = jnp.zeros_like(zeros)
        fill = pltpu.make_async_copy(zeros, o_hbm.at[pl.ds(0, 16)], sem)
        fill.start()

        def body(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i + first_row_block, 0))
        pltpu.emit_pipeline(body, grid=(4 - first_row_block,), in_specs=[spec], out_specs=[spec])(
            x_hbm, o_hbm
        )
        fill.wait()

    any_ = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((32, 128), F32),
        in_specs=[any_],
        out_specs=any_,
        scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.SemaphoreType.DMA],
    )


def _on_tpu_mesh(fn: Any) -> Any:
    from safedma.testing import tpu_mesh

    mesh: Any = None
    reason: Exception | None = None
    for topology in ("v5e:1x1", "v5e:2x2"):  # jax 0.10.2's libtpu builds only the second
        try:
            mesh = tpu_mesh(topology)
            break
        except Exception as err:  # no libtpu topology on this machine
            reason = err
    if mesh is None:
        pytest.skip(f"no TPU topology for tracing: {reason}")
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return fn()


def test_zero_fill_beside_a_pipeline_is_clean() -> None:
    _on_tpu_mesh(lambda: verify(_zero_fill_then_pipeline(2), _s(32, 128)))


def test_zero_fill_under_a_pipeline_names_the_users_line() -> None:
    with pytest.raises(RaceDetectedError) as err:
        _on_tpu_mesh(lambda: verify(_zero_fill_then_pipeline(1), _s(32, 128)))
    text = str(err.value)
    assert "contextlib" not in text and "functools" not in text
    assert text.count("test_heldout_s6.py:") >= 2  # the pipeline's line and the fill's


# ------------------------------------ a prefetch chain across a "parallel" grid axis


def _chained_fetch(start_each_slice: bool, semantics: Literal["parallel", "arbitrary"]) -> Any:
    """Grid (2, 3): each step waits the copy of its row block and prefetches the next
    step's into the other slot. The chain starts at step (0, 0) only, or at the first
    step of every slice of the first grid dimension."""

    def kernel(x_hbm: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        c, j = pl.program_id(0), pl.program_id(1)
        step = c * 3 + j

        def fetch(s: Any) -> Any:
            return pltpu.make_async_copy(x_hbm.at[pl.ds(s * 8, 8)], buf.at[s % 2], sems.at[s % 2])

        first = j == 0 if start_each_slice else step == 0

        @pl.when(first)
        def _() -> None:
            fetch(step).start()

        @pl.when(j < 2)
        def _() -> None:
            fetch(step + 1).start()

        fetch(step).wait()
        o_ref[...] = buf[step % 2]

    return pl.pallas_call(
        kernel,
        grid=(2, 3),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda c, j: (c * 3 + j, 0)),
        out_shape=jax.ShapeDtypeStruct((48, 128), F32),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics, "arbitrary")),
    )


def test_prefetch_chain_started_in_every_parallel_slice_is_clean() -> None:
    assert verify(_chained_fetch(True, "parallel"), _s(48, 128)) is not None


def test_prefetch_chain_across_a_parallel_axis_deadlocks_and_says_why() -> None:
    with pytest.raises(DeadlockError, match=r"(?s)test_heldout_s6\.py:\d+.*megacore"):
        verify(_chained_fetch(False, "parallel"), _s(48, 128))


def test_prefetch_chain_across_an_arbitrary_axis_deadlock_has_no_megacore_note() -> None:
    with pytest.raises(DeadlockError) as err:
        verify(_chained_fetch(False, "arbitrary"), _s(48, 128))
    # file paths may contain the word (a checkout named after it): only the note counts
    assert "Note:" not in str(err.value)


# ------------------------------------------- output blocks a sparse grid never visits


def _sparse_rows(alias: bool) -> Any:
    """Copy the row blocks ``rows[b]`` of x into the same rows of the output, one grid
    step per listed block; the other row blocks are never visited."""

    def kernel(rows: Any, x_ref: Any, zeros_ref: Any, o_ref: Any) -> None:
        del rows, zeros_ref
        o_ref[...] = x_ref[...]

    def fn(rows: Any, x: Any, zeros: Any) -> Any:
        spec = pl.BlockSpec((8, 128), lambda b, rows: (rows[b], 0))
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,), in_specs=[spec, spec], out_specs=spec
            ),
            out_shape=jax.ShapeDtypeStruct((32, 128), F32),
            input_output_aliases={2: 0} if alias else {},
        )(rows, x, zeros)

    return fn


ROWS = np.array([0, 3], np.int32)


def test_sparse_grid_over_an_aliased_output_is_clean() -> None:
    assert verify(_sparse_rows(alias=True), ROWS, _s(32, 128), _s(32, 128)) is not None


def test_sparse_grid_output_blocks_never_visited_are_caught() -> None:
    with pytest.raises(UnwrittenReadError, match=r"o_ref\[8:24, 0:128\]"):
        verify(_sparse_rows(alias=False), ROWS, _s(32, 128), _s(32, 128))


def test_sparse_grid_output_read_only_where_visited_is_clean() -> None:
    def fn(rows: Any, x: Any, zeros: Any) -> Any:
        out = _sparse_rows(alias=False)(rows, x, zeros)
        return out[24:]  # one visited block (reads are bounded by one box)

    assert verify(fn, ROWS, _s(32, 128), _s(32, 128)) is not None


# ----------------------------------------------- a start/wait split (DMA future)


def _start_then_wait(wait: bool) -> Any:
    any_ = pl.BlockSpec(memory_space=pl.ANY)
    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)

    def start_kernel(x_ref: Any, o_in: Any, o_ref: Any, sem: Any) -> None:
        del o_in  # aliased to o_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    def wait_kernel(x_ref: Any, o_in: Any, sem: Any, o_ref: Any) -> None:
        del o_in
        if wait:
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    def fn(x: Any, out: Any) -> Any:
        o, sem = pl.pallas_call(
            start_kernel,
            out_shape=[jax.ShapeDtypeStruct(out.shape, out.dtype), pltpu.SemaphoreType.DMA(())],
            in_specs=[any_, any_],
            out_specs=[any_, sem_spec],
            input_output_aliases={1: 0},
        )(x, out)
        return pl.pallas_call(
            wait_kernel,
            out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
            in_specs=[any_, any_, sem_spec],
            out_specs=any_,
            input_output_aliases={1: 0},
        )(x, o, sem)

    return fn


def test_start_wait_split_is_clean() -> None:
    assert verify(_start_then_wait(True), _s(8, 128), _s(8, 128)) is not None


def test_wait_call_without_its_wait_names_the_wait_calls_line() -> None:
    with pytest.raises(RaceDetectedError, match=rf"end of kernel wait_kernel \([^)]*{HERE}"):
        verify(_start_then_wait(False), _s(8, 128), _s(8, 128))
