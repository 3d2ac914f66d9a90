"""Scoped scratch (``safedma/_scratch.py``): ``sd.run_scoped`` hands its keyword options
to ``pl.run_scoped``. Scoped buffers and semaphores of every kind against the raw
spelling: tests/corpus/run_scoped.py.

``sd.pallas_call`` and ``sd.core_kernel`` also take scratch as a dict, handed to the kernel
by keyword (on a SparseCore mesh too), lowering as jax's own; a ``PrefetchScalarGridSpec``
takes typed scratch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
import safedma as sd
import safedma._scratch as scratch
from safedma.testing import abstract_mesh, assert_same_mosaic
from tests.support.tracing import F32, SHAPE


def test_run_scoped_passes_collective_axes() -> None:
    seen: dict[str, Any] = {}

    def fake(body: Any, *types: Any, **kw: Any) -> Any:
        seen.update(kw)
        return None

    original = scratch.pl.run_scoped
    scratch.pl.run_scoped = fake  # type: ignore[assignment]
    try:
        sd.run_scoped(lambda flag: None, sd.regular_semaphore(), collective_axes="x")
    finally:
        scratch.pl.run_scoped = original  # type: ignore[assignment]
    assert seen == {"collective_axes": "x"}


ANY = pl.BlockSpec(memory_space=pl.ANY)


# --- keyword scratch (a dict) on a SparseCore mesh, copies kept in a list ---------------


def _sc_body(x_ref: sd.DataRef, o_ref: sd.DataRef, *, buf: sd.DataRef, sems: sd.SemArray) -> None:
    copies = [sd.LocalCopy(x_ref.at[:8], buf.at[:8], sems.at[0])]
    copies.append(sd.LocalCopy(x_ref.at[8:], buf.at[8:], sems.at[0]))
    handles = [c.start() for c in copies]
    for h in handles:
        h.wait()
    sd.LocalCopy(buf, o_ref, sems.at[1]).start().wait()


def _sc_body_raw(x_ref: Any, o_ref: Any, *, buf: Any, sems: Any) -> None:
    copies = [pltpu.make_async_copy(x_ref.at[:8], buf.at[:8], sems.at[0])]
    copies.append(pltpu.make_async_copy(x_ref.at[8:], buf.at[8:], sems.at[0]))
    jax.tree.map(lambda c: c.start(), copies)
    jax.tree.map(lambda c: c.wait(), copies)
    copy = pltpu.make_async_copy(buf, o_ref, sems.at[1])
    copy.start()
    copy.wait()


def test_keyword_scratch_on_a_sparse_core_mesh_matches_raw() -> None:
    from jax.experimental.pallas import tpu_sc as plsc

    def call(body: Any, entry: Any) -> Any:
        def run(x: jax.Array) -> Any:
            mesh = plsc.VectorSubcoreMesh(
                core_axis_name="core", subcore_axis_name="subcore", num_cores=1
            )
            scratch = {"buf": pltpu.VMEM((16,), jnp.int32), "sems": sd.dma_semaphores(2)}
            return entry(body, x, mesh=mesh, scratch_types=scratch)(x)

        return jax.jit(run)

    x = jax.ShapeDtypeStruct((16,), jnp.int32)
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(call(_sc_body, sd.core_kernel), call(_sc_body_raw, pl.kernel), x, mesh=mesh)


def _keyword_scratch(
    x_ref: sd.DataRef, o_ref: sd.DataRef, *, buf: sd.DataRef, sem: sd.SemRef
) -> None:
    sd.LocalCopy(x_ref, buf, sem).start().wait()
    sd.LocalCopy(buf, o_ref, sem).start().wait()


def test_pallas_call_takes_scratch_by_name() -> None:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    scratch = {"buf": sd.vmem((8, 128), jnp.float32), "sem": sd.dma_semaphore()}
    call = sd.pallas_call(
        _keyword_scratch,
        x,
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=scratch,
        interpret=pltpu.InterpretParams(),
    )
    np.testing.assert_array_equal(call(x), x)


X = jax.ShapeDtypeStruct(SHAPE, F32)


def test_prefetch_scalar_grid_spec_takes_typed_scratch() -> None:
    def kernel(idx_smem, x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[idx_smem[0]], buf, sem).start().wait()
        safedma.LocalCopy(buf, o_ref.at[0], sem).start().wait()

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[safedma.vmem(SHAPE[1:], F32), safedma.dma_semaphore()],
    )
    call = safedma.pallas_call(kernel, X, grid_spec=grid_spec)
    assert jax.eval_shape(call, jax.ShapeDtypeStruct((1,), jnp.int32), X).shape == SHAPE
