"""SMEM tables under verify: index and size tables whose values verify computes, so the
copies they drive are checked row by row.

* an index table passed as a blocked SMEM operand: each grid step holds its own block;
* an SMEM scratch filled by a copy: from known SMEM values (computed), from vector data (a
  clear unsupported error naming the copy and the use), and a ``pl.kernel``'s SMEM scratch;
* a copy size taken from a small vector computed in the kernel (the MoE gather's
  valid-row mask), and control data loaded as a vector;
* tables computed before ``fn``'s own ``shard_map`` (expert offsets).

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

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
    VerificationUnsupportedError,
    abstract_mesh,
    verify,
)
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_smem_tables\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


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


ANY = pl.BlockSpec(memory_space=pl.ANY)


# ------------------------------------------------ a blocked SMEM index table

ROWS, K, STEPS = 16, 3, 2


def _gather(*, wait: bool = True) -> Any:
    """Per grid step b, gather rows ``table[b, :]`` of ``src`` (one semaphore each)."""

    def kernel(idx_ref: Any, src_ref: Any, o_ref: Any, rows: Any, sems: Any) -> None:
        for k in range(K):
            pltpu.make_async_copy(
                src_ref.at[pl.ds(idx_ref[0, k], 1)], rows.at[pl.ds(k, 1)], sems.at[k]
            ).start()
        if wait:
            for k in range(K):
                pltpu.make_async_copy(
                    src_ref.at[pl.ds(idx_ref[0, k], 1)], rows.at[pl.ds(k, 1)], sems.at[k]
                ).wait()
        o_ref[0] = rows[...]

    def fn(table: Any, src: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid=(STEPS,),
            in_specs=[
                pl.BlockSpec((1, K), lambda b: (b, 0), memory_space=pltpu.SMEM),
                ANY,
            ],
            out_specs=pl.BlockSpec((1, K, 128), lambda b: (b, 0, 0)),
            out_shape=_s(STEPS, K, 128),
            scratch_shapes=[pltpu.VMEM((K, 128), F32), pltpu.SemaphoreType.DMA((K,))],
        )(table, src)

    return fn


TABLE = np.array([[3, 0, 15], [7, 7, 1]], np.int32)


def test_a_blocked_smem_table_gives_each_grid_step_its_own_values() -> None:
    report = verify(_gather(), TABLE, _s(ROWS, 128))
    assert report.dmas == K * STEPS


def test_a_row_past_the_source_in_the_second_block_is_caught() -> None:
    bad = TABLE.copy()
    bad[1, 2] = ROWS  # only grid step 1 reads it
    with pytest.raises(OutOfBoundsDmaError, match=HERE) as err:
        verify(_gather(), bad, _s(ROWS, 128))
    assert "window [16, 17)" in str(err.value)


def test_the_gather_without_its_waits_is_caught() -> None:
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_gather(wait=False), TABLE, _s(ROWS, 128))
