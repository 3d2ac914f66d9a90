"""Barriers named by tag or by jax's auto-assigned ids, barrier reads, and core meshes.

* ``barrier_semaphore(tag=...)`` (jax 0.12+) needs no ``collective_id``; on
  jax 0.10.2, whose ``get_barrier_semaphore`` takes no tag, it is a clear
  :class:`~safedma.UnsupportedByJaxError`.
* With ``jax_pallas_auto_assign_collective_ids`` (jax 0.12+) jax assigns the
  id, so no :class:`~safedma.MissingCollectiveIdError`.
* ``safedma.read`` accepts the barrier semaphore.
* ``safedma.core_kernel`` is ``pl.kernel`` over a TensorCore mesh with the
  kernel-scope checks; the core axis names devices (``device(core=j)``), and
  it lowers to the same Mosaic as ``pl.kernel``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import _compat
from safedma.testing import assert_same_mosaic
from tests.support.tracing import F32, SHAPE, assert_mentions, trace, trace_on_mesh

TAGS = _compat.barrier_tags_supported()
needs_tags = pytest.mark.skipif(not TAGS, reason="get_barrier_semaphore takes no tag (jax 0.10)")
AUTO_IDS = hasattr(jax.config, "jax_pallas_auto_assign_collective_ids")
needs_auto_ids = pytest.mark.skipif(not AUTO_IDS, reason="no auto collective ids (jax 0.10)")


def _tagged_barrier_kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
    barrier = safedma.barrier_semaphore(tag="neighbours")
    safedma.signal(barrier, device=safedma.neighbour("x"))
    safedma.wait(barrier)


@needs_tags
def test_barrier_with_a_tag_needs_no_collective_id() -> None:
    trace_on_mesh(_tagged_barrier_kernel, collective_id=None)


@pytest.mark.skipif(TAGS, reason="get_barrier_semaphore takes a tag")
def test_barrier_with_a_tag_on_old_jax_is_a_clear_error() -> None:
    with pytest.raises(safedma.UnsupportedByJaxError) as err:
        trace_on_mesh(_tagged_barrier_kernel, collective_id=None)
    assert_mentions(err, "barrier_semaphore(tag='neighbours')", "takes a tag", "collective_id")


@pytest.fixture
def auto_ids() -> Iterator[None]:
    jax.config.update("jax_pallas_auto_assign_collective_ids", "yes")
    try:
        yield
    finally:
        jax.config.update("jax_pallas_auto_assign_collective_ids", "no")


def _untagged_barrier_kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
    barrier = safedma.barrier_semaphore()
    safedma.signal(barrier, device=safedma.neighbour("x"))
    safedma.wait(barrier)


@needs_auto_ids
def test_auto_assigned_collective_ids_need_no_collective_id(auto_ids: None) -> None:
    trace_on_mesh(_untagged_barrier_kernel, collective_id=None)


def test_without_auto_ids_the_missing_id_is_still_caught() -> None:
    with pytest.raises(safedma.MissingCollectiveIdError) as err:
        trace_on_mesh(_untagged_barrier_kernel, collective_id=None)
    if TAGS:
        assert_mentions(err, "barrier_semaphore(tag=...)", "jax_pallas_auto_assign_collective_ids")


def test_read_of_the_barrier_semaphore() -> None:
    counts: list[jax.Array] = []

    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        barrier = safedma.barrier_semaphore()
        counts.append(safedma.read(barrier))
        safedma.signal(barrier, device=safedma.neighbour("x"))
        safedma.wait(barrier)

    trace_on_mesh(kernel, collective_id=0)
    assert counts[0].dtype == jnp.int32


# ------------------------------------------------------------ TensorCore meshes


def core_mesh(cores: int = 2) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(pltpu, "TensorCoreMesh"):
            return pltpu.TensorCoreMesh(axis_name="core", num_cores=cores)
        return pltpu.create_tensorcore_mesh("core", num_cores=cores)


def _swap_cores(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
    other = safedma.device(core=1 - safedma.my_index("core"))
    copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(other)
    copy.start().wait()


def _swap_cores_pltpu(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
    other = {"core": 1 - jax.lax.axis_index("core")}
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=other)
    copy.start()
    copy.wait()


X = jax.ShapeDtypeStruct(SHAPE, F32)
SCRATCH = [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]


def _on_cores(body: Any, entry: str) -> Any:
    if entry == "safedma.core_kernel":
        return safedma.core_kernel(body, X, mesh=core_mesh(), scratch_types=SCRATCH)
    return pl.kernel(body, X, mesh=core_mesh(), scratch_types=SCRATCH)


def test_core_kernel_traces_core_axis_device_ids() -> None:
    assert jax.eval_shape(_on_cores(_swap_cores, "safedma.core_kernel"), X).shape == SHAPE


def test_core_kernel_has_the_kernel_scope_checks() -> None:
    def leaky(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        other = safedma.device(core=1 - safedma.my_index("core"))
        safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(other).start()

    with pytest.raises(safedma.CopyNeverWaitedError) as err:
        jax.eval_shape(_on_cores(leaky, "safedma.core_kernel"), X)
    assert_mentions(err, "kernel 'leaky'", "x_ref float32[2,8,128] -> o_ref")


def test_core_axis_index_out_of_range_is_caught() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        safedma.device(core=2)

    with pytest.raises(safedma.DeviceIdError) as err:
        jax.eval_shape(_on_cores(kernel, "safedma.core_kernel"), X)
    assert_mentions(err, "outside mesh axis 'core' of size 2")


def test_core_kernel_lowers_like_pl_kernel() -> None:
    assert_same_mosaic(
        _on_cores(_swap_cores, "safedma.core_kernel"), _on_cores(_swap_cores_pltpu, "pl.kernel"), X
    )


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


def test_trace_helper_still_reaches_pallas_call() -> None:
    # The options declaration passes only what was given (jax's defaults otherwise).
    trace(lambda x_ref, o_ref: None)
