"""Patterns of production kernels verify had never seen (vLLM tpu-inference, tokamax).

Each kernel here is written for the test in raw pltpu and reproduces one
construct that made verify crash or raise a false alarm on an external kernel
(docs/verify.md lists them); each correct one must verify clean and each
seeded mistake must still be caught, naming this file's line.

* an output aliased to an input under scalar prefetch (``input_output_aliases``
  counts the prefetch operands: a kv-cache update kernel);
* a grid with a zero-size axis (no decode sequences: the body never runs);
* a cache reshaped to merge its leading dimensions, then written in two column
  halves by two copies in flight at once (MLA's kv-cache update);
* zero-size copies parked at index -1 for padding page-table entries;
* an SMEM scratch filled by a copy: from known SMEM values (computed), from
  vector data (a clear unsupported error naming the copy and the use);
* a copy size taken from a small vector computed in the kernel (an iota
  compared with a row count: the MoE gather's valid-row mask);
* tables computed before ``fn``'s own ``shard_map`` (expert offsets);
* ``pl.kernel`` over a mesh with two axes (SparseCore's core x subcore).
"""

from __future__ import annotations

import re

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    DeadlockError,
    OutOfBoundsDmaError,
    RaceDetectedError,
    SimulationError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    abstract_mesh,
    verify,
)
from safedma.testing._verify.model.regions import Buffer, resolve

F32 = jnp.float32
HERE = r"test_aliases_zero_size_copies_and_smem_scratch\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


ANY = pl.BlockSpec(memory_space=pl.ANY)


def _prefetch_call(
    kernel: Any,
    *,
    out_shape: Any,
    scratch: list[Any],
    prefetch: int = 1,
    inputs: int = 1,
    out_specs: Any = ANY,
    **options: Any,
) -> Any:
    """``pl.pallas_call`` with ``prefetch`` scalar-prefetch operands and ``inputs`` HBM ones."""
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=prefetch,
            in_specs=[ANY] * inputs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        **options,
    )


# --------------------------------------------------------------- aliased output


def _cache_update(alias: bool, wait: bool) -> Any:
    """Copy ``new`` into rows ``start[0]:`` of the cache, in place when aliased."""

    def kernel(start_ref: Any, new_ref: Any, cache_ref: Any, out_ref: Any, sem: Any) -> None:
        del cache_ref
        copy = pltpu.make_async_copy(
            new_ref, out_ref.at[pl.ds(start_ref[0], new_ref.shape[0])], sem
        )
        copy.start()
        if wait:
            copy.wait()

    def fn(start: Any, new: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
            scratch=[pltpu.SemaphoreType.DMA],
            inputs=2,
            # operand 2 counts the scalar-prefetch operand: the cache
            input_output_aliases={2: 0} if alias else {},
        )(start, new, cache)

    return fn


def test_an_output_aliased_under_scalar_prefetch_keeps_the_unwritten_rows() -> None:
    report = verify(_cache_update(True, True), np.array([8], np.int32), _s(8, 128), _s(32, 128))
    assert report.dmas == 1


def test_without_the_alias_the_rows_nothing_wrote_are_reported() -> None:
    with pytest.raises(UnwrittenReadError):
        verify(_cache_update(False, True), np.array([8], np.int32), _s(8, 128), _s(32, 128))


def test_the_aliased_update_without_its_wait_is_caught() -> None:
    with pytest.raises(SimulationError, match=HERE):
        verify(_cache_update(True, False), np.array([8], np.int32), _s(8, 128), _s(32, 128))


# --------------------------------------------------------------- zero-size grid


def _per_step_copy(steps: int) -> Any:
    def kernel(x_ref: Any, o_in_ref: Any, o_ref: Any, sem: Any) -> None:
        del o_in_ref
        i = pl.program_id(0)
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(i * 8, 8)], o_ref.at[pl.ds(i * 8, 8)], sem)
        copy.start()
        copy.wait()

    def fn(x: Any, o: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid=(steps,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            out_shape=jax.ShapeDtypeStruct(o.shape, o.dtype),
            input_output_aliases={1: 0},
        )(x, o)

    return fn


def test_a_grid_with_a_zero_size_axis_runs_no_step() -> None:
    report = verify(_per_step_copy(0), _s(16, 128), _s(16, 128))
    assert report.dmas == 0


def test_a_grid_with_steps_still_checks_them() -> None:
    assert verify(_per_step_copy(2), _s(16, 128), _s(16, 128)).dmas == 2
    with pytest.raises(OutOfBoundsDmaError, match=HERE):
        verify(_per_step_copy(3), _s(16, 128), _s(16, 128))


# --------------------------------------------- reshaped cache, column halves


def _halves(second_cols: slice) -> Any:
    """Write rows of a (pages, rows, 2, 256) cache, merged to (pages * rows, 2, 256), in
    two column halves by two copies in flight at once."""

    def kernel(
        row_ref: Any,
        a_ref: Any,
        b_ref: Any,
        cache_ref: Any,
        out_ref: Any,
        va: Any,
        vb: Any,
        sems: Any,
    ) -> None:
        del cache_ref
        flat = out_ref.reshape(out_ref.shape[0] * out_ref.shape[1], *out_ref.shape[2:])
        pltpu.sync_copy(a_ref, va)
        pltpu.sync_copy(b_ref, vb)
        row = row_ref[0]
        first = pltpu.make_async_copy(va, flat.at[pl.ds(row, 4), :, :128], sems.at[0])
        second = pltpu.make_async_copy(vb, flat.at[pl.ds(row, 4), :, second_cols], sems.at[1])
        first.start()
        second.start()
        first.wait()
        second.wait()

    def fn(row: Any, a: Any, b: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(cache.shape, cache.dtype),
            scratch=[
                pltpu.VMEM((4, 2, 128), F32),
                pltpu.VMEM((4, 2, 128), F32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
            inputs=3,
            input_output_aliases={3: 0},
        )(row, a, b, cache)

    return fn


_HALF_ARGS = (np.array([12], np.int32), _s(4, 2, 128), _s(4, 2, 128), _s(4, 8, 2, 256))


def test_two_copies_into_disjoint_columns_of_a_reshaped_cache_are_clean() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        report = verify(_halves(slice(128, None)), *_HALF_ARGS)
    assert report.dmas == 4


def test_two_copies_into_the_same_columns_of_a_reshaped_cache_race() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        with pytest.raises(RaceDetectedError, match=HERE):
            verify(_halves(slice(0, 128)), *_HALF_ARGS)


def _buf(*shape: int) -> Buffer:
    return Buffer(0, 0, "b", shape, 4, "ANY")


def test_a_merging_reshape_keeps_windows_exact() -> None:
    view = resolve(
        _buf(4, 8, 2, 256),
        [
            ("reshape", (32, 2, 256)),
            ("index", (("slice", 12, 4, 1), ("slice", 0, 2, 1), ("slice", 128, 128, 1))),
        ],
    )
    assert view.box == ((1, 2), (4, 8), (0, 2), (128, 256))


def test_a_window_across_merged_rows_is_bounded_and_a_split_is_exact() -> None:
    across = resolve(
        _buf(4, 8, 256),
        [("reshape", (32, 256)), ("index", (("slice", 6, 4, 1), ("slice", 0, 128, 1)))],
    )
    assert across.box[0] == (0, 2) and across.box[2][0] == 0  # conservative, never smaller
    split = resolve(
        _buf(32, 256),
        [
            ("reshape", (4, 8, 2, 128)),
            (
                "index",
                (("int", 2, 1, 1), ("slice", 0, 8, 1), ("slice", 0, 2, 1), ("slice", 0, 128, 1)),
            ),
        ],
    )
    assert split.box == ((16, 24), (0, 256))
    half = resolve(
        _buf(32, 256),
        [
            ("reshape", (32, 2, 128)),
            ("index", (("slice", 0, 32, 1), ("int", 1, 1, 1), ("slice", 0, 128, 1))),
        ],
    )
    assert half.box == ((0, 32), (128, 256))


# ----------------------------------------------------- zero-size padding copies


def _paged_fetch(sizes_from_table: bool) -> Any:
    """Fetch pages listed in a table; padding entries (-1) are copied with size 0."""

    def kernel(
        pages_ref: Any, lens_ref: Any, cache_ref: Any, o_ref: Any, buf: Any, sem: Any
    ) -> None:
        copies = []
        for i in range(3):
            n = lens_ref[i] if sizes_from_table else 8
            c = pltpu.make_async_copy(
                cache_ref.at[pl.ds(pages_ref[i] * 8, n)], buf.at[pl.ds(i * 8, n)], sem
            )
            c.start()
            copies.append(c)
        for c in copies:
            c.wait()
        o_ref[...] = buf[...]

    def fn(pages: Any, lens: Any, cache: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((24, 128), F32),
            scratch=[pltpu.VMEM((24, 128), F32), pltpu.SemaphoreType.DMA],
            prefetch=2,
            out_specs=pl.BlockSpec((24, 128), lambda *_: (0, 0)),
        )(pages, lens, cache)

    return fn


_PAGES = np.array([3, 0, -1], np.int32)
_LENS = np.array([8, 5, 0], np.int32)


def test_a_zero_size_copy_of_a_padding_entry_is_in_range() -> None:
    assert verify(_paged_fetch(True), _PAGES, _LENS, _s(64, 128)).dmas == 3


def test_a_padding_entry_copied_with_its_full_size_is_out_of_range() -> None:
    with pytest.raises(OutOfBoundsDmaError, match=HERE):
        verify(_paged_fetch(False), _PAGES, _LENS, _s(64, 128))


# ------------------------------------------------------- SMEM filled by a copy


def _smem_index(source: str, bad: bool = False) -> Any:
    """Copy a row table into SMEM scratch, then fetch the row it names."""

    def kernel(idx_ref: Any, x_ref: Any, o_ref: Any, vtab: Any, stab: Any, sem: Any) -> None:
        if source == "smem":
            pltpu.sync_copy(idx_ref, stab)
        else:  # from VMEM, filled by vector code
            vtab[...] = jnp.full(vtab.shape, 8, jnp.int32)
            pltpu.sync_copy(vtab, stab)
        row = stab[0] + (16 if bad else 0)
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(row, 8)], o_ref, sem)
        copy.start()
        copy.wait()

    def fn(idx: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch=[
                pltpu.VMEM((8,), jnp.int32),
                pltpu.SMEM((8,), jnp.int32),
                pltpu.SemaphoreType.DMA,
            ],
        )(idx, x)

    return fn


_IDX = np.array([8, 0, 0, 0, 0, 0, 0, 0], np.int32)


def test_an_smem_table_copied_from_known_smem_is_computed() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        assert verify(_smem_index("smem"), _IDX, _s(24, 128)).dmas == 2
        with pytest.raises(OutOfBoundsDmaError, match=HERE):
            verify(_smem_index("smem", bad=True), _IDX, _s(24, 128))


def test_an_smem_table_filled_from_vector_code_is_computed() -> None:
    # the VMEM table's contents are followed (walk/contents.py): row 8, or 24 when bad
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        assert verify(_smem_index("vmem"), _IDX, _s(24, 128)).dmas == 2
        with pytest.raises(OutOfBoundsDmaError, match=HERE):
            verify(_smem_index("vmem", bad=True), _IDX, _s(24, 128))


# ------------------------------------------------------ known small vectors


def _masked_gather(wait_rows: int | None) -> Any:
    """Copy the first ``n`` of 8 rows, sizes from ``arange(8) < n`` (a mask in the kernel)."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        valid = (jnp.arange(8) < n_ref[0]).astype(jnp.int32)
        copies = []
        for i in range(8):
            c = pltpu.make_async_copy(x_ref.at[pl.ds(i, valid[i])], buf.at[pl.ds(i, valid[i])], sem)
            c.start()
            copies.append(c)
        for i, c in enumerate(copies):
            if wait_rows is None:
                c.wait()
            else:  # a wait sized for one row, whether or not the row was copied
                pltpu.make_async_copy(
                    x_ref.at[pl.ds(i, wait_rows)], buf.at[pl.ds(i, wait_rows)], sem
                ).wait()
        o_ref[...] = buf[...]

    def fn(n: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            scratch=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
            out_specs=pl.BlockSpec((8, 128), lambda *_: (0, 0)),
        )(n, x)

    return fn


def test_copy_sizes_from_a_known_mask_are_computed() -> None:
    assert verify(_masked_gather(None), np.array([5], np.int32), _s(8, 128)).dmas == 8


def test_a_wait_sized_for_a_row_that_was_not_copied_deadlocks() -> None:
    with pytest.raises(DeadlockError, match=HERE):
        verify(_masked_gather(1), np.array([5], np.int32), _s(8, 128))


# --------------------------------------------- tables computed before shard_map


def _offset_copy(step: int) -> Any:
    """Each device copies the chunk at its expert offset, from a table fn builds itself."""
    n = 4
    mesh = abstract_mesh((n,), ("x",))

    def kernel(off_ref: Any, x_ref: Any, o_ref: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_ref.at[pl.ds(off_ref[0], 8)], o_ref, sem)
        c.start()
        c.wait()

    def per_device(off: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel, out_shape=jax.ShapeDtypeStruct((8, 128), F32), scratch=[pltpu.SemaphoreType.DMA]
        )(off, x)

    def fn(x: Any) -> Any:
        offsets = jnp.arange(0, n * step, step, dtype=jnp.int32)
        return jax.shard_map(
            per_device, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"), check_vma=False
        )(offsets, x)

    return fn


def test_a_table_computed_before_the_shard_map_reaches_the_kernel() -> None:
    report = verify(_offset_copy(8), _s(32, 128))
    assert report.devices == 4


def test_a_wrong_table_computed_before_the_shard_map_is_caught() -> None:
    with pytest.raises(OutOfBoundsDmaError, match=r"device 3.*" + HERE):
        verify(_offset_copy(9), _s(32, 128))


# ------------------------------------------------- pl.kernel over two axes


def _subcore_copy(by_subcore_only: bool) -> Any:
    """Each (core, subcore) of a 2 x 4 mesh copies its own 8 rows through VMEM."""
    from jax.experimental.pallas import tpu_sc as plsc

    def body(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        if by_subcore_only:
            me = jax.lax.axis_index("subcore")
        else:
            me = jax.lax.axis_index(("core", "subcore"))
        c = pltpu.make_async_copy(x_ref.at[pl.ds(me * 8, 8)], buf, sem)
        c.start()
        c.wait()
        c = pltpu.make_async_copy(buf, o_ref.at[pl.ds(me * 8, 8)], sem)
        c.start()
        c.wait()

    def fn(x: Any) -> Any:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=2, num_subcores=4
        )
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def _sc_mesh() -> Any:
    return jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="tpu7x"))


def test_each_core_and_subcore_is_a_participant() -> None:
    with _sc_mesh():
        report = verify(_subcore_copy(False), _s(64, 128))
    assert report.dmas == 16


def test_two_cores_writing_the_same_rows_race() -> None:
    with _sc_mesh():
        with pytest.raises((RaceDetectedError, UnwrittenReadError), match=HERE):
            verify(_subcore_copy(True), _s(64, 128))


# ------------------------------------------- copies issued through a helper


def _helper_issued(drop_second_wait: bool) -> Any:
    """Every copy goes through one helper (``_go``), as production kernels do."""

    def _go(src: Any, dst: Any, sem: Any, wait: bool) -> None:
        copy = pltpu.make_async_copy(src, dst, sem)
        if wait:
            copy.wait()
        else:
            copy.start()

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        _go(x_ref.at[0], buf.at[0], sems.at[0], False)
        _go(x_ref.at[1], buf.at[1], sems.at[1], False)
        _go(x_ref.at[0], buf.at[0], sems.at[0], True)
        if not drop_second_wait:
            _go(x_ref.at[1], buf.at[1], sems.at[1], True)
        o_ref[...] = buf[...]

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((2, 8, 128), lambda: (0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
            out_shape=jax.ShapeDtypeStruct((2, 8, 128), F32),
        )(x)

    return fn


def test_a_copy_issued_through_a_helper_names_the_line_that_called_it() -> None:
    assert verify(_helper_issued(False), _s(2, 8, 128)).dmas == 2
    with pytest.raises(RaceDetectedError) as caught:
        verify(_helper_issued(True), _s(2, 8, 128))
    message = str(caught.value)
    # the helper's line is the same for every copy; the caller's line says which one
    assert re.search(
        r"\(_helper_issued\.<locals>\._go, [^()]*called at "
        r"test_aliases_zero_size_copies_and_smem_scratch\.py:\d+",
        message,
    ), message


# --------------------------------------------- a padded block copied whole


def _padded_block(return_rows: int) -> Any:
    """Fill the first 5 rows of an 8-row block, forward the whole block (as a ring
    forwards a fixed-size kv block), then return ``return_rows`` rows of the copy."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, slots: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(
            x_ref.at[pl.ds(0, n_ref[0])], slots.at[0, pl.ds(0, n_ref[0])], sem
        )
        c.start()
        c.wait()
        c = pltpu.make_async_copy(slots.at[0], slots.at[1], sem)  # the padding goes too
        c.start()
        c.wait()
        c = pltpu.make_async_copy(slots.at[1, pl.ds(0, return_rows)], o_ref, sem)
        c.start()
        c.wait()

    def fn(n: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((return_rows, 128), F32),
            scratch=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA],
        )(n, x)

    return fn


def test_a_block_copied_whole_with_its_padding_is_clean() -> None:
    assert verify(_padded_block(5), np.array([5], np.int32), _s(8, 128)).dmas == 3


def test_the_padding_reaching_an_output_is_reported_with_the_copy_that_carried_it() -> None:
    with pytest.raises(UnwrittenReadError, match=r"filled it from slots") as caught:
        verify(_padded_block(8), np.array([5], np.int32), _s(8, 128))
    assert len(__import__("re").findall(HERE, str(caught.value))) >= 2, str(caught.value)


# ---------------------------------------- pl.kernel with an SMEM scratch table


def _one_core() -> Any:
    """A one-core TensorCoreMesh on either jax version (0.12 renamed the factory)."""
    mesh_type = getattr(pltpu, "TensorCoreMesh", None)
    if "num_cores" in str(getattr(mesh_type, "__dataclass_fields__", "")):
        return mesh_type(axis_name="core", num_cores=1)
    return pltpu.create_tensorcore_mesh("core", num_cores=1)


def _core_table(bad: bool) -> Any:
    """A pl.kernel body stores row offsets in SMEM scratch, then copies by them."""

    def body(x_ref: Any, o_ref: Any, table: Any, sem: Any) -> None:
        for i in range(2):
            table[i] = i * 8 + (8 if bad else 0)
        for i in range(2):
            c = pltpu.make_async_copy(x_ref.at[pl.ds(table[i], 8)], o_ref.at[pl.ds(i * 8, 8)], sem)
            c.start()
            c.wait()

    def fn(x: Any) -> Any:
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((16, 128), F32),
            mesh=_one_core(),
            scratch_types=[pltpu.SMEM((2,), jnp.int32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def test_a_pl_kernel_smem_scratch_table_is_computed() -> None:
    assert verify(_core_table(False), _s(16, 128)).dmas == 2
    with pytest.raises(OutOfBoundsDmaError, match=HERE):
        verify(_core_table(True), _s(16, 128))


# ------------------------------------- control data loaded as a vector


def test_a_predicate_from_a_vector_load_names_the_ref_and_the_load() -> None:
    """SparseCore kernels read row counts from VMEM as vectors: computed when the count
    is given, else the error says which load and argument the predicate came from."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, counts: Any, sem: Any) -> None:
        pltpu.sync_copy(n_ref, counts)
        n = counts[...][0]  # the load

        @pl.when(n > 0)
        def _() -> None:
            c = pltpu.make_async_copy(x_ref, o_ref, sem)
            c.start()
            c.wait()

    def fn(n: Any, x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.VMEM((8,), jnp.int32), pltpu.SemaphoreType.DMA],
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
        )(n, x)

    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="v5e")):
        # given concretely, the count is followed through the copy and the load
        assert verify(fn, np.full((8,), 3, np.int32), _s(8, 128)).dmas == 2
        with pytest.raises(VerificationUnsupportedError) as caught:
            verify(fn, _s(8, dtype=jnp.int32), _s(8, 128))
    message = str(caught.value)
    assert "counts" in message and "argument `n`" in message, message
    assert "pass it as a concrete array" not in message, message
    assert len(__import__("re").findall(HERE, message)) >= 2, message  # the when and the load


# ------------------------------ one wait sized by the total of several copies


def _total_wait() -> Any:
    """Three copies of 2 rows each into a 3-row-wide buffer, waited once with a
    descriptor of ``n[0]`` rows (the causal conv's wait: a window wider than the
    buffer, computed at run time; only its size counts)."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        for i in range(3):
            pltpu.make_async_copy(x_ref.at[i, pl.ds(0, 2)], buf.at[i, pl.ds(0, 2)], sem).start()
        total = n_ref[0]
        pltpu.make_async_copy(buf.at[0, pl.ds(0, total)], buf.at[0, pl.ds(0, total)], sem).wait()
        o_ref[...] = buf[...]

    def fn(n: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((3, 3, 128), F32),
            scratch=[pltpu.VMEM((3, 3, 128), F32), pltpu.SemaphoreType.DMA],
            out_specs=pl.BlockSpec((3, 3, 128), lambda *_: (0, 0, 0)),
        )(n, x)

    return fn


def test_one_wait_sized_by_the_total_of_several_copies_is_clean() -> None:
    assert verify(_total_wait(), np.array([6], np.int32), _s(3, 3, 128)).waits == 1


def test_a_total_wait_short_of_the_copies_leaves_bytes_behind() -> None:
    with pytest.raises(SimulationError, match=HERE):
        verify(_total_wait(), np.array([5], np.int32), _s(3, 3, 128))
