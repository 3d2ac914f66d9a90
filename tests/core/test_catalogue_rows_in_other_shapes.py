"""The T-rows of docs/catalogue.md (and the S-rows' trace-time backups) in shapes the row
tests do not use.

Each mistake is written with the typed API where a miss is plausible: inside
``lax.cond`` / ``while_loop`` / ``pl.loop`` / nested ``fori_loop`` bodies, under
``pl.when``, in ``run_scoped`` blocks and helpers, through ``.reshape`` / ``.bitcast`` /
``.at`` views, on N-D semaphore arrays with traced indices, in ``sd.core_kernel`` over
a TensorCore mesh, in an ``emit_pipeline`` body, with scalar-prefetch trip counts and
on a 2-D mesh with dict device ids. Tracing must raise the row's safedma error, name
the line marked ``# fix: <case>`` (in the message or as the frame that raised) and the
fix. The correct twins at the end must trace.
"""

from __future__ import annotations

import re
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
from tests.support.source_lines import marker_line, raising_lines
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
