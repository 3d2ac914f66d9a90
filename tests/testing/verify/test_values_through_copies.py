"""verify follows the values a kernel moves itself: a row count copied into a lane of a
VMEM scratch and loaded as a vector, a table computed into a ``run_scoped`` buffer and
copied to SMEM, a step count a first kernel copies out to HBM by DMA and a second reads.
Each is proved when its value is right and reported when a copy it drives goes wrong;
and two legitimate padding idioms (a zero-length copy on a REGULAR semaphore, an empty
window at index -1) are clean."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import OutOfBoundsDmaError, verify
from safedma.testing._verify.program.compiler import _partial_results
from safedma.testing._verify.program.scalars import Partial

ANY = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


def _row_count_in_a_lane(rows: int) -> Any:
    """The row count is copied into lane 0 of a 16-lane scratch, the scratch loaded
    whole and lane 0 taken: it decides how many rows are copied."""

    def kernel(n_hbm: Any, x_hbm: Any, o_hbm: Any, n_vmem: Any, sem: Any) -> None:
        pltpu.make_async_copy(n_hbm, n_vmem.at[:1], sem).start()
        pltpu.make_async_copy(n_hbm, n_vmem.at[:1], sem).wait()
        n = n_vmem[...][0]

        @pl.when(n > 0)
        def _() -> None:
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], o_hbm.at[pl.ds(0, n)], sem)
            copy.start()
            copy.wait()

    def program(n: jax.Array, x: jax.Array) -> jax.Array:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[ANY, ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.VMEM((16,), jnp.int32), pltpu.SemaphoreType.DMA(())],
        )(n, x)

    return lambda: verify(
        program, jnp.array([rows], jnp.int32), jax.ShapeDtypeStruct((8, 128), jnp.float32)
    )


def test_a_row_count_loaded_from_a_partly_written_lane_is_followed() -> None:
    report = _row_count_in_a_lane(8)()
    assert report.dmas == 2, report


def test_a_row_count_past_the_buffer_loaded_from_a_lane_is_reported() -> None:
    with pytest.raises(OutOfBoundsDmaError, match=r"test_values_through_copies\.py:\d+"):
        _row_count_in_a_lane(9)()


def test_the_known_lanes_of_a_partly_known_vector_survive_a_slice() -> None:
    import numpy as np

    vector = Partial("lanes 1-15 unknown", np.arange(16, dtype=np.int32), np.arange(16) < 1)
    eqn = jax.make_jaxpr(lambda v: v[:1])(jnp.zeros(16, jnp.int32)).jaxpr.eqns[0]
    (lane,) = _partial_results(eqn, [vector])
    assert isinstance(lane, np.ndarray) and lane.tolist() == [0]
    eqn = jax.make_jaxpr(lambda v: v[:2])(jnp.zeros(16, jnp.int32)).jaxpr.eqns[0]
    (lanes,) = _partial_results(eqn, [vector])
    assert isinstance(lanes, Partial) and lanes.known.tolist() == [True, False]


def _table_through_a_scoped_buffer(offset: int) -> Any:
    """A start row computed into a run_scoped VMEM buffer, copied to SMEM scratch and
    read as the copy's start: the table of routing kernels, made small."""

    def kernel(x_hbm: Any, o_hbm: Any, table: Any, sem: Any) -> None:
        def scoped(rows: Any) -> None:
            rows[...] = jnp.full((8,), offset, jnp.int32)
            pltpu.make_async_copy(rows, table, sem).start()
            pltpu.make_async_copy(rows, table, sem).wait()

        pl.run_scoped(scoped, pltpu.VMEM((8,), jnp.int32))
        start = table[0]
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, 4)], o_hbm, sem)
        copy.start()
        copy.wait()

    def program(x: jax.Array) -> jax.Array:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((4, 128), jnp.float32),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SMEM((8,), jnp.int32), pltpu.SemaphoreType.DMA(())],
        )(x)

    return lambda: verify(program, jax.ShapeDtypeStruct((8, 128), jnp.float32))


def test_a_table_computed_in_a_run_scoped_buffer_is_followed() -> None:
    assert _table_through_a_scoped_buffer(4)().dmas == 2


def test_a_table_computed_in_a_run_scoped_buffer_past_the_rows_is_reported() -> None:
    with pytest.raises(OutOfBoundsDmaError):
        _table_through_a_scoped_buffer(6)()


def _count_flushed_to_hbm(count: int) -> Any:
    """A first kernel stores a count in SMEM and copies it out to HBM by DMA; a second
    takes it as scalar prefetch and copies that many rows."""

    def schedule(n_ref: Any, out_hbm: Any, count_smem: Any, sem: Any) -> None:
        count_smem[0] = n_ref[0] + 1
        pltpu.make_async_copy(count_smem, out_hbm, sem).start()
        pltpu.make_async_copy(count_smem, out_hbm, sem).wait()

    def rows(count_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        n = count_ref[0]
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], o_hbm.at[pl.ds(0, n)], sem)
        copy.start()
        copy.wait()

    def program(n: jax.Array, x: jax.Array) -> jax.Array:
        counted = pl.pallas_call(
            schedule,
            out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
            in_specs=[SMEM],
            out_specs=ANY,
            scratch_shapes=[pltpu.SMEM((1,), jnp.int32), pltpu.SemaphoreType.DMA(())],
        )(n)
        return pl.pallas_call(
            rows,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=[pltpu.SemaphoreType.DMA(())],
            ),
        )(counted, x)

    return lambda: verify(
        program, jnp.array([count], jnp.int32), jax.ShapeDtypeStruct((8, 128), jnp.float32)
    )


def test_a_count_a_kernel_copies_out_by_dma_reaches_the_next_kernel() -> None:
    assert _count_flushed_to_hbm(7)().dmas == 2


def test_a_count_a_kernel_copies_out_by_dma_past_the_rows_is_reported() -> None:
    with pytest.raises(OutOfBoundsDmaError):
        _count_flushed_to_hbm(8)()


def _padded_copies_on_a_regular_semaphore(real: int) -> Any:
    """One copy per row on a REGULAR semaphore, of length 0 for the padding rows (a
    slot of -1), then a wait for the real rows only: what production kernels do."""

    def kernel(slots_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        for row in range(4):
            slot = slots_ref[row]
            size = jnp.where(slot >= 0, 1, 0)
            where = jnp.maximum(slot, 0)
            pltpu.make_async_copy(
                x_hbm.at[pl.ds(row, size)], o_hbm.at[pl.ds(where, size)], sem
            ).start()
        pl.semaphore_wait(sem, real)

    def program(slots: jax.Array, x: jax.Array) -> jax.Array:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((4, 128), jnp.float32),
            in_specs=[SMEM, ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.REGULAR(())],
            input_output_aliases={1: 0},
        )(slots, x)

    slots = jnp.array([0, 1, -1, -1], jnp.int32)
    return lambda: verify(program, slots, jax.ShapeDtypeStruct((4, 128), jnp.float32))


def test_a_zero_length_copy_on_a_regular_semaphore_counts_nothing() -> None:
    assert _padded_copies_on_a_regular_semaphore(2)().dmas == 4


def test_waiting_the_padding_copies_too_is_a_deadlock() -> None:
    from safedma.testing import DeadlockError

    with pytest.raises(DeadlockError):
        _padded_copies_on_a_regular_semaphore(4)()


def _page_copy(page: int, length: int) -> Any:
    """A copy of ``length`` columns of one page, ``page`` -1 for a padding entry."""

    def kernel(table_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        n = table_ref[1]
        copy = pltpu.make_async_copy(
            x_hbm.at[table_ref[0], :, pl.ds(0, n)], o_hbm.at[0, :, pl.ds(0, n)], sem
        )
        copy.start()
        copy.wait()

    def program(table: jax.Array, x: jax.Array) -> jax.Array:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((4, 8, 128), jnp.float32),
            in_specs=[SMEM, ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
            input_output_aliases={1: 0},
        )(table, x)

    table = jnp.array([page, length], jnp.int32)
    return lambda: verify(program, table, jax.ShapeDtypeStruct((4, 8, 128), jnp.float32))


def test_an_empty_window_at_a_padding_page_is_in_range() -> None:
    assert _page_copy(-1, 0)().dmas == 1


def test_a_padding_page_with_columns_is_out_of_range() -> None:
    with pytest.raises(OutOfBoundsDmaError, match="index -1 is outside dimension 0"):
        _page_copy(-1, 128)()
