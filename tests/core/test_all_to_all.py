"""Ragged all-to-alls: remote copies of sizes read from SMEM, waited by their totals.

* jax's ``pallas/ops/tpu/ragged_all_to_all.py`` (Dec 2024, since removed): each grid step
  starts one remote copy of a size read from SMEM (skipped when 0) and waits nothing; the
  last step waits the send and receive semaphores by the traced totals (``wait_bytes``);
* as a DMA future (google-deepmind/simply's ``moe_lib.py``, ``_ra2a_3d_kernel_async``): a
  start kernel that returns the output and a 3-D semaphore array, starting the sends to
  every other device and a local copy; a wait kernel that takes the semaphores and waits
  the sends, the receives and the local copy.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import (
    LeftoverSemaphoreError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_text,
    verify,
)
from tests.support.ring_twins import ALONG_X, sharded
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
SAFE, RAW = True, False


# --- a per-lane ring rotation between a window's lanes -----------------------------------

N = 4


# --- a ragged all-to-all: one remote copy per grid step, waited by totals at the end ------

GROUPS, GROUP_ROWS = 8, 16  # groups per device, and the most rows a device holds


def _all_to_all(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        x_hbm: Any,
        in_offsets: Any,
        in_sizes: Any,
        out_offsets: Any,
        total_sent: Any,
        total_received: Any,
        aliased: Any,
        o_hbm: Any,
        send_sem: Any,
        recv_sem: Any,
    ) -> None:
        del aliased  # the output, passed in to be written in place
        me = lax.axis_index("x")
        group = (pl.program_id(0) + me) % GROUPS
        target = (group // (GROUPS // N),)
        size = in_sizes[group]
        src = x_hbm.at[pl.ds(in_offsets[group], size)]
        dst = o_hbm.at[pl.ds(out_offsets[group], size)]
        if seed == "half_rows":  # T1: the destination half as wide, next to a traced size
            dst = o_hbm.at[pl.ds(out_offsets[group], size), pl.ds(0, 64)]
        if safe:
            copy = sd.RemoteCopy(src, dst, recv_sem).with_send_sem(send_sem)  # DESCRIBED
            started = copy.to(sd.mesh_coords(*target))
        else:
            started = pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=target)

        @pl.when(size > 0)
        def _start() -> None:
            started.start()  # STARTED

        @pl.when(pl.program_id(0) == GROUPS - 1)
        def _drain() -> None:
            # Copies sized by the totals wait every step's sends and receives.
            sent, received = total_sent[0], total_received[0]
            if not safe:

                def raw_total(rows: Any) -> Any:
                    return pltpu.make_async_remote_copy(
                        x_hbm.at[pl.ds(0, rows)],
                        o_hbm.at[pl.ds(0, rows)],
                        send_sem,
                        recv_sem,
                        device_id=target,
                    )

                raw_total(sent).wait_send()
                raw_total(received).wait_recv()
                return

            def total(rows: Any) -> sd.RemoteCopy[sd.Given, sd.Given]:
                whole = sd.RemoteCopy(x_hbm.at[pl.ds(0, rows)], o_hbm.at[pl.ds(0, rows)], recv_sem)
                return whole.with_send_sem(send_sem).to(sd.mesh_coords(*target))

            if seed != "send_drain_dropped":
                total(sent).started_elsewhere().wait_send()
            if seed == "recv_waited_as_send":
                total(received).started_elsewhere().wait_send()  # SEEDED
            else:
                total(received).incoming().wait_recv()

    return kernel


def _all_to_all_call(kernel: Callable[..., None], safe: bool) -> Any:
    def per_device(
        x: jax.Array,
        in_off: jax.Array,
        in_size: jax.Array,
        out_off: jax.Array,
        received: jax.Array,
        out: jax.Array,
    ) -> jax.Array:
        dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
        call = sd.pallas_call if safe else pl.pallas_call
        sent = in_size.sum(keepdims=True)
        result: jax.Array = call(
            kernel,
            jax.ShapeDtypeStruct(out.shape, out.dtype),
            grid=(GROUPS,),
            in_specs=[ANY, SMEM, SMEM, SMEM, SMEM, SMEM, ANY],
            out_specs=ANY,
            scratch_shapes=[dma, dma],
            input_output_aliases={6: 0},
        )(x, in_off, in_size, out_off, sent, received, out)
        return result

    return per_device


def _all_to_all_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    rows = sds((N * GROUP_ROWS, 128), jnp.float32)
    table = sds((N * GROUPS,), jnp.int32)
    return rows, table, table, table, sds((N,), jnp.int32), rows


def _a2a(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")  # jax 0.12 lowers `%` per generation
    return sharded(_all_to_all_call(_all_to_all(safe, seed), safe), mesh, (ALONG_X,) * 6), mesh


def test_ragged_all_to_all_waited_by_totals_matches_raw() -> None:
    ours, mesh = _a2a(SAFE)
    theirs, _ = _a2a(RAW)
    assert_same_mosaic(ours, theirs, *_all_to_all_args(mesh), mesh=mesh)


@pytest.mark.parametrize(
    ("seed", "never"),
    [("send_drain_dropped", "wait_send()"), ("recv_waited_as_send", "wait_recv()")],
)
def test_ragged_all_to_all_drain_missing_is_t7_naming_the_start(seed: str, never: str) -> None:
    broken, mesh = _a2a(SAFE, seed)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_all_to_all_args(mesh), mesh=mesh)
    message = str(err.value)
    start = line_in(_all_to_all, "# STARTED")
    assert f"started at {__file__}:{start}" in message, message
    assert f": {never} never called" in message, message
    # The fix names the missing side's waits, not a local handle.wait().
    assert f"handle.{never}" in message and "handle.wait()" not in message, message
    fix = "copy.incoming().wait_recv()" if never == "wait_recv()" else "wait_send() in a later"
    assert fix in message, message
    assert "1 copy was started" in message, message


def test_ragged_all_to_all_narrower_destination_is_t1_at_the_users_line() -> None:
    broken, mesh = _a2a(SAFE, "half_rows")
    with pytest.raises(sd.CopyShapeMismatchError, match=r"\(\?, 128\).*\(\?, 64\)") as err:
        mosaic_text(broken, *_all_to_all_args(mesh), mesh=mesh)
    assert line_in(_all_to_all, "# DESCRIBED") in raising_lines(err, __file__)


# --- a ragged all-to-all as a DMA future: sends started in one kernel, waited in another ---

SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
A2A_ROWS = 32


def _ra2a(safe: bool, start: bool, seed: str | None = None) -> Callable[..., None]:
    """One body for both kernels (google-deepmind/simply's ``_ra2a_3d_kernel_async``): the
    start kernel starts the sends to every other device and the local copy, on a 3-D
    semaphore array it returns; the wait kernel rebuilds them and waits the sends, the
    receives (never started here: another device's sends) and the local copy."""

    def body(
        src_ref: Any,
        out_ref: Any,
        in_off: Any,
        send_sizes: Any,
        out_off: Any,
        recv_sizes: Any,
        dst_ref: Any,
        sems: Any,
    ) -> None:
        del out_ref  # aliased in dst_ref
        me = lax.axis_index("x")

        def local() -> Any:
            sem = sems.at[lax.rem(me + me, N), 0, 1]
            src = src_ref.at[pl.ds(in_off[me], send_sizes[me])]
            dst = dst_ref.at[pl.ds(out_off[me], send_sizes[me])]
            return sd.LocalCopy(src, dst, sem) if safe else pltpu.make_async_copy(src, dst, sem)

        def remote(other: Any, send: bool) -> Any:
            src_id, dst_id = (me, other) if send else (other, me)
            size = lax.select(me == src_id, send_sizes[dst_id], recv_sizes[src_id])
            src = src_ref.at[pl.ds(in_off[dst_id], size)]
            dst = dst_ref.at[pl.ds(out_off[dst_id], size)]
            slot = lax.rem(me + other, N)
            direction = (src_id > dst_id).astype(jnp.int32)
            send_sem, recv_sem = sems.at[slot, direction, 0], sems.at[slot, direction, 1]
            if seed == "recv_on_the_pair" and not start:
                recv_sem = sems.at[slot, direction]
            if not safe:
                return pltpu.make_async_remote_copy(
                    src, dst, send_sem, recv_sem, device_id={"x": dst_id}
                )
            copy = sd.RemoteCopy(src, dst, recv_sem)  # DESCRIBED
            if seed == "unknown_axis":
                return copy.with_send_sem(send_sem).to(sd.device(y=dst_id))  # AXIS
            return copy.with_send_sem(send_sem).to(sd.device(x=dst_id))

        def barrier(sem: Any) -> None:
            for i in range(1, N):
                to = lax.rem(me + i, N)
                if safe:
                    sd.signal(sem, 1, device=sd.device(x=to))
                else:
                    pl.semaphore_signal(sem, inc=1, device_id={"x": to})
            if safe:
                sd.wait(sem, N - 1)
            else:
                pl.semaphore_wait(sem, N - 1)

        barrier(sd.barrier_semaphore() if safe else pltpu.get_barrier_semaphore())
        copy = local()
        others = [lax.rem(me + i, N) for i in range(1, N)]
        sends = [remote(other, send=True) for other in others]
        receives = [remote(other, send=False) for other in others]
        if start:
            for send in sends:
                send.start()  # STARTED
            if seed != "local_not_started":
                copy.start()
        elif not safe:
            for op in sends:
                op.wait_send()
            for op in receives:
                op.wait_recv()
            copy.wait()
        else:
            if seed != "send_waits_dropped":
                for send in sends:
                    send.started_elsewhere().wait_send()
            for receive in receives:
                if seed == "receive_waited_as_send":
                    receive.incoming().wait_send()  # WRONG SIDE
                else:
                    receive.incoming().wait_recv()
            copy.started_elsewhere().wait()

        scoped = sd.run_scoped if safe else pl.run_scoped
        regular = sd.regular_semaphore() if safe else pltpu.SemaphoreType.REGULAR
        scoped(barrier, regular)  # the second barrier, on a scoped REGULAR semaphore

    if start:
        return body

    def wait_kernel(*refs: Any) -> None:  # the semaphores come in before the output
        *operands, sems, dst_ref = refs
        body(*operands, dst_ref, sems)

    return wait_kernel


def _ra2a_calls(safe: bool, seed: str | None = None) -> Any:
    call = sd.pallas_call if safe else pl.pallas_call
    sems = sd.dma_semaphores((N, 2, 2)) if safe else pltpu.SemaphoreType.DMA((N, 2, 2))

    def per_device(*args: jax.Array) -> jax.Array:
        src, output, in_off, send_sizes, out_off, recv_sizes = args
        meta = (in_off, send_sizes, out_off, recv_sizes)
        out, future_sems = call(
            _ra2a(safe, True, seed),
            [output, sems],  # the output array as its own shape, and the semaphores
            in_specs=2 * [ANY] + 4 * [SMEM],
            out_specs=[ANY, SEM],
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(collective_id=1),
        )(src, output, *meta)
        done: jax.Array = call(
            _ra2a(safe, False, seed),
            output,
            in_specs=2 * [ANY] + 4 * [SMEM] + [SEM],
            out_specs=ANY,
            input_output_aliases={1: 0},
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(src, out, *meta, future_sems)
        return done

    return per_device


def _ra2a_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    rows = sds((N * A2A_ROWS, 128), jnp.float32)
    table = sds((N * N,), jnp.int32)
    return rows, rows, table, table, table, table


def _future(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    return sharded(_ra2a_calls(safe, seed), mesh, (ALONG_X,) * 6), mesh


def test_ragged_all_to_all_future_matches_raw() -> None:
    ours, mesh = _future(SAFE)
    theirs, _ = _future(RAW)
    assert_same_mosaic(ours, theirs, *_ra2a_args(mesh), mesh=mesh)


def _ra2a_tables() -> tuple[jax.Array, ...]:
    """Every device sends 2 rows to every device (itself included); sender s's rows land at
    rows 2s of each receiver."""
    in_off = np.tile(2 * np.arange(N, dtype=np.int32), N)
    sizes = np.full(N * N, 2, np.int32)
    out_off = np.repeat(2 * np.arange(N, dtype=np.int32), N)
    rows = np.zeros((N * A2A_ROWS, 128), np.float32)
    return tuple(jnp.asarray(a) for a in (rows, rows, in_off, sizes, out_off, sizes))


def test_ragged_all_to_all_future_verifies_across_its_two_kernels() -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    for safe in (RAW, SAFE):
        verify(
            _ra2a_calls(safe), *_ra2a_tables(), mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x")
        )


def test_ragged_all_to_all_future_send_waits_dropped_is_r2_in_verify() -> None:
    # Not a trace-time matter: the start kernel leaves its sends in flight on purpose (on
    # the semaphores it returns), and the wait kernel starts nothing.
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    fn = _ra2a_calls(SAFE, "send_waits_dropped")
    with pytest.raises(LeftoverSemaphoreError, match="passed between kernels") as err:
        verify(fn, *_ra2a_tables(), mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x"))
    assert f"{__file__}:{line_in(_ra2a, '# STARTED')}" in str(err.value)


def test_ragged_all_to_all_future_receive_on_a_semaphore_pair_is_s2() -> None:
    broken, mesh = _future(SAFE, "recv_on_the_pair")
    with pytest.raises(sd.SemaphoreShapeError, match=r"\.at\[") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# DESCRIBED") in raising_lines(err, __file__)


def test_ragged_all_to_all_future_unknown_axis_is_t3() -> None:
    broken, mesh = _future(SAFE, "unknown_axis")
    with pytest.raises(sd.DeviceIdError, match="'y'") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# AXIS") in raising_lines(err, __file__)


def test_ragged_all_to_all_future_receive_waited_as_a_send_is_s5() -> None:
    broken, mesh = _future(SAFE, "receive_waited_as_send")
    with pytest.raises(sd.WrongOperationError, match=r"wait_recv\(\)") as err:
        mosaic_text(broken, *_ra2a_args(mesh), mesh=mesh)
    assert line_in(_ra2a, "# WRONG SIDE") in raising_lines(err, __file__)
