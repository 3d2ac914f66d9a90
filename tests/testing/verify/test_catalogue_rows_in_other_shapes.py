"""The R-rows of docs/catalogue.md in shapes the row tests do not use.

Each mistake is put where a miss is plausible: inside ``fori_loop`` / ``while_loop`` /
``pl.loop`` (static and SMEM-read trip counts), under ``pl.when`` with a device-dependent
predicate, in a ``run_scoped`` block or a helper, through ``.reshape`` / ``.bitcast`` /
``.at`` views, on N-D semaphore arrays with traced indices, with scalar-prefetch values,
across DMA futures (two ``pallas_call`` s), on a 2-D mesh with dict device ids, and with
``invocations=2``. ``verify`` must reject each with the error class of its row, the
device, and this file's line (marked ``# fix: <case>``); the correct twins beside them
must verify clean (a false alarm is as bad as a miss).
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
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import (
    DeadlockError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SemaphoreIndexError,
    SignalAfterExitError,
    UnwrittenReadError,
    abstract_mesh,
    verify,
)
from tests.support.source_lines import marker_line

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
BLOCK = (16, 128)
DMA = pltpu.SemaphoreType.DMA
REG = pltpu.SemaphoreType.REGULAR
HERE = __file__
ANY_DEVICE = r"device \d \(x=\d\)"  # a symmetric mistake: whichever device the walk meets first


def _on(k: int) -> str:
    return re.escape(f"device {k} (x={k})")


def _vmem(*shape: int) -> Any:
    return pltpu.VMEM(shape or BLOCK, F32)


def _ring(shift: int = 1) -> dict[str, Any]:
    me, n = lax.axis_index("x"), lax.axis_size("x")
    return {"x": (me + shift + n) % n}


def _remote(src: Any, dst: Any, send: Any, recv: Any, shift: int = 1) -> Any:
    return pltpu.make_async_remote_copy(src, dst, send, recv, device_id=_ring(shift))


def _run(
    kernel: Callable[..., None],
    scratch: list[Any],
    *,
    n: int = 4,
    invocations: int = 1,
    grid: tuple[int, ...] | None = None,
    collective_id: int | None = None,
    prefetch: list[int] | None = None,
    typed: bool = False,
) -> Any:
    """``verify`` of ``kernel`` (x_ref, o_ref: one device's (16, 128) f32 in HBM, then the
    scratch; the scalar-prefetch ref first when ``prefetch``) on a ring of ``n``."""
    call: Any = sd.pallas_call if typed else pl.pallas_call
    options: dict[str, Any] = {}
    if collective_id is not None:
        options["compiler_params"] = pltpu.CompilerParams(collective_id=collective_id)

    def per_device(x: jax.Array) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        if prefetch is not None:
            spec = pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=grid or (),
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=scratch,
            )
            if typed:
                return call(kernel, out, grid_spec=spec, **options)(
                    jnp.array(prefetch, jnp.int32), x
                )
            return call(kernel, out_shape=out, grid_spec=spec, **options)(
                jnp.array(prefetch, jnp.int32), x
            )
        if grid is not None:
            options["grid"] = grid
        if typed:
            f = call(kernel, out, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch, **options)
        else:
            f = call(
                kernel,
                out_shape=out,
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=scratch,
                **options,
            )
        return f(x)

    x = jax.ShapeDtypeStruct((n * BLOCK[0], BLOCK[1]), F32)
    mesh = abstract_mesh((n,), ("x",))
    return verify(
        per_device, x, mesh=mesh, in_specs=P("x"), out_specs=P("x"), invocations=invocations
    )


# =========================================================== the mistakes, raw pltpu


def r1_fori_read_before_wait() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        def body(i, c):  # type: ignore[no-untyped-def]
            rows = pl.ds(i * 8, 8)
            cp = pltpu.make_async_copy(x.at[rows], buf.at[rows], sem)
            cp.start()
            res[rows] = buf[rows]  # fix: r1_fori_read_before_wait
            cp.wait()
            return c

        lax.fori_loop(0, 2, body, 0)
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(), _vmem(), DMA])


def r1_through_reshape_views() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        cp = pltpu.make_async_copy(x.reshape(2, 8, 128), buf.reshape(2, 8, 128), sem)
        cp.start()
        res[...] = buf[...]  # fix: r1_through_reshape_views
        cp.wait()
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(), _vmem(), DMA])


def r1_through_bitcast_views() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        cp = pltpu.make_async_copy(x.bitcast(jnp.int32), buf.bitcast(jnp.int32), sem)
        cp.start()
        res[...] = buf[...]  # fix: r1_through_bitcast_views
        cp.wait()
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(), _vmem(), DMA])


def r1_on_one_device_under_when() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        cp = pltpu.make_async_copy(x, buf, sem)
        cp.start()
        me = lax.axis_index("x")

        @pl.when(me == 2)
        def _() -> None:
            res[...] = buf[...]  # fix: r1_on_one_device_under_when

        @pl.when(me != 2)
        def _() -> None:
            res[...] = jnp.zeros(BLOCK, F32)

        cp.wait()
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(), _vmem(), DMA])


def r1_send_source_overwritten_on_one_device() -> Any:
    def k(x, o, buf, recv, send, recv_sem):  # type: ignore[no-untyped-def]
        pltpu.sync_copy(x, buf)
        cp = _remote(buf, recv, send, recv_sem)
        cp.start()

        @pl.when(lax.axis_index("x") == 1)
        def _() -> None:
            buf[...] = jnp.zeros(BLOCK, F32)  # fix: r1_send_source_overwritten_on_one_device

        cp.wait_send()
        cp.wait_recv()
        pltpu.sync_copy(recv, o)

    return _run(k, [_vmem(), _vmem(), DMA, DMA])


def r1_in_run_scoped() -> Any:
    def k(x, o):  # type: ignore[no-untyped-def]
        def body(buf, sem, res):  # type: ignore[no-untyped-def]
            cp = pltpu.make_async_copy(x, buf, sem)
            cp.start()
            res[...] = buf[...]  # fix: r1_in_run_scoped
            cp.wait()
            pltpu.sync_copy(res, o)

        pl.run_scoped(body, _vmem(), DMA, _vmem())

    return _run(k, [])


def r1_helper_on_a_2d_semaphore_array() -> Any:
    def fetch(src, dst, sem):  # type: ignore[no-untyped-def]
        c = pltpu.make_async_copy(src, dst, sem)
        c.start()
        return c

    def k(x, o, buf, res, sems):  # type: ignore[no-untyped-def]
        d = lax.axis_index("x") % 2
        copies = [fetch(x.at[pl.ds(j * 8, 8)], buf.at[j], sems.at[d, j]) for j in range(2)]
        copies[0].wait()
        res[...] = jnp.concatenate([buf[0], buf[1]])  # fix: r1_helper_on_a_2d_semaphore_array
        copies[1].wait()
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(2, 8, 128), _vmem(), DMA((2, 2))])


def r2_signals_in_a_loop_of_smem_trip_count() -> Any:
    def k(n_ref, x, o, sem):  # type: ignore[no-untyped-def]
        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            pl.semaphore_signal(sem, 1)  # fix: r2_signals_in_a_loop_of_smem_trip_count

        pl.semaphore_wait(sem, 2)
        pltpu.sync_copy(x, o)

    return _run(k, [REG], prefetch=[3])


def r2_signal_on_one_device() -> Any:
    def k(x, o, sem):  # type: ignore[no-untyped-def]
        @pl.when(lax.axis_index("x") == 3)
        def _() -> None:
            pl.semaphore_signal(sem, 1)  # fix: r2_signal_on_one_device

        pltpu.sync_copy(x, o)

    return _run(k, [REG])


def r2_signal_waited_in_part_on_a_2d_array() -> Any:
    def k(x, o, sems):  # type: ignore[no-untyped-def]
        slot = sems.at[lax.axis_index("x") % 2, 1]
        pl.semaphore_signal(slot, 2)  # fix: r2_signal_waited_in_part_on_a_2d_array
        pl.semaphore_wait(slot, 1)  # fix: r2_signal_waited_in_part_on_a_2d_array
        pltpu.sync_copy(x, o)

    return _run(k, [REG((2, 2))])


def r2_copy_waited_in_part() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        pltpu.make_async_copy(x, buf, sem).start()  # fix: r2_copy_waited_in_part
        half = pl.ds(0, 8)
        pltpu.make_async_copy(x.at[half], buf.at[half], sem).wait()  # fix: r2_copy_waited_in_part
        pltpu.sync_copy(x, o)

    return _run(k, [_vmem(), DMA])


def r3_send_skipped_on_one_device() -> Any:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        cp = _remote(x, o, send, recv)

        @pl.when(lax.axis_index("x") != 0)
        def _() -> None:
            cp.start()
            cp.wait_send()

        cp.wait_recv()  # fix: r3_send_skipped_on_one_device

    return _run(k, [DMA, DMA])


def r3_barrier_over_waited_in_a_loop() -> Any:
    def k(x, o):  # type: ignore[no-untyped-def]
        barrier = pltpu.get_barrier_semaphore()

        def body(i, c):  # type: ignore[no-untyped-def]
            pl.semaphore_signal(barrier, 1, device_id=_ring())
            pl.semaphore_wait(barrier, 2)  # fix: r3_barrier_over_waited_in_a_loop
            return c

        lax.fori_loop(0, 2, body, 0)
        pltpu.sync_copy(x, o)

    return _run(k, [], collective_id=0)


def r3_while_loop_of_smem_trip_count() -> Any:
    def k(n_ref, x, o, sem):  # type: ignore[no-untyped-def]
        def body(i):  # type: ignore[no-untyped-def]
            pl.semaphore_wait(sem, 1)  # fix: r3_while_loop_of_smem_trip_count
            return i + 1

        pl.semaphore_signal(sem, 2)
        lax.while_loop(lambda i: i < n_ref[0], body, 0)
        pltpu.sync_copy(x, o)

    return _run(k, [REG], prefetch=[3])


def r4_grid_step_copy_never_waited_at_the_last_step() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        i = pl.program_id(0)
        rows = pl.ds(i * 8, 8)
        cp = pltpu.make_async_copy(x.at[rows], buf.at[rows], sem)
        cp.start()  # fix: r4_grid_step_copy_never_waited_at_the_last_step

        @pl.when(i > 0)
        def _() -> None:
            pltpu.make_async_copy(x.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], sem).wait()

    return _run(k, [_vmem(), DMA], grid=(2,))


def r5_traced_index_on_a_2d_array() -> Any:
    def k(x, o, sems):  # type: ignore[no-untyped-def]
        me = lax.axis_index("x")
        c = pltpu.make_async_copy(x, o, sems.at[me % 2, me])
        c.start()  # fix: r5_traced_index_on_a_2d_array
        c.wait()

    return _run(k, [DMA((2, 3))])


def r5_next_slot_in_a_fori_loop() -> Any:
    def k(x, o, sems):  # type: ignore[no-untyped-def]
        def body(i, c):  # type: ignore[no-untyped-def]
            rows = pl.ds(i * 8, 8)
            cp = pltpu.make_async_copy(x.at[rows], o.at[rows], sems.at[i + 1])
            cp.start()  # fix: r5_next_slot_in_a_fori_loop
            cp.wait()
            return c

        lax.fori_loop(0, 2, body, 0)

    return _run(k, [DMA((2,))])


def r5_scalar_prefetch_index() -> Any:
    def k(s_ref, x, o, sems):  # type: ignore[no-untyped-def]
        c = pltpu.make_async_copy(x, o, sems.at[s_ref[0]])
        c.start()  # fix: r5_scalar_prefetch_index
        c.wait()

    return _run(k, [DMA((2,))], prefetch=[2])


def r5_remote_receive_slot_per_device() -> Any:
    def k(x, o, send, recvs):  # type: ignore[no-untyped-def]
        cp = _remote(x, o, send, recvs.at[lax.axis_index("x")])
        cp.start()  # fix: r5_remote_receive_slot_per_device
        cp.wait()

    return _run(k, [DMA, DMA((3,))])


def r6_remote_copy_of_a_buffer_one_device_skips() -> Any:
    def k(x, o, buf, send, recv):  # type: ignore[no-untyped-def]
        @pl.when(lax.axis_index("x") != 1)
        def _() -> None:
            pltpu.sync_copy(x, buf)

        cp = _remote(buf, o, send, recv)
        cp.start()  # fix: r6_remote_copy_of_a_buffer_one_device_skips
        cp.wait()

    return _run(k, [_vmem(), DMA, DMA])


def r6_half_written_through_a_view() -> Any:
    def k(x, o, buf):  # type: ignore[no-untyped-def]
        pltpu.sync_copy(x.at[pl.ds(0, 8)], buf.reshape(2, 8, 128).at[0])
        pltpu.sync_copy(buf, o)  # fix: r6_half_written_through_a_view

    return _run(k, [_vmem()])


def r6_loop_of_smem_trip_count_too_short() -> Any:
    def k(n_ref, x, o, buf):  # type: ignore[no-untyped-def]
        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            pltpu.sync_copy(x.at[pl.ds(i * 8, 8)], buf.at[pl.ds(i * 8, 8)])

        pltpu.sync_copy(buf, o)  # fix: r6_loop_of_smem_trip_count_too_short

    return _run(k, [_vmem()], prefetch=[1])


def r7_double_buffer_waits_the_other_slot() -> Any:
    def k(x, o, buf, res, sems):  # type: ignore[no-untyped-def]
        def fetch(j, slot):  # type: ignore[no-untyped-def]
            return pltpu.make_async_copy(x.at[pl.ds(j * 8, 8)], buf.at[slot], sems.at[slot])

        fetch(0, 0).start()

        def body(j, c):  # type: ignore[no-untyped-def]
            slot = j % 2

            @pl.when(j + 1 < 2)
            def _() -> None:
                fetch(j + 1, 1 - slot).start()

            fetch(j, 1 - slot).wait()  # the other slot: same bytes
            res[pl.ds(j * 8, 8)] = buf[slot]  # fix: r7_double_buffer_waits_the_other_slot
            return c

        lax.fori_loop(0, 2, body, 0)
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(2, 8, 128), _vmem(), DMA((2,))])


def r8_signal_one_device_never_waits() -> Any:
    def k(x, o, sem):  # type: ignore[no-untyped-def]
        pl.semaphore_signal(sem, 1, device_id=_ring())  # fix: r8_signal_one_device_never_waits

        @pl.when(lax.axis_index("x") != 1)
        def _() -> None:
            pl.semaphore_wait(sem, 1)

        pltpu.sync_copy(x, o)

    return _run(k, [REG])


def r9_copies_started_in_a_loop_on_one_semaphore() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        def body(j, c):  # type: ignore[no-untyped-def]
            pltpu.make_async_copy(x.at[pl.ds(j * 8, 8)], buf.at[j], sem).start()
            return c

        lax.fori_loop(0, 2, body, 0)
        pltpu.make_async_copy(x.at[pl.ds(0, 8)], buf.at[0], sem).wait()
        res[pl.ds(0, 8)] = buf[0]  # fix: r9_copies_started_in_a_loop_on_one_semaphore
        pltpu.make_async_copy(x.at[pl.ds(8, 8)], buf.at[1], sem).wait()
        res[pl.ds(8, 8)] = buf[1]
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(2, 8, 128), _vmem(), DMA])


def r9_receives_from_both_neighbours_on_one_semaphore() -> Any:
    def k(x, o, buf, res, send, recv):  # type: ignore[no-untyped-def]
        rows = x.at[pl.ds(0, 8)]
        for shift, slot in ((1, 0), (-1, 1)):
            _remote(rows, buf.at[slot], send, recv, shift).start()
        _remote(rows, buf.at[0], send, recv, 1).wait_recv()
        res[pl.ds(0, 8)] = buf[0]  # fix: r9_receives_from_both_neighbours_on_one_semaphore
        _remote(rows, buf.at[1], send, recv, -1).wait_recv()
        res[pl.ds(8, 8)] = buf[1]
        for shift in (1, -1):
            _remote(rows, buf.at[0], send, recv, shift).wait_send()
        pltpu.sync_copy(res, o)

    return _run(k, [_vmem(2, 8, 128), _vmem(), DMA, DMA])


def r10_barrier_half_under_when() -> Any:
    def k(x, o, send, recv):  # type: ignore[no-untyped-def]
        barrier = pltpu.get_barrier_semaphore()
        odd = lax.axis_index("x") % 2 == 1

        @pl.when(jnp.logical_not(odd))
        def _() -> None:
            pl.semaphore_signal(barrier, 1, device_id=_ring())

        @pl.when(odd)
        def _() -> None:
            pl.semaphore_wait(barrier, 1)

        cp = _remote(x, o, send, recv)
        cp.start()  # fix: r10_barrier_half_under_when
        cp.wait()

    return _run(k, [DMA, DMA], collective_id=0)


# ========================================================== the mistakes, typed safedma


def r1_typed_read_before_wait_in_pl_loop() -> Any:
    def k(x, o, buf, res, sem):  # type: ignore[no-untyped-def]
        @pl.loop(0, 2)
        def _(i: Any) -> None:
            rows = pl.ds(i * 8, 8)
            h = sd.LocalCopy(x.at[rows], buf.at[rows], sem).start()
            res[rows] = buf[rows]  # fix: r1_typed_read_before_wait_in_pl_loop
            h.wait()

        sd.LocalCopy(res, o, sem).start().wait()

    return _run(k, [_vmem(), _vmem(), DMA], typed=True)


def r2_typed_signal_waited_in_part() -> Any:
    def k(x, o, sem):  # type: ignore[no-untyped-def]
        sd.signal(sem, 2)  # fix: r2_typed_signal_waited_in_part
        sd.wait(sem, 1)  # fix: r2_typed_signal_waited_in_part
        pltpu.sync_copy(x, o)

    return _run(k, [sd.regular_semaphore()], typed=True)


def r5_typed_traced_index_on_a_2d_array() -> Any:
    def k(x, o, sems):  # type: ignore[no-untyped-def]
        me = sd.my_index("x")
        sd.LocalCopy(
            x, o, sems.at[me % 2, me]
        ).start().wait()  # fix: r5_typed_traced_index_on_a_2d_array

    return _run(k, [sd.dma_semaphores((2, 3))], typed=True)


def r7_typed_started_elsewhere_on_the_other_slot() -> Any:
    def k(x, o, buf, res, sems):  # type: ignore[no-untyped-def]
        def fetch(j, slot):  # type: ignore[no-untyped-def]
            return sd.LocalCopy(x.at[pl.ds(j * 8, 8)], buf.at[slot], sems.at[slot])

        fetch(0, 0).start()

        def body(j, c):  # type: ignore[no-untyped-def]
            slot = j % 2

            @pl.when(j + 1 < 2)
            def _() -> None:
                fetch(j + 1, 1 - slot).start()

            fetch(j, 1 - slot).started_elsewhere().wait()
            res[pl.ds(j * 8, 8)] = buf[slot]  # fix: r7_typed_started_elsewhere_on_the_other_slot
            return c

        lax.fori_loop(0, 2, body, 0)
        sd.LocalCopy(res, o, sems.at[0]).start().wait()

    return _run(k, [_vmem(2, 8, 128), _vmem(), sd.dma_semaphores((2,))], typed=True)


# --------------------------------------------------- DMA futures (two pallas_calls)

_X = jax.ShapeDtypeStruct(BLOCK, F32)


def _start(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()  # fix: future


def _done(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def _done_half(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.wait_bytes(sem, o_ref.at[pl.ds(0, 8)])  # fix: r2_future_waited_in_part


def r2_future_waited_in_part() -> Any:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        return sd.finish_async(_done_half, sd.start_async(_start, x, dst=_X))

    return verify(f, _X)


def r2_future_finished_in_one_branch() -> Any:
    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        return lax.cond(flag[0] > 0, lambda: sd.finish_async(_done, future), lambda: x)

    return verify(f, _X, jnp.array([0], jnp.int32))


def r2_future_carried_out_of_a_loop_and_dropped() -> Any:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        def step(i: Any, future: sd.DmaFuture) -> sd.DmaFuture:
            return sd.start_async(_start, sd.finish_async(_done, future), dst=_X)

        lax.fori_loop(0, 2, step, sd.start_async(_start, x, dst=_X))
        return x

    return verify(f, _X)


def r1_future_buffer_read_before_it_is_finished() -> Any:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        early = future.buffer * 2  # fix: r1_future_buffer_read_before_it_is_finished
        return sd.finish_async(_done, future) + early

    return verify(f, _X)


def r1_future_buffer_read_after_the_done_kernel() -> Any:
    """Read after ``finish_async`` in program order, but of the start kernel's output:
    XLA orders by data only, so this read may still run before the done kernel."""

    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        done = sd.finish_async(_done, future)
        return done + future.buffer  # fix: r1_future_buffer_read_after_the_done_kernel

    return verify(f, _X)


def r1_raw_future_buffer_read() -> Any:
    """The raw pair (jax's async-copy tests): the semaphore and buffer as outputs."""

    def start(x_ref, aliased, o_ref, sem):  # type: ignore[no-untyped-def]
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    def done(x_ref, o_ref, sem, o2):  # type: ignore[no-untyped-def]
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)

    def f(x: jax.Array) -> jax.Array:
        x2, buf, sem = pl.pallas_call(
            start,
            out_shape=(_X, _X, pltpu.SemaphoreType.DMA(())),
            in_specs=[ANY],
            out_specs=(ANY, ANY, sem_spec),
            input_output_aliases={0: 0},
        )(x)
        peek = jnp.sum(buf)  # fix: r1_raw_future_buffer_read
        out = pl.pallas_call(
            done,
            out_shape=_X,
            in_specs=[ANY, ANY, sem_spec],
            out_specs=ANY,
            input_output_aliases={1: 0},
        )(x2, buf, sem)
        return out + peek

    return verify(f, _X)


def _copy_kernel(buffer: jax.Array) -> jax.Array:
    """A kernel that reads ``buffer`` (a plain copy of it into its output)."""

    def k(x_ref: Any, o_ref: Any) -> None:
        pltpu.sync_copy(x_ref, o_ref)  # fix: copy_kernel

    return pl.pallas_call(k, out_shape=_X, in_specs=[ANY], out_specs=ANY)(buffer)  # fix: copy_call


def r1_future_buffer_to_another_kernel_after_the_done_kernel() -> Any:
    """Listed after the done kernel, the walk finds the copy settled; but this kernel
    depends on the start kernel only, so XLA may run it first."""

    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        done = sd.finish_async(_done, future)
        return done + _copy_kernel(future.buffer)  # fix: future_buffer_to_a_kernel

    return verify(f, _X)


def r1_future_buffer_to_another_kernel_before_the_done_kernel() -> Any:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        early = _copy_kernel(future.buffer)
        return sd.finish_async(_done, future) + early

    return verify(f, _X)


_BUGS: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    # name: (kernel, error class, the device the message names: a regex)
    "r1_fori_read_before_wait": (r1_fori_read_before_wait, RaceDetectedError, ANY_DEVICE),
    "r1_through_reshape_views": (r1_through_reshape_views, RaceDetectedError, ANY_DEVICE),
    "r1_through_bitcast_views": (r1_through_bitcast_views, RaceDetectedError, ANY_DEVICE),
    "r1_on_one_device_under_when": (
        r1_on_one_device_under_when,
        RaceDetectedError,
        _on(2),
    ),
    "r1_send_source_overwritten_on_one_device": (
        r1_send_source_overwritten_on_one_device,
        RaceDetectedError,
        _on(1),
    ),
    "r1_in_run_scoped": (r1_in_run_scoped, RaceDetectedError, ANY_DEVICE),
    "r1_helper_on_a_2d_semaphore_array": (
        r1_helper_on_a_2d_semaphore_array,
        RaceDetectedError,
        ANY_DEVICE,
    ),
    "r2_signals_in_a_loop_of_smem_trip_count": (
        r2_signals_in_a_loop_of_smem_trip_count,
        LeftoverSemaphoreError,
        ANY_DEVICE,
    ),
    "r2_signal_on_one_device": (r2_signal_on_one_device, LeftoverSemaphoreError, _on(3)),
    "r2_signal_waited_in_part_on_a_2d_array": (
        r2_signal_waited_in_part_on_a_2d_array,
        LeftoverSemaphoreError,
        ANY_DEVICE,
    ),
    "r2_copy_waited_in_part": (r2_copy_waited_in_part, LeftoverSemaphoreError, ANY_DEVICE),
    "r3_send_skipped_on_one_device": (
        r3_send_skipped_on_one_device,
        DeadlockError,
        _on(1),
    ),
    "r3_barrier_over_waited_in_a_loop": (
        r3_barrier_over_waited_in_a_loop,
        DeadlockError,
        ANY_DEVICE,
    ),
    "r3_while_loop_of_smem_trip_count": (
        r3_while_loop_of_smem_trip_count,
        DeadlockError,
        ANY_DEVICE,
    ),
    "r4_grid_step_copy_never_waited_at_the_last_step": (
        r4_grid_step_copy_never_waited_at_the_last_step,
        LeftoverSemaphoreError,
        ANY_DEVICE,
    ),
    "r5_traced_index_on_a_2d_array": (
        r5_traced_index_on_a_2d_array,
        SemaphoreIndexError,
        _on(3),
    ),
    "r5_next_slot_in_a_fori_loop": (
        r5_next_slot_in_a_fori_loop,
        SemaphoreIndexError,
        ANY_DEVICE,
    ),
    "r5_scalar_prefetch_index": (r5_scalar_prefetch_index, SemaphoreIndexError, ANY_DEVICE),
    "r5_remote_receive_slot_per_device": (
        r5_remote_receive_slot_per_device,
        SemaphoreIndexError,
        _on(3),
    ),
    "r6_remote_copy_of_a_buffer_one_device_skips": (
        r6_remote_copy_of_a_buffer_one_device_skips,
        UnwrittenReadError,
        _on(2),
    ),
    "r6_half_written_through_a_view": (
        r6_half_written_through_a_view,
        UnwrittenReadError,
        ANY_DEVICE,
    ),
    "r6_loop_of_smem_trip_count_too_short": (
        r6_loop_of_smem_trip_count_too_short,
        UnwrittenReadError,
        ANY_DEVICE,
    ),
    "r7_double_buffer_waits_the_other_slot": (
        r7_double_buffer_waits_the_other_slot,
        RaceDetectedError,
        ANY_DEVICE,
    ),
    "r8_signal_one_device_never_waits": (
        r8_signal_one_device_never_waits,
        LeftoverSemaphoreError,
        _on(1),
    ),
    "r9_copies_started_in_a_loop_on_one_semaphore": (
        r9_copies_started_in_a_loop_on_one_semaphore,
        RaceDetectedError,
        ANY_DEVICE,
    ),
    "r9_receives_from_both_neighbours_on_one_semaphore": (
        r9_receives_from_both_neighbours_on_one_semaphore,
        RaceDetectedError,
        _on(2),
    ),
    "r10_barrier_half_under_when": (
        r10_barrier_half_under_when,
        SignalAfterExitError,
        ANY_DEVICE,
    ),
    "r1_typed_read_before_wait_in_pl_loop": (
        r1_typed_read_before_wait_in_pl_loop,
        RaceDetectedError,
        ANY_DEVICE,
    ),
    "r2_typed_signal_waited_in_part": (
        r2_typed_signal_waited_in_part,
        LeftoverSemaphoreError,
        ANY_DEVICE,
    ),
    "r5_typed_traced_index_on_a_2d_array": (
        r5_typed_traced_index_on_a_2d_array,
        SemaphoreIndexError,
        _on(3),
    ),
    "r7_typed_started_elsewhere_on_the_other_slot": (
        r7_typed_started_elsewhere_on_the_other_slot,
        RaceDetectedError,
        ANY_DEVICE,
    ),
    "r2_future_waited_in_part": (r2_future_waited_in_part, LeftoverSemaphoreError, r"device 0\b"),
    "r2_future_finished_in_one_branch": (
        r2_future_finished_in_one_branch,
        LeftoverSemaphoreError,
        r"device 0\b",
    ),
    "r2_future_carried_out_of_a_loop_and_dropped": (
        r2_future_carried_out_of_a_loop_and_dropped,
        LeftoverSemaphoreError,
        r"device 0\b",
    ),
    "r1_future_buffer_read_before_it_is_finished": (
        r1_future_buffer_read_before_it_is_finished,
        RaceDetectedError,
        r"device 0\b",
    ),
    "r1_future_buffer_read_after_the_done_kernel": (
        r1_future_buffer_read_after_the_done_kernel,
        RaceDetectedError,
        r"device 0\b",
    ),
    "r1_raw_future_buffer_read": (r1_raw_future_buffer_read, RaceDetectedError, r"device 0\b"),
    "r1_future_buffer_to_another_kernel_after_the_done_kernel": (
        r1_future_buffer_to_another_kernel_after_the_done_kernel,
        RaceDetectedError,
        r"device 0\b",
    ),
    "r1_future_buffer_to_another_kernel_before_the_done_kernel": (
        r1_future_buffer_to_another_kernel_before_the_done_kernel,
        RaceDetectedError,
        r"device 0\b",
    ),
}

# The line each message must name: the marked line, or (future cases whose mistake is in
# the program around the kernels but whose leftover is the copy's) the start's line.
_NAMED = {
    # the race is found inside the reading kernel (its copy-in line, in _copy_kernel),
    # or at that kernel's call (its pallas_call, called at the marked line)
    "r1_future_buffer_to_another_kernel_after_the_done_kernel": "# fix: copy_call",
    "r1_future_buffer_to_another_kernel_before_the_done_kernel": "# fix: copy_kernel",
    "r2_future_finished_in_one_branch": "# fix: future",
    "r2_future_carried_out_of_a_loop_and_dropped": "# fix: future",
}


@pytest.mark.parametrize("case", sorted(_BUGS))
def test_verify_catches_the_mistake_and_names_device_and_line(case: str) -> None:
    kernel, error, device = _BUGS[case]
    with pytest.raises(error) as caught:
        kernel()
    text = str(caught.value)
    line = marker_line(HERE, _NAMED.get(case, f"# fix: {case}"))
    assert re.search(rf"test_catalogue_rows_in_other_shapes\.py:{line}\b", text), (line, text)
    assert re.search(device, text), text


def test_a_signal_waited_in_part_names_the_wait_and_the_signal() -> None:
    """The count left in the credit (no pending signal names it) is traced to the wait
    that took less than the signal it counted."""
    with pytest.raises(LeftoverSemaphoreError) as caught:
        r2_signal_waited_in_part_on_a_2d_array()
    signal, wait = (
        marker_line(HERE, "# fix: r2_signal_waited_in_part_on_a_2d_array") + d for d in (0, 1)
    )
    text = str(caught.value)
    assert re.search(
        rf"the wait at \S*test_catalogue_rows_in_other_shapes\.py:{wait} .*took 1 of the 2 brought by a signal "
        rf"at \S*test_catalogue_rows_in_other_shapes\.py:{signal}\b",
        text,
    ), text


def test_a_copy_waited_in_part_names_the_wait_and_the_copy() -> None:
    with pytest.raises(LeftoverSemaphoreError) as caught:
        r2_copy_waited_in_part()
    start = marker_line(HERE, "# fix: r2_copy_waited_in_part")
    text = str(caught.value)
    assert re.search(
        rf"the wait at \S*test_catalogue_rows_in_other_shapes\.py:{start + 2} .*took 4096 bytes of the 8192 "
        rf"bytes brought by the copy started at \S*test_catalogue_rows_in_other_shapes\.py:{start}\b",
        text,
    ), text


def test_a_future_waited_in_part_names_the_done_kernels_wait() -> None:
    with pytest.raises(LeftoverSemaphoreError) as caught:
        r2_future_waited_in_part()
    text = str(caught.value)
    assert "a DMA future) was waited only in part: the wait at" in text, text
    assert "never waited by a later one" not in text, text
    assert re.search(
        rf"test_catalogue_rows_in_other_shapes\.py:{marker_line(HERE, '# fix: future')}\b", text
    )


def test_a_future_buffer_read_outside_a_kernel_names_the_fix() -> None:
    with pytest.raises(RaceDetectedError) as caught:
        r1_future_buffer_read_before_it_is_finished()
    text = str(caught.value)
    assert "reads it outside any kernel while the copy started at" in text, text
    assert "finish_async's result" in text, text


# ======================================================= correct twins: no false alarm


def ok_waits_in_both_branches_of_a_device_dependent_cond() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x, buf, sem).start()
        lax.cond(sd.my_index("x") % 2 == 0, h.wait, h.wait)
        sd.LocalCopy(buf, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], typed=True)


def ok_waits_under_when_and_its_negation() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x, buf, sem).start()
        c = sd.my_index("x") == 1
        pl.when(c)(h.wait)
        pl.when(jnp.logical_not(c))(h.wait)
        sd.LocalCopy(buf, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], typed=True)


def ok_zero_size_copies_in_a_loop_of_smem_bound() -> Any:
    def k(n_ref, x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(i, c):  # type: ignore[no-untyped-def]
            n = jnp.where(i < n_ref[0], 8, 0)
            sd.LocalCopy(x.at[pl.ds(i * 8, n)], buf.at[pl.ds(i * 8, n)], sem).start().wait()
            return c

        lax.fori_loop(0, 2, body, 0)
        sd.LocalCopy(x, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], prefetch=[1], typed=True)


def ok_starts_in_one_smem_loop_waits_in_the_next() -> Any:
    def k(n_ref, x, o, buf, sems):  # type: ignore[no-untyped-def]
        def copy(i):  # type: ignore[no-untyped-def]
            rows = pl.ds(i * 8, 8)
            return sd.LocalCopy(x.at[rows], buf.at[rows], sems.at[i])

        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            copy(i).start()

        @pl.loop(0, n_ref[0])
        def _(i: Any) -> None:
            copy(i).started_elsewhere().wait()

        sd.LocalCopy(buf, o, sems.at[0]).start().wait()

    return _run(k, [_vmem(), sd.dma_semaphores((2,))], prefetch=[2], typed=True)


def ok_double_buffer_on_a_2d_array_with_a_traced_row() -> Any:
    def k(x, o, buf, sems):  # type: ignore[no-untyped-def]
        d = sd.my_index("x") % 2

        def fetch(j, slot):  # type: ignore[no-untyped-def]
            return sd.LocalCopy(x.at[pl.ds(j * 8, 8)], buf.at[slot], sems.at[d, slot])

        fetch(0, 0).start()

        def body(j, c):  # type: ignore[no-untyped-def]
            slot = j % 2

            @pl.when(j + 1 < 2)
            def _() -> None:
                fetch(j + 1, 1 - slot).start()

            fetch(j, slot).started_elsewhere().wait()
            sd.LocalCopy(buf.at[slot], o.at[pl.ds(j * 8, 8)], sems.at[d, 2]).start().wait()
            return c

        lax.fori_loop(0, 2, body, 0)

    return _run(k, [_vmem(2, 8, 128), sd.dma_semaphores((2, 3))], typed=True)


def ok_copies_through_reshape_and_bitcast_views() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        sd.LocalCopy(x.reshape(2, 8, 128), buf.reshape(2, 8, 128), sem).start().wait()
        sd.LocalCopy(buf.bitcast(jnp.int32), o.bitcast(jnp.int32), sem).start().wait()

    return _run(k, [_vmem(), DMA], typed=True)


def ok_ring_in_run_scoped_twice() -> Any:
    def k(x, o):  # type: ignore[no-untyped-def]
        def body(send, recv):  # type: ignore[no-untyped-def]
            copy = sd.RemoteCopy(x, o, recv).with_send_sem(send).to(sd.neighbour("x"))
            copy.start().wait()

        sd.run_scoped(body, sd.dma_semaphore(), sd.dma_semaphore())

    return _run(k, [], invocations=2, typed=True)


def ok_two_barrier_rounds_twice() -> Any:
    def k(x, o, send, recv, second):  # type: ignore[no-untyped-def]
        for sem in (sd.barrier_semaphore(), second):
            sd.signal(sem, 1, device=sd.neighbour("x", 1))
            sd.signal(sem, 1, device=sd.neighbour("x", -1))
            sd.wait(sem, 2)
        sd.RemoteCopy(x, o, recv).with_send_sem(send).to(sd.neighbour("x")).start().wait()

    scratch = [sd.dma_semaphore(), sd.dma_semaphore(), sd.regular_semaphore()]
    return _run(k, scratch, invocations=2, collective_id=0, typed=True)


def ok_aggregate_wait_of_copies_started_in_a_loop() -> Any:
    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        @pl.loop(0, 2)
        def _(j: Any) -> None:
            rows = pl.ds(j * 8, 8)
            sd.LocalCopy(x.at[rows], buf.at[rows], sem).start()

        sd.wait_all_into(buf, sem)
        sd.LocalCopy(buf, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], typed=True)


def ok_wait_in_a_while_loop_of_smem_bound() -> Any:
    def k(n_ref, x, o, buf, sem):  # type: ignore[no-untyped-def]
        def body(i):  # type: ignore[no-untyped-def]
            rows = pl.ds(i * 8, 8)
            sd.LocalCopy(x.at[rows], buf.at[rows], sem).start().wait()
            return i + 1

        lax.while_loop(lambda i: i < n_ref[0], body, 0)
        sd.LocalCopy(buf, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], prefetch=[2], typed=True)


def _on_2x4(kernel: Callable[..., None]) -> Any:
    def per_device(x: jax.Array) -> Any:
        scratch = [pltpu.VMEM(x.shape, F32), sd.dma_semaphore(), sd.dma_semaphore()]
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return sd.pallas_call(kernel, out, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch)(x)

    x = jax.ShapeDtypeStruct((2 * BLOCK[0], 4 * BLOCK[1]), F32)
    mesh = abstract_mesh((2, 4), ("x", "y"))
    return verify(per_device, x, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))


def ok_dict_device_ids_on_a_2d_mesh_into_vmem() -> Any:
    def k(x, o, buf, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=(sd.my_index("x") + 1) % 2, y=sd.my_index("y"))
        sd.RemoteCopy(x, buf, recv).with_send_sem(send).to(to).start().wait()
        sd.LocalCopy(buf, o, send).start().wait()

    return _on_2x4(k)


def ok_partial_dict_device_id_keeps_the_other_axis() -> Any:
    def k(x, o, buf, send, recv):  # type: ignore[no-untyped-def]
        to = sd.device(x=(sd.my_index("x") + 1) % 2)  # y: this device's own
        sd.RemoteCopy(x, buf, recv).with_send_sem(send).to(to).start().wait()
        sd.LocalCopy(buf, o, send).start().wait()

    return _on_2x4(k)


def ok_future_chain_through_a_loop_carry() -> Any:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        def step(i: Any, future: sd.DmaFuture) -> sd.DmaFuture:
            return sd.start_async(_start, sd.finish_async(_done, future), dst=_X)

        future = lax.fori_loop(0, 2, step, sd.start_async(_start, x, dst=_X))
        return sd.finish_async(_done, future) * 2

    return verify(f, _X)


def ok_future_result_and_sources_read_around_it() -> Any:
    """The sources stay valid while the copy reads them, and the done kernel's result
    is the buffer once waited: reading either outside a kernel is correct."""

    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        source = future.sources[0] + 1
        return sd.finish_async(_done, future) * 2 + source

    return verify(f, _X, invocations=2)


def ok_future_finished_in_each_branch_of_a_cond() -> Any:
    def done_by_size(x_ref: Any, o_ref: Any, sem: Any) -> None:
        sd.wait_bytes(sem, o_ref)

    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_start, x, dst=_X)
        return lax.cond(
            flag[0] > 0,
            lambda: sd.finish_async(_done, future),
            lambda: sd.finish_async(done_by_size, future) * 2,
        )

    verify(f, _X, jnp.array([0], jnp.int32))
    return verify(f, _X, jnp.array([1], jnp.int32))


_OK = sorted(name for name in globals() if name.startswith("ok_"))


@pytest.mark.parametrize("case", _OK)
def test_the_correct_twin_verifies_clean(case: str) -> None:
    report = globals()[case]()
    assert report.dmas >= 1, report


def t8_typed_wait_in_a_branch_then_after_it() -> Any:
    """Trace time leaves a wait in a branch plus one after it to verify (the branch may
    not run); on the devices where it runs the semaphore is waited twice."""

    def k(x, o, buf, sem):  # type: ignore[no-untyped-def]
        h = sd.LocalCopy(x, buf, sem).start()
        pl.when(sd.my_index("x") == 1)(h.wait)
        h.wait()  # fix: t8_typed_wait_in_a_branch_then_after_it
        sd.LocalCopy(buf, o, sem).start().wait()

    return _run(k, [_vmem(), DMA], typed=True)


def test_t8_left_to_verify_is_caught_on_the_device_that_waits_twice() -> None:
    with pytest.raises(DeadlockError) as caught:
        t8_typed_wait_in_a_branch_then_after_it()
    text = str(caught.value)
    line = marker_line(HERE, "# fix: t8_typed_wait_in_a_branch_then_after_it")
    assert re.search(rf"test_catalogue_rows_in_other_shapes\.py:{line}\b", text), text
    assert re.search(_on(1), text), text


def test_a_future_buffer_passed_to_a_kernel_without_its_semaphore_names_the_call() -> None:
    with pytest.raises(RaceDetectedError) as caught:
        r1_future_buffer_to_another_kernel_after_the_done_kernel()
    text = str(caught.value)
    line = marker_line(HERE, "# fix: future_buffer_to_a_kernel")
    assert f"called at test_catalogue_rows_in_other_shapes.py:{line} " in text, text
    assert "not the copy's semaphore" in text and "finish_async's result" in text, text
