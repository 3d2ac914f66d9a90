"""The T-rows of docs/catalogue.md (and the S-rows' trace-time backups) in shapes the row
tests do not use.

Each mistake is written with the typed API where a miss is plausible: inside
``lax.cond`` / ``while_loop`` / ``pl.loop`` / nested ``fori_loop`` bodies, under
``pl.when``, in ``run_scoped`` blocks and helpers, through ``.reshape`` / ``.bitcast`` /
``.at`` views, on N-D semaphore arrays with traced indices, in ``sd.core_kernel`` over
a TensorCore mesh, in an ``emit_pipeline`` body, with scalar-prefetch trip counts and
on a 2-D mesh with dict device ids. Tracing must raise the row's safedma error, name
the line marked ``# fix: <case>`` (in the message or as the frame that raised) and the
fix. The correct twins must trace.

The mistakes seeded in the shapes production DMA code takes (helpers, loops, branches,
aliases, closures, partials, dataclasses, tuples) are stopped naming the user's line and,
for a copy started in a helper, the line that called the helper.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, mosaic_text
from tests.corpus import pipelines
from tests.corpus._calls import X, local_call
from tests.support.four_devices import ROWS, N
from tests.support.four_devices import blocks as _x
from tests.support.four_devices import mesh as _mesh
from tests.support.ring_twins import sharded
from tests.support.source_lines import line_in, marker_line, raising_lines
from tests.support.tracing import DMA, F32, SHAPE, TWO_DMA, VMEM, trace, trace_on_mesh

HERE = __file__
TPU = abstract_mesh((), (), tpu="v5p")
PIPE_SPEC = pl.BlockSpec(pipelines.BLOCK, lambda i: (i, 0))


def _core_mesh() -> Any:
    if hasattr(pltpu, "TensorCoreMesh"):
        return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)  # jax 0.12
    return pltpu.create_tensorcore_mesh("core", num_cores=2)


def _on_cores(body: Callable[..., None], scratch: list[Any]) -> None:
    x = jax.ShapeDtypeStruct(SHAPE, F32)
    jax.eval_shape(sd.core_kernel(body, x, mesh=_core_mesh(), scratch_types=scratch), x)


def _prefetched(kernel: Callable[..., None], scratch: list[Any], trips: int = 2) -> None:
    """Trace ``kernel(n_ref, x_ref, o_ref, *scratch)`` with ``n_ref`` scalar-prefetched."""
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, in_specs=[any_spec], out_specs=any_spec, scratch_shapes=scratch
    )
    x = jax.ShapeDtypeStruct(SHAPE, F32)
    jax.eval_shape(sd.pallas_call(kernel, x, grid_spec=spec), jnp.array([trips], jnp.int32), x)


def _pipelined(kernel: Callable[..., None], scratch: list[Any]) -> None:
    mosaic_text(local_call(kernel, scratch), X, mesh=TPU)


def _ring(x: Any, o: Any, send: Any, recv: Any, to: Any) -> Any:
    return sd.RemoteCopy(x, o, recv).with_send_sem(send).to(to)


# ====================================================================== the mistakes


def t1_in_a_cond_branch() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def fetch() -> None:
            sd.LocalCopy(x.at[0], buf, sem).start().wait()  # fix: t1_in_a_cond_branch

        lax.cond(pl.program_id(0) == 0, fetch, lambda: None)

    trace(k, [VMEM, DMA], grid=(2,))


def t1_in_a_while_loop() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(i):  # type: ignore[no-untyped-def]
            sd.LocalCopy(x.at[0], buf, sem).start().wait()  # fix: t1_in_a_while_loop
            return i + 1

        lax.while_loop(lambda i: i < 2, body, 0)

    trace(k, [VMEM, DMA])


def t1_through_a_reshape_view() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x.reshape(16, 128), buf, sem).start().wait()  # fix: t1_through_a_reshape_view

    trace(k, [VMEM, DMA])


def t1_in_a_run_scoped_helper() -> None:
    def fetch(src, dst, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(src, dst, sem).start().wait()  # fix: t1_in_a_run_scoped_helper

    def k(x, o):  # type: ignore[no-untyped-def]
        sd.run_scoped(lambda buf, sem: fetch(x.at[0], buf, sem), VMEM, DMA)

    trace(k)


def t1_on_a_core_kernel() -> None:
    def body(x, o, buf, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x.at[0], buf, sem).start().wait()  # fix: t1_on_a_core_kernel

    _on_cores(body, [VMEM, DMA])


def t1_remote_to_a_dict_device_on_a_2d_mesh() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=0, y=1)
        copy = _ring(x.at[0], o, send, recv, to)  # fix: t1_remote_to_a_dict_device_on_a_2d_mesh
        copy.start().wait()

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def t1_in_an_emit_pipeline_body() -> None:
    def k(x, o, sem):  # type: ignore[no-untyped-def]
        def body(xv, ov):  # type: ignore[no-untyped-def]
            copy = sd.LocalCopy(xv.at[pl.ds(0, 4)], ov, sem)  # fix: t1_in_an_emit_pipeline_body
            copy.start().wait()

        sd.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.dma_semaphore()])


def t2_through_a_bitcast_view() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x.bitcast(jnp.int32), buf, sem).start().wait()  # fix: t2_through_a_bitcast_view  # fmt: skip

    trace(k, [VMEM, DMA])


def t2_remote_in_a_fori_loop() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        def body(i, c):  # type: ignore[no-untyped-def]
            to = sd.neighbour("x")
            copy = _ring(x.bitcast(jnp.int32), o, send, recv, to)  # fix: t2_remote_in_a_fori_loop
            copy.start().wait()
            return c

        lax.fori_loop(0, 2, body, 0)

    trace_on_mesh(k, TWO_DMA)


def t3_unknown_axis_in_a_dict_on_a_2d_mesh() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=0, z=1)  # fix: t3_unknown_axis_in_a_dict_on_a_2d_mesh
        _ring(x, o, send, recv, to).start().wait()

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def t3_index_outside_the_second_axis() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=0, y=4)  # fix: t3_index_outside_the_second_axis
        _ring(x, o, send, recv, to).start().wait()

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def t3_out_of_range_under_when() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        @pl.when(sd.my_index("x") == 0)
        def _() -> None:
            to = sd.device(x=5)  # fix: t3_out_of_range_under_when
            _ring(x, o, send, recv, to).start().wait()

    trace_on_mesh(k, TWO_DMA)


def t3_core_outside_the_core_mesh() -> None:
    def body(x, o, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(core=2)  # fix: t3_core_outside_the_core_mesh
        _ring(x, o, send, recv, to).start().wait()

    _on_cores(body, TWO_DMA)


def t4_remote_priority_in_pl_loop() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        @pl.loop(0, 2)
        def _(i: Any) -> None:
            copy = _ring(x, o, send, recv, sd.neighbour("x"))
            copy.start(priority=1).wait()  # fix: t4_remote_priority_in_pl_loop

    trace_on_mesh(k, TWO_DMA)


def t4_priority_in_a_cond_branch() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def fetch() -> None:
            sd.LocalCopy(x, buf, sem).start(priority=2).wait()  # fix: t4_priority_in_a_cond_branch

        lax.cond(pl.program_id(0) == 0, fetch, lambda: None)

    trace(k, [VMEM, DMA], grid=(2,))


def t5_add_in_a_cond_branch() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def fetch() -> None:
            sd.LocalCopy(x, buf, sem).start(add=True).wait()  # fix: t5_add_in_a_cond_branch

        lax.cond(pl.program_id(0) == 0, fetch, lambda: None)

    trace(k, [VMEM, DMA], grid=(2,))


def t6_missing_semaphore_in_run_scoped() -> None:
    def k(x, o):  # type: ignore[no-untyped-def]
        def body(buf):  # type: ignore[no-untyped-def]
            sd.LocalCopy(x, buf, None).start().wait()  # fix: t6_missing_semaphore_in_run_scoped

        sd.run_scoped(body, VMEM)

    trace(k)


def t7_in_a_while_loop() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(i):  # type: ignore[no-untyped-def]
            sd.LocalCopy(x.at[0], buf.at[0], sem).start()  # fix: t7_in_a_while_loop
            return i + 1

        lax.while_loop(lambda i: i < 2, body, 0)

    trace(k, [VMEM, DMA])


def t7_in_a_pl_loop_of_smem_trip_count() -> None:
    def k(n_ref, x, o, buf, sem):  # type: ignore[no-untyped-def]
        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            sd.LocalCopy(x.at[0], buf.at[0], sem).start()  # fix: t7_in_a_pl_loop_of_smem_trip_count

    _prefetched(k, [VMEM, DMA])


def t7_started_in_both_branches_waited_in_one() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def waited() -> None:
            sd.LocalCopy(x, buf, sem).start().wait()

        def left() -> None:
            sd.LocalCopy(x, buf, sem).start()  # fix: t7_started_in_both_branches_waited_in_one

        lax.cond(pl.program_id(0) == 0, waited, left)

    trace(k, [VMEM, DMA], grid=(2,))


def t7_in_an_inner_loop_of_a_nested_fori() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def outer(i, c):  # type: ignore[no-untyped-def]
            def inner(j, c2):  # type: ignore[no-untyped-def]
                sd.LocalCopy(
                    x.at[i], buf.at[j], sem
                ).start()  # fix: t7_in_an_inner_loop_of_a_nested_fori
                return c2

            return lax.fori_loop(0, 2, inner, c)

        lax.fori_loop(0, 2, outer, 0)

    trace(k, [VMEM, DMA])


def t7_on_a_core_kernel() -> None:
    def body(x, o, buf, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x, buf, sem).start()  # fix: t7_on_a_core_kernel

    _on_cores(body, [VMEM, DMA])


def t7_wrong_slot_of_a_2d_array() -> None:
    def k(x, o, buf, sems):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x, buf, sems.at[0, 1]).start()  # fix: t7_wrong_slot_of_a_2d_array
        sd.LocalCopy(x, buf, sems.at[1, 0]).started_elsewhere().wait()

    trace(k, [VMEM, sd.dma_semaphores((2, 2))])


def t7_in_a_raw_emit_pipeline_body() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(xv, ov):  # type: ignore[no-untyped-def]
            sd.LocalCopy(x.at[pl.ds(0, 8)], buf, sem).start()  # fix: t7_in_a_raw_emit_pipeline_body
            ov[...] = xv[...]

        pltpu.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.vmem(pipelines.BLOCK, F32), sd.dma_semaphore()])


def t7_receive_side_to_a_dict_device() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        handle = _ring(
            x, o, send, recv, sd.device(x=1, y=0)
        ).start()  # fix: t7_receive_side_to_a_dict_device
        handle.wait_send()

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def t7_waited_in_a_pipeline_body_on_another_semaphore() -> None:
    def k(x, o, buf, sem, other):  # type: ignore[no-untyped-def]
        sd.LocalCopy(
            x.at[pl.ds(0, 8)], buf, sem
        ).start()  # fix: t7_waited_in_a_pipeline_body_on_another_semaphore

        def body(xv, ov):  # type: ignore[no-untyped-def]
            @pl.when(pl.program_id(0) == 0)
            def _() -> None:
                sd.LocalCopy(x.at[pl.ds(0, 8)], buf, other).started_elsewhere().wait()

            ov[...] = xv[...] + buf[...]

        sd.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.vmem(pipelines.BLOCK, F32), sd.dma_semaphore(), sd.dma_semaphore()])


def t8_in_a_pl_loop_body() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        @pl.loop(0, 2)
        def _(i: Any) -> None:
            h = sd.LocalCopy(x.at[i], buf.at[i], sem).start()
            h.wait()
            h.wait()  # fix: t8_in_a_pl_loop_body

    trace(k, [VMEM, DMA])


def t8_through_a_helper() -> None:
    def drain(h):  # type: ignore[no-untyped-def]
        h.wait()  # fix: t8_through_a_helper

    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x, buf, sem).start()
        drain(h)
        drain(h)

    trace(k, [VMEM, DMA])


def t8_in_an_emit_pipeline_body() -> None:
    def k(x, o, sem):  # type: ignore[no-untyped-def]
        def body(xv, ov):  # type: ignore[no-untyped-def]
            h = sd.LocalCopy(xv, ov, sem).start()
            h.wait()
            h.wait()  # fix: t8_in_an_emit_pipeline_body

        sd.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.dma_semaphore()])


def t8_receive_side_twice_to_a_dict_device() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        h = _ring(x, o, send, recv, sd.device(x=1, y=0)).start()
        h.wait_send()
        h.wait_recv()
        h.wait_recv()  # fix: t8_receive_side_twice_to_a_dict_device

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def t9_on_a_core_kernel() -> None:
    def body(x, o):  # type: ignore[no-untyped-def]
        barrier = sd.barrier_semaphore()  # fix: t9_on_a_core_kernel
        sd.signal(barrier, 1, device=sd.neighbour("core"))
        sd.wait(barrier, 1)

    _on_cores(body, [])


def t9_under_when_on_a_mesh() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        @pl.when(sd.my_index("x") == 0)
        def _() -> None:
            barrier = sd.barrier_semaphore()  # fix: t9_under_when_on_a_mesh
            sd.signal(barrier, 1, device=sd.neighbour("x"))
            sd.wait(barrier, 1)

    trace_on_mesh(k, TWO_DMA, collective_id=None)


def s2_one_index_into_a_2d_array_on_a_wait_only_path() -> None:
    def k(x, o, buf, sems):  # type: ignore[no-untyped-def]
        # fix: s2_one_index_into_a_2d_array_on_a_wait_only_path (the next line)
        copy = sd.LocalCopy(x, buf, sems.at[1])
        copy.started_elsewhere().wait()

    trace(k, [VMEM, sd.dma_semaphores((2, 2))])


def s2_one_index_into_a_2d_regular_array() -> None:
    def k(x, o, sems):  # type: ignore[no-untyped-def]
        sd.signal(sems.at[0], 1)  # fix: s2_one_index_into_a_2d_regular_array
        sd.wait(sems.at[0], 1)

    trace(k, [sd.regular_semaphores((2, 2))])


def _future_start(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()


def _future_done(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def _future_done_by_size(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.wait_bytes(sem, o_ref)


def future_finished_twice_in_one_branch() -> None:
    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))

        def twice() -> jax.Array:
            sd.finish_async(_future_done, future)
            return sd.finish_async(_future_done, future)  # fix: future_finished_twice_in_one_branch

        return lax.cond(flag[0] > 0, twice, lambda: x)

    jax.eval_shape(f, X, jax.ShapeDtypeStruct((1,), jnp.int32))


# case: (the mistake, the error, words of the fix)
_MISTAKES: dict[str, tuple[Callable[[], None], type[Exception], tuple[str, ...]]] = {
    "t1_in_a_cond_branch": (t1_in_a_cond_branch, sd.CopyShapeMismatchError, ("shapes match",)),
    "t1_in_a_while_loop": (t1_in_a_while_loop, sd.CopyShapeMismatchError, ("shapes match",)),
    "t1_through_a_reshape_view": (
        t1_through_a_reshape_view,
        sd.CopyShapeMismatchError,
        ("(16, 128) and (2, 8, 128)", "shapes match"),
    ),
    "t1_in_a_run_scoped_helper": (
        t1_in_a_run_scoped_helper,
        sd.CopyShapeMismatchError,
        ("shapes match",),
    ),
    "t1_on_a_core_kernel": (t1_on_a_core_kernel, sd.CopyShapeMismatchError, ("shapes match",)),
    "t1_remote_to_a_dict_device_on_a_2d_mesh": (
        t1_remote_to_a_dict_device_on_a_2d_mesh,
        sd.CopyShapeMismatchError,
        ("RemoteCopy", "shapes match"),
    ),
    "t1_in_an_emit_pipeline_body": (
        t1_in_an_emit_pipeline_body,
        sd.CopyShapeMismatchError,
        ("(4, 128) and (8, 128)", "shapes match"),
    ),
    "t2_through_a_bitcast_view": (
        t2_through_a_bitcast_view,
        sd.CopyDtypeMismatchError,
        ("int32 and float32", ".astype()"),
    ),
    "t2_remote_in_a_fori_loop": (
        t2_remote_in_a_fori_loop,
        sd.CopyDtypeMismatchError,
        ("RemoteCopy", ".astype()"),
    ),
    "t3_unknown_axis_in_a_dict_on_a_2d_mesh": (
        t3_unknown_axis_in_a_dict_on_a_2d_mesh,
        sd.DeviceIdError,
        ("unknown mesh axis 'z'", "['x', 'y']"),
    ),
    "t3_index_outside_the_second_axis": (
        t3_index_outside_the_second_axis,
        sd.DeviceIdError,
        ("mesh axis 'y' of size 4", "% 4", "safedma.neighbour"),
    ),
    "t3_out_of_range_under_when": (
        t3_out_of_range_under_when,
        sd.DeviceIdError,
        ("device index 5", "% 4"),
    ),
    "t3_core_outside_the_core_mesh": (
        t3_core_outside_the_core_mesh,
        sd.DeviceIdError,
        ("mesh axis 'core' of size 2", "% 2"),
    ),
    "t4_remote_priority_in_pl_loop": (
        t4_remote_priority_in_pl_loop,
        sd.PriorityError,
        ("priority 0", "Drop the priority argument"),
    ),
    "t4_priority_in_a_cond_branch": (
        t4_priority_in_a_cond_branch,
        sd.PriorityError,
        ("0 (default) or 1", "priority=1"),
    ),
    "t5_add_in_a_cond_branch": (
        t5_add_in_a_cond_branch,
        sd.UnsupportedDmaError,
        ("add=True", "acc[...] += buf[...]"),
    ),
    "t6_missing_semaphore_in_run_scoped": (
        t6_missing_semaphore_in_run_scoped,
        sd.MissingSemaphoreError,
        ("semaphore is missing", "sems.at[i]"),
    ),
    "t7_in_a_while_loop": (t7_in_a_while_loop, sd.CopyNeverWaitedError, ("wait() never called",)),
    "t7_in_a_pl_loop_of_smem_trip_count": (
        t7_in_a_pl_loop_of_smem_trip_count,
        sd.CopyNeverWaitedError,
        ("wait() never called",),
    ),
    "t7_started_in_both_branches_waited_in_one": (
        t7_started_in_both_branches_waited_in_one,
        sd.CopyNeverWaitedError,
        ("wait() never called",),
    ),
    "t7_in_an_inner_loop_of_a_nested_fori": (
        t7_in_an_inner_loop_of_a_nested_fori,
        sd.CopyNeverWaitedError,
        ("wait() never called",),
    ),
    "t7_on_a_core_kernel": (t7_on_a_core_kernel, sd.CopyNeverWaitedError, ("wait() never called",)),
    "t7_wrong_slot_of_a_2d_array": (
        t7_wrong_slot_of_a_2d_array,
        sd.CopyNeverWaitedError,
        ("same semaphore slot", "wait() never called"),
    ),
    "t7_in_a_raw_emit_pipeline_body": (
        t7_in_a_raw_emit_pipeline_body,
        sd.CopyNeverWaitedError,
        ("wait() never called",),
    ),
    "t7_receive_side_to_a_dict_device": (
        t7_receive_side_to_a_dict_device,
        sd.CopyNeverWaitedError,
        ("to device(x=1, y=0)", "wait_recv() never called", "handle.wait_recv()"),
    ),
    "t7_waited_in_a_pipeline_body_on_another_semaphore": (
        t7_waited_in_a_pipeline_body_on_another_semaphore,
        sd.CopyNeverWaitedError,
        ("same semaphore slot", "wait() never called"),
    ),
    "t8_in_a_pl_loop_body": (t8_in_a_pl_loop_body, sd.HandleWaitedTwiceError, ("twice",)),
    "t8_through_a_helper": (t8_through_a_helper, sd.HandleWaitedTwiceError, ("twice",)),
    "t8_in_an_emit_pipeline_body": (
        t8_in_an_emit_pipeline_body,
        sd.HandleWaitedTwiceError,
        ("twice",),
    ),
    "t8_receive_side_twice_to_a_dict_device": (
        t8_receive_side_twice_to_a_dict_device,
        sd.HandleWaitedTwiceError,
        ("wait_recv()", "twice"),
    ),
    "t9_on_a_core_kernel": (
        t9_on_a_core_kernel,
        sd.MissingCollectiveIdError,
        ("collective_id=0", "safedma.core_kernel"),
    ),
    "t9_under_when_on_a_mesh": (
        t9_under_when_on_a_mesh,
        sd.MissingCollectiveIdError,
        ("collective_id=0",),
    ),
    "future_finished_twice_in_one_branch": (
        future_finished_twice_in_one_branch,
        sd.FutureConsumedTwiceError,
        ("and again at", "Finish each future once"),
    ),
    "s2_one_index_into_a_2d_array_on_a_wait_only_path": (
        s2_one_index_into_a_2d_array_on_a_wait_only_path,
        sd.SemaphoreShapeError,
        ("must be one semaphore", "sems.at[i, j]"),
    ),
    "s2_one_index_into_a_2d_regular_array": (
        s2_one_index_into_a_2d_regular_array,
        sd.SemaphoreShapeError,
        ("signal() semaphore must be one semaphore", "sems.at[i, j]"),
    ),
}


@pytest.mark.parametrize("case", sorted(_MISTAKES))
def test_the_mistake_fails_at_trace_time_naming_the_line_and_the_fix(case: str) -> None:
    mistake, error, fix = _MISTAKES[case]
    with pytest.raises(error) as caught:
        mistake()
    text = str(caught.value)
    line = marker_line(HERE, f"# fix: {case}")
    line += "(the next line)" in open(HERE, encoding="utf-8").read().splitlines()[line - 1]
    named = re.search(rf"test_catalogue_rows_in_other_shapes\.py:{line}\b", text) is not None
    assert named or line in raising_lines(caught, HERE), (line, text)
    missing = [w for w in fix if w not in text]
    assert not missing, f"message lacks {missing!r}:\n{text}"


# ============================================================= correct twins: they trace


def ok_waits_in_both_branches_of_a_cond() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x, buf, sem).start()
        lax.cond(pl.program_id(0) == 0, h.wait, h.wait)

    trace(k, [VMEM, DMA], grid=(2,))


def ok_handle_across_a_raw_emit_pipeline() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x.at[pl.ds(0, 8)], buf, sem).start()
        pltpu.emit_pipeline(
            pipelines.double, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC]
        )(x, o)
        h.wait()

    _pipelined(k, [sd.vmem(pipelines.BLOCK, F32), sd.dma_semaphore()])


def ok_starts_in_a_smem_loop_waits_in_the_next() -> None:
    def k(n_ref, x, o, buf, sems):  # type: ignore[no-untyped-def]
        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            sd.LocalCopy(x.at[i], buf.at[i], sems.at[i]).start()

        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            sd.LocalCopy(x.at[i], buf.at[i], sems.at[i]).started_elsewhere().wait()

    _prefetched(k, [VMEM, sd.dma_semaphores((2,))])


def ok_traced_slots_of_a_2d_array() -> None:
    def k(x, o, buf, sems):  # type: ignore[no-untyped-def]
        i = pl.program_id(0)
        sd.LocalCopy(x.at[i], buf.at[i], sems.at[i, 1]).start()
        sd.LocalCopy(x.at[i], buf.at[i], sems.at[i, 1]).started_elsewhere().wait()

    trace(k, [VMEM, sd.dma_semaphores((2, 2))], grid=(2,))


def ok_partial_dict_device_on_a_2d_mesh() -> None:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=(sd.my_index("x") + 1) % 2)  # y: this device's own
        _ring(x, o, send, recv, to).start().wait()

    trace_on_mesh(k, TWO_DMA, mesh_shape=(2, 4))


def ok_zero_size_copy_in_a_loop() -> None:
    def k(n_ref, x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(i, c):  # type: ignore[no-untyped-def]
            n = jnp.where(i < n_ref[0], 8, 0)
            sd.LocalCopy(x.at[i, pl.ds(0, n)], buf.at[i, pl.ds(0, n)], sem).start().wait()
            return c

        lax.fori_loop(0, 2, body, 0)

    _prefetched(k, [VMEM, DMA], trips=1)


def ok_core_kernel_swap_behind_the_barrier() -> None:
    def body(x, o, send, recv):  # type: ignore[no-untyped-def]
        barrier = sd.barrier_semaphore()
        sd.signal(barrier, 1, device=sd.neighbour("core"))
        sd.wait(barrier, 1)
        _ring(x, o, send, recv, sd.neighbour("core")).start().wait()

    x = jax.ShapeDtypeStruct(SHAPE, F32)
    call = sd.core_kernel(
        body,
        x,
        mesh=_core_mesh(),
        scratch_types=TWO_DMA,
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )
    jax.eval_shape(call, x)


def ok_started_elsewhere_wait_in_an_sd_emit_pipeline_body() -> None:
    """A copy started before the pipeline and waited at its first step: the body is
     checked as a kernel of its own, and its wait by slot waits the kernel's copy too
    ."""

    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        copy = sd.LocalCopy(x.at[pl.ds(0, 8)], buf, sem)
        copy.start()

        def body(xv, ov):  # type: ignore[no-untyped-def]
            @pl.when(pl.program_id(0) == 0)
            def _() -> None:
                copy.started_elsewhere().wait()

            ov[...] = xv[...] + buf[...]

        sd.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.vmem(pipelines.BLOCK, F32), sd.dma_semaphore()])


def ok_wait_by_size_in_an_sd_emit_pipeline_body() -> None:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        for j in range(2):
            sd.LocalCopy(x.at[pl.ds(8 * j, 4)], buf.at[pl.ds(4 * j, 4)], sem).start()

        def body(xv, ov):  # type: ignore[no-untyped-def]
            pl.when(pl.program_id(0) == 0)(lambda: sd.wait_bytes(sem, buf))
            ov[...] = xv[...] + buf[...]

        sd.emit_pipeline(body, grid=(4,), in_specs=[PIPE_SPEC], out_specs=[PIPE_SPEC])(x, o)

    _pipelined(k, [sd.vmem(pipelines.BLOCK, F32), sd.dma_semaphore()])


def ok_future_finished_in_each_branch_of_a_cond() -> None:
    """Each branch of a lax.cond finishes the future once."""

    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
        return lax.cond(
            flag[0] > 0,
            lambda: sd.finish_async(_future_done, future),
            lambda: sd.finish_async(_future_done_by_size, future) * 2,
        )

    jax.eval_shape(f, X, jax.ShapeDtypeStruct((1,), jnp.int32))


_OK = sorted(name for name in globals() if name.startswith("ok_"))


@pytest.mark.parametrize("case", _OK)
def test_the_correct_twin_traces(case: str) -> None:
    globals()[case]()


ANY = pl.BlockSpec(memory_space=pl.ANY)


def _rdma_start(src: Any, dst: Any, target: Any, send: Any, recv: Any) -> None:
    sd.RemoteCopy(src, dst, recv).with_send_sem(send).to(sd.logical_device(target)).start()


# --- docs/catalogue.md mistakes in new shapes -------------------------------------------------

SEEDS: dict[str, tuple[type[Exception], Callable[..., None], list[Any]]] = {}


ONE = [
    sd.dma_semaphore(),
    sd.dma_semaphores(3),
    sd.dma_semaphores(3),
    sd.vmem((ROWS, 128), jnp.float32),
]


def _seed(
    error: type[Exception], scratch: list[Any] | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(kernel: Callable[..., None]) -> Callable[..., None]:
        SEEDS[kernel.__name__] = (error, kernel, ONE if scratch is None else scratch)
        return kernel

    return register


def _to(x: Any, o: Any, send_sems: Any, recv_sems: Any, offset: int, *, whole: bool = False) -> Any:
    peer = jax.lax.rem(sd.my_index("x") + offset, N)
    recv = recv_sems if whole else recv_sems.at[offset - 1]
    copy = sd.RemoteCopy(x.at[pl.ds(0, 4)], o.at[pl.ds(4 * (offset - 1), 4)], recv)
    return copy.with_send_sem(send_sems.at[offset - 1]).to(sd.mesh_coords(peer))


@dataclasses.dataclass(frozen=True)
class _Stage:
    src: Any
    dst: Any
    sem: Any

    def copy(self) -> sd.LocalCopy:
        return sd.LocalCopy(self.src, self.dst, self.sem)


@_seed(sd.SemaphoreKindError, [{"send": sd.dma_semaphore(), "recv": sd.regular_semaphore()}])
def s3_regular_semaphore_in_a_dict_of_scratch(x: Any, o: Any, sems: Any) -> None:
    _rdma_start(x, o, sd.my_index("x") ^ 1, sems["send"], sems["recv"])  # USER LINE


@_seed(sd.NotARefError, [{"send": sd.dma_semaphore(), "recv": sd.dma_semaphore()}])
def s1_semaphore_value_through_a_helper(x: Any, o: Any, sems: Any) -> None:
    _rdma_start(x, o, sd.my_index("x") ^ 1, sems["send"], sd.read(sems["recv"]))  # USER LINE


@_seed(sd.SemaphoreShapeError)
def s2_array_inside_a_builder_helper(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    for offset in range(1, N):
        _to(x, o, ss, rs, offset, whole=True).start().wait()  # USER LINE


@_seed(sd.SemaphoreKindError)
def s6_dataclass_of_refs_with_fields_swapped(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    _Stage(src=x, dst=own, sem=buf).copy().start().wait()  # USER LINE


@_seed(sd.WrongOperationError)
def s9_copy_from_a_helper_waited_unstarted(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    stage = _Stage(x, buf, own)
    stage.copy().start()
    stage.copy().wait()  # USER LINE


@_seed(sd.WrongOperationError)
def s5_wait_send_on_a_handle_from_a_list(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handles = [sd.LocalCopy(x, buf, own).start()]
    handles[0].wait_send()  # USER LINE


@_seed(sd.IncompleteCopyError)
def s4_builder_closure_without_send(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    def build() -> Any:
        return sd.RemoteCopy(x.at[pl.ds(0, 4)], o.at[pl.ds(0, 4)], rs.at[0]).to(sd.neighbour("x"))

    build().start().wait()  # USER LINE


@_seed(sd.CopyShapeMismatchError)
def t1_in_a_partial_kernel(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any, *, rows: int = 8
) -> None:
    sd.LocalCopy(x.at[pl.ds(0, rows)], buf, own).start().wait()  # USER LINE


@_seed(
    sd.CopyDtypeMismatchError,
    [{"buf": sd.vmem((ROWS, 128), jnp.bfloat16), "sem": sd.dma_semaphore()}],
)
def t2_dict_scratch_of_another_dtype(x: Any, o: Any, scratch: Any) -> None:
    sd.LocalCopy(x, scratch["buf"], scratch["sem"]).start().wait()  # USER LINE


@_seed(sd.DeviceIdError)
def t3_static_logical_id_outside_the_mesh(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    copy = sd.RemoteCopy(x, o, rs.at[0]).with_send_sem(ss.at[0])
    copy.to(sd.logical_device(N)).start().wait()  # USER LINE


@_seed(sd.PriorityError)
def t4_priority_through_a_partial(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    start = functools.partial(sd.LocalCopy(x, buf, own).start, priority=2)
    start().wait()  # USER LINE


@_seed(sd.UnsupportedDmaError)
def t5_add_through_a_dict_of_options(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    options = {"add": True}
    sd.LocalCopy(x, buf, own).start(**options).wait()  # USER LINE


@_seed(sd.CopyNeverWaitedError)
def t7_wait_only_in_a_closure_never_called(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handle = sd.LocalCopy(x, buf, own).start()  # USER LINE

    def later() -> None:
        handle.wait()

    del later


@_seed(sd.HandleWaitedTwiceError)
def t8_an_alias_of_a_handle_waited_again(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handle = sd.LocalCopy(x, buf, own).start()
    alias = handle
    alias.wait()
    handle.wait()  # USER LINE


@_seed(sd.HandleWaitedTwiceError)
def t8_handles_from_a_helper_tuple_waited_again(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    def both() -> tuple[Any, Any]:
        first = sd.LocalCopy(x.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], own).start()
        return first, sd.LocalCopy(x.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], own).start()

    pair = both()
    for handle in pair:
        handle.wait()
    pair[0].wait()  # USER LINE


@_seed(sd.HandleEscapedError)
def escaped_from_a_fori_loop_closure(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    handles: list[Any] = []

    def body(i: jax.Array, carry: int) -> int:
        handles.append(sd.LocalCopy(x.at[pl.ds(i * 8, 8)], buf.at[pl.ds(i * 8, 8)], own).start())
        return carry

    jax.lax.fori_loop(0, 2, body, 0)
    handles[0].wait()  # USER LINE


@_seed(sd.HandleEscapedError)
def escaped_from_a_cond_branch(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    box: list[Any] = []

    def first() -> None:
        box.append(sd.LocalCopy(x, buf, own).start())

    jax.lax.cond(sd.my_index("x") == 0, first, lambda: None)
    box[0].wait()  # USER LINE


@_seed(sd.SemaphoreIndexError)
def index_from_a_loop_bound_one_too_far(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    for offset in range(1, N + 1):
        _to(x, o, ss, rs, offset).start().wait()  # USER LINE


@_seed(sd.MissingCollectiveIdError)
def t9_barrier_in_a_partial_run_scoped(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    @functools.partial(sd.run_scoped, flag=sd.regular_semaphore())
    def _(flag: Any) -> None:
        barrier = sd.barrier_semaphore()  # USER LINE
        sd.signal(barrier, device=sd.neighbour("x"))
        sd.wait(barrier)


def _user_line(kernel: Callable[..., None]) -> int:
    return line_in(kernel, "# USER LINE")


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seeded_mistake_is_stopped_at_the_users_line(name: str) -> None:
    error, kernel, scratch = SEEDS[name]
    mesh = _mesh()
    collective_id = None if error is sd.MissingCollectiveIdError else 0
    body = functools.partial(kernel, rows=8) if "partial_kernel" in name else kernel

    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=scratch,
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(x)
        return out

    with pytest.raises(error) as err:
        jax.eval_shape(sharded(per_device, mesh), _x(mesh))
    line = _user_line(kernel)
    in_message = f"{__file__}:{line}" in str(err.value)
    frames = [
        f.lineno for f in traceback.extract_tb(err.value.__traceback__) if f.filename == __file__
    ]
    assert in_message or line in frames, (line, frames, str(err.value))


def test_helper_callers_are_named_up_to_the_checked_wrapper_only() -> None:
    from safedma import _describe

    def body(x_ref: sd.DataRef) -> None:
        del x_ref

    wrapper = sd.checked(body)
    assert wrapper.__code__.co_name == _describe._WRAPPER_FUNCTION
    assert wrapper.__globals__["__name__"] == _describe._WRAPPER_MODULE

    def helper() -> Any:
        return _describe.call_site()

    def outside_any_kernel() -> Any:
        return helper()

    assert outside_any_kernel().via == ()  # no checked wrapper above: the line alone
