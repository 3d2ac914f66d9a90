"""Barriers: the ``collective_id`` a barrier semaphore needs, and when it needs none.

* ``barrier_semaphore(tag=...)`` (jax 0.12+) needs no ``collective_id``; on jax 0.10.2,
  whose ``get_barrier_semaphore`` takes no tag, it is a clear
  :class:`~safedma.UnsupportedByJaxError`;
* with ``jax_pallas_auto_assign_collective_ids`` (jax 0.12+) jax assigns the id, so no
  :class:`~safedma.MissingCollectiveIdError`;
* ``safedma.read`` accepts the barrier semaphore;
* ``safedma.checked`` bodies under ``pl.kernel`` and ``pl.core_map`` read the
  ``collective_id`` of that call (T9), as under ``pl.pallas_call``.
"""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
import safedma as sd
from safedma import _compat
from tests.support.tracing import assert_mentions, trace_on_mesh

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


# --- T9 for checked bodies under pl.kernel and pl.core_map ------------------------------


def _core_mesh() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(pltpu, "TensorCoreMesh"):
            return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
        return pltpu.create_tensorcore_mesh("core", num_cores=2)


def _barrier_with_the_other_core() -> None:
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, device=sd.device(core=1 - sd.my_index("core")))
    sd.wait(barrier)


X1 = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def _under_pl_kernel(collective_id: int | None) -> None:
    @sd.checked
    def body(x_ref: sd.DataRef, o_ref: sd.DataRef) -> None:
        del x_ref, o_ref
        _barrier_with_the_other_core()

    params = pltpu.CompilerParams(collective_id=collective_id)
    jax.eval_shape(pl.kernel(body, X1, mesh=_core_mesh(), compiler_params=params), X1)


def _under_pl_core_map(collective_id: int | None) -> None:
    params = pltpu.CompilerParams(collective_id=collective_id)

    def per_call(x: jax.Array) -> Any:
        def stateful(refs: Any) -> None:
            del refs

            @pl.core_map(_core_mesh(), compiler_params=params)
            @sd.checked
            def _() -> None:
                _barrier_with_the_other_core()

        return pl.run_state(stateful)((x, jnp.zeros_like(x)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # core_map, on jax 0.12
        jax.eval_shape(per_call, X1)


@pytest.mark.parametrize(
    "entry", [_under_pl_kernel, _under_pl_core_map], ids=["pl.kernel", "pl.core_map"]
)
def test_t9_checked_body_under_kernel_and_core_map(entry: Callable[[int | None], None]) -> None:
    with pytest.raises(sd.MissingCollectiveIdError) as err:
        entry(None)
    message = str(err.value)
    assert "collective_id=0" in message and "pl.kernel or pl.core_map" in message
    frames = [f for f in traceback.extract_tb(err.value.__traceback__) if f.filename == __file__]
    assert frames and frames[-1].line == "barrier = sd.barrier_semaphore()"


@pytest.mark.parametrize(
    "entry", [_under_pl_kernel, _under_pl_core_map], ids=["pl.kernel", "pl.core_map"]
)
def test_t9_checked_body_under_kernel_and_core_map_with_an_id_traces(
    entry: Callable[[int | None], None],
) -> None:
    entry(3)
