"""Patterns from jax's own Pallas TPU tests, on kernels written here.

* A DMA semaphore that is a kernel operand (``memory_space=pltpu.SEMAPHORE`` in
  ``out_specs`` / ``in_specs``) outlives the kernel: a copy started on it may be
  left in flight for a later ``pallas_call`` to wait (jax's remote, bidirectional,
  scalar-prefetched and stateful DMA futures). ``safedma.pallas_call`` takes these
  as they are; a copy on a scratch semaphore is still checked (T7).

Each kernel lowers to the Mosaic of its raw pltpu spelling.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic
from tests.support.source_lines import marker_line

ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
N = 4


def _like(x: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


# --- a remote future: send and receive semaphores returned, each finished apart ---------


def _send(
    x_hbm: sd.DataRef, keep: sd.DataRef, out: sd.DataRef, send: sd.SemRef, recv: sd.SemRef
) -> None:
    del keep
    up = sd.mesh_coords(jax.lax.rem(sd.my_index("x") + 1, N))
    down = sd.mesh_coords(jax.lax.rem(sd.my_index("x") + N - 1, N))
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, device=down)
    sd.wait(barrier)
    sd.RemoteCopy(x_hbm, out, recv).with_send_sem(send).to(up).start()


def _sent(x_hbm: sd.DataRef, send: sd.SemRef, keep: sd.DataRef) -> None:
    del keep
    sd.wait_bytes(send, x_hbm)


def _received(x_hbm: sd.DataRef, out: sd.DataRef, recv: sd.SemRef, keep: sd.DataRef) -> None:
    del keep
    sd.LocalCopy(x_hbm, out, recv).started_elsewhere().wait()


def _send_raw(x_hbm: Any, keep: Any, out: Any, send: Any, recv: Any) -> None:
    del keep
    up = jax.lax.rem(jax.lax.axis_index("x") + 1, N)
    down = jax.lax.rem(jax.lax.axis_index("x") + N - 1, N)
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, device_id=(down,))
    pl.semaphore_wait(barrier, 1)
    pltpu.make_async_remote_copy(x_hbm, out, send, recv, device_id=(up,)).start()


def _sent_raw(x_hbm: Any, send: Any, keep: Any) -> None:
    del keep
    pltpu.make_async_copy(x_hbm, x_hbm, send).wait()


def _received_raw(x_hbm: Any, out: Any, recv: Any, keep: Any) -> None:
    del keep
    pltpu.make_async_copy(x_hbm, out, recv).wait()


def _remote_future(send: Any, sent: Any, received: Any, entry: Any) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        dma = pltpu.SemaphoreType.DMA(())
        x, out, send_sem, recv_sem = entry(
            send,
            (_like(x), _like(x), dma, dma),
            in_specs=[ANY],
            out_specs=(ANY, ANY, SEM, SEM),
            input_output_aliases={0: 0},
            compiler_params=pltpu.CompilerParams(collective_id=0, has_side_effects=True),
        )(x)
        y = x * 2  # work overlapped with the transfer
        x = entry(sent, _like(x), in_specs=[ANY, SEM], out_specs=ANY, input_output_aliases={0: 0})(
            x, send_sem
        )
        out = entry(
            received, _like(x), in_specs=[ANY, ANY, SEM], out_specs=ANY, input_output_aliases={1: 0}
        )(x, out, recv_sem)
        return out + 0 * y

    return per_device


def test_remote_future_across_pallas_calls_matches_raw() -> None:
    mesh = abstract_mesh((N,), ("x",))
    x = jax.ShapeDtypeStruct((N * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))

    def wrap(fn: Any) -> Any:
        return jax.jit(
            jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        )

    ours = wrap(_remote_future(_send, _sent, _received, sd.pallas_call))
    theirs = wrap(_remote_future(_send_raw, _sent_raw, _received_raw, pl.pallas_call))
    assert_same_mosaic(ours, theirs, x, mesh=mesh)


# --- a local future whose start kernel reads its row from a scalar-prefetched index -----


def _row_start(
    i_ref: sd.DataRef,
    x_hbm: sd.DataRef,
    keep: sd.DataRef,
    out: sd.DataRef,
    sems: tuple[sd.SemRef, sd.SemRef],
) -> None:
    del keep
    sd.LocalCopy(x_hbm.at[i_ref[0]], out, sems[1]).start()


def _row_start_raw(i_ref: Any, x_hbm: Any, keep: Any, out: Any, sems: Any) -> None:
    del keep
    pltpu.make_async_copy(x_hbm.at[i_ref[0]], out, sems[1]).start()


def _row_done(x_hbm: sd.DataRef, out: sd.DataRef, sem: sd.SemRef, keep: sd.DataRef) -> None:
    del keep
    sd.LocalCopy(x_hbm.at[0], out, sem).started_elsewhere().wait()


def _row_done_raw(x_hbm: Any, out: Any, sem: Any, keep: Any) -> None:
    del keep
    pltpu.make_async_copy(x_hbm.at[0], out, sem).wait()


def _row_future(start: Any, done: Any, entry: Any) -> Any:
    def run(x: jax.Array, i: jax.Array) -> jax.Array:
        row = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
        dma = pltpu.SemaphoreType.DMA(())
        x, out, sems = entry(
            start,
            (_like(x), row, (dma, dma)),  # a tuple of semaphores is one argument
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, in_specs=[ANY], out_specs=(ANY, ANY, (SEM, SEM))
            ),
            input_output_aliases={1: 0},
        )(i[None], x)
        return entry(
            done, row, in_specs=[ANY, ANY, SEM], out_specs=ANY, input_output_aliases={1: 0}
        )(x, out, sems[1])

    return jax.jit(run)


def test_scalar_prefetched_future_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((4, 8, 128), jnp.float32)
    i = jax.ShapeDtypeStruct((), jnp.int32)
    assert_same_mosaic(
        _row_future(_row_start, _row_done, sd.pallas_call),
        _row_future(_row_start_raw, _row_done_raw, pl.pallas_call),
        x,
        i,
    )


# --- a stateful future: the kernel's only operand is its semaphore --------------------


def _stateful(entry: Any, raw: bool) -> Any:
    def run(x: jax.Array) -> jax.Array:
        def body(refs: tuple[sd.DataRef, sd.DataRef]) -> None:
            x_ref, y_ref = refs

            def start(sem: sd.SemRef) -> None:
                if raw:
                    pltpu.make_async_copy(x_ref, y_ref, sem).start()
                else:
                    sd.LocalCopy(x_ref, y_ref, sem).start()

            def done(sem: sd.SemRef) -> None:
                if raw:
                    pltpu.make_async_copy(x_ref, y_ref, sem).wait()
                else:
                    sd.LocalCopy(x_ref, y_ref, sem).started_elsewhere().wait()

            sem = entry(start, pltpu.SemaphoreType.DMA(()), out_specs=SEM)()
            entry(done, (), in_specs=[SEM])(sem)

        _, y = pl.run_state(body)((x, jnp.zeros_like(x)))
        out: jax.Array = y
        return out

    return jax.jit(run)


def test_stateful_future_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert_same_mosaic(_stateful(sd.pallas_call, False), _stateful(pl.pallas_call, True), x)


# --- the broken twins: a copy on a scratch semaphore is still never waited ------------


def _leaks_scratch(
    x_hbm: sd.DataRef, keep: sd.DataRef, out: sd.DataRef, sem: sd.SemRef, scratch: sd.SemRef
) -> None:
    del keep
    sd.LocalCopy(x_hbm, out, sem).start()  # handed over: sem is an output
    sd.LocalCopy(x_hbm, out, scratch).start()  # lost: scratch dies with the kernel


def _leaks_in_grid_spec(
    i_ref: sd.DataRef, x_hbm: sd.DataRef, out: sd.DataRef, scratch: sd.SemRef
) -> None:
    sd.LocalCopy(x_hbm.at[i_ref[0]], out, scratch).start()  # in grid_spec scratch


def test_a_copy_on_a_scratch_semaphore_is_still_never_waited() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    call = sd.pallas_call(
        _leaks_scratch,
        (x, x, pltpu.SemaphoreType.DMA(())),
        in_specs=[ANY],
        out_specs=(ANY, ANY, SEM),
        input_output_aliases={0: 0},
        scratch_shapes=[sd.dma_semaphore()],
    )
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        jax.eval_shape(call, x)
    message = str(err.value)
    assert "1 copy was started" in message and "-> out" in message
    assert (
        f"test_remote_futures_joint_axis_ids_and_traced_sizes.py:{marker_line(__file__, '# lost')}"
        in message
    )  # not the output's line

    rows = jax.ShapeDtypeStruct((4, 8, 128), jnp.float32)
    in_grid = sd.pallas_call(
        _leaks_in_grid_spec,
        x,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[sd.dma_semaphore()],
        ),
    )
    with pytest.raises(
        sd.CopyNeverWaitedError, match=f"traced_sizes.py:{marker_line(__file__, '# in grid')}"
    ):
        jax.eval_shape(in_grid, jax.ShapeDtypeStruct((1,), jnp.int32), rows)


def test_plain_checked_still_checks_every_semaphore() -> None:
    """Under pl.pallas_call(sd.checked(body)) safedma cannot see which arguments are scratch."""
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    call = pl.pallas_call(
        sd.checked(_row_done_leak),
        out_shape=(x, pltpu.SemaphoreType.DMA(())),
        in_specs=[ANY],
        out_specs=(ANY, SEM),
    )
    with pytest.raises(sd.CopyNeverWaitedError):
        jax.eval_shape(call, x)


def _row_done_leak(x_hbm: sd.DataRef, out: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x_hbm, out, sem).start()


# --- device ids over axes taken jointly (jax's {("y", "x"): i}) --------------------------


def _joint(x_ref: sd.DataRef, y_ref: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
    n = sd.axis_size(("y", "x"))
    target = sd.device({("y", "x"): jax.lax.rem(sd.my_index(("y", "x")) + 1, n)})
    sd.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(target).start().wait()


def _joint_raw(x_ref: Any, y_ref: Any, send: Any, recv: Any) -> None:
    n = jax.lax.axis_size(("y", "x"))
    target = {("y", "x"): jax.lax.rem(jax.lax.axis_index(("y", "x")) + 1, n)}
    copy = pltpu.make_async_remote_copy(x_ref, y_ref, send, recv, device_id=target)
    copy.start()
    copy.wait()


def _joint_call(body: Any, entry: Any, mesh: Any) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        return entry(
            body,
            _like(x),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
        )(x)

    spec = P(("y", "x"))
    return jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )


def test_joint_axis_device_ids_match_raw() -> None:
    mesh = abstract_mesh(
        (2, 3), ("y", "x"), tpu="v6e"
    )  # jax lowers a joint id with the chip's layout
    x = jax.ShapeDtypeStruct((6 * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("y", "x"))))
    assert_same_mosaic(
        _joint_call(_joint, sd.pallas_call, mesh),
        _joint_call(_joint_raw, pl.pallas_call, mesh),
        x,
        mesh=mesh,
    )


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: sd.device({("y", "z"): 0}), "unknown mesh axis 'z'"),
        (lambda: sd.device({("y", "x"): 6}), "index 6 is outside mesh axis .*'y', 'x'.* of size 6"),
        (lambda: sd.device({(): 0}), "names no axis"),
        (lambda: sd.device({0: 1}), "key 0 .* is not a mesh axis name"),
        (lambda: sd.my_index(("x", "w")), "unknown mesh axis 'w'"),
    ],
)
def test_joint_axis_device_ids_are_checked(make: Any, expected: str) -> None:
    mesh = abstract_mesh((2, 3), ("y", "x"))
    x = jax.ShapeDtypeStruct((6 * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("y", "x"))))

    def body(x_ref: sd.DataRef, y_ref: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
        target = make()
        assert isinstance(target, sd.Device)
        sd.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(target).start().wait()

    with pytest.raises(sd.DeviceIdError, match=expected):
        jax.eval_shape(_joint_call(body, sd.pallas_call, mesh), x)


# --- a copy whose size is read from SMEM once per side --------------------------------


def _two_reads(
    data: sd.DataRef,
    where: sd.DataRef,
    size: sd.DataRef,
    array: sd.DataRef,
    out: sd.DataRef,
    sem: sd.SemRef,
) -> None:
    del array
    src = data.at[pl.ds(0, size[0])]  # two reads of size[0]: two tracers, equal at run time
    sd.LocalCopy(src, out.at[pl.ds(where[0], size[0])], sem).start().wait()


def _two_reads_raw(data: Any, where: Any, size: Any, array: Any, out: Any, sem: Any) -> None:
    del array
    src = data.at[pl.ds(0, size[0])]
    copy = pltpu.make_async_copy(src, out.at[pl.ds(where[0], size[0])], sem)
    copy.start()
    copy.wait()


def _dynamic_call(body: Any, entry: Any) -> Any:
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    return entry(
        body,
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), smem, smem, ANY],
        out_specs=ANY,
        scratch_shapes=[sd.dma_semaphore()],
        input_output_aliases={3: 0},
    )


def test_dynamic_sizes_read_per_side_match_raw() -> None:
    args = (
        jax.ShapeDtypeStruct((8, 128), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
    )
    assert_same_mosaic(
        _dynamic_call(_two_reads, sd.pallas_call),
        _dynamic_call(_two_reads_raw, pl.pallas_call),
        *args,
    )


def test_a_static_size_mismatch_next_to_a_traced_size_is_still_caught() -> None:
    def narrow(
        data: sd.DataRef,
        where: sd.DataRef,
        size: sd.DataRef,
        array: sd.DataRef,
        out: sd.DataRef,
        sem: sd.SemRef,
    ) -> None:
        del array, where
        dst = out.at[pl.ds(0, size[0]), pl.ds(0, 64)]  # 64 lanes for a 128-lane source
        sd.LocalCopy(data.at[pl.ds(0, size[0])], dst, sem).start().wait()

    def rank(
        data: sd.DataRef,
        where: sd.DataRef,
        size: sd.DataRef,
        array: sd.DataRef,
        out: sd.DataRef,
        sem: sd.SemRef,
    ) -> None:
        del array, where
        sd.LocalCopy(data.at[pl.ds(0, size[0])], out.at[0], sem).start().wait()

    args = (
        jax.ShapeDtypeStruct((8, 128), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((256, 128), jnp.int32),
    )
    with pytest.raises(sd.CopyShapeMismatchError, match=r"different shapes \(.*128\) and \(.*64\)"):
        jax.eval_shape(_dynamic_call(narrow, sd.pallas_call), *args)
    with pytest.raises(sd.CopyShapeMismatchError, match=r"and \(128,\)"):
        jax.eval_shape(_dynamic_call(rank, sd.pallas_call), *args)


# --- a future's start kernel that starts nothing names its own def line -------------------


def _starts_nothing(x_hbm: sd.DataRef, out: sd.DataRef, sem: sd.SemRef) -> None:  # the def
    del sem
    sd.sync_copy(x_hbm, out)  # a synchronous copy: nothing left on the future's semaphore


def test_a_start_kernel_that_starts_nothing_names_its_def_and_call() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)

    def run(x: jax.Array) -> jax.Array:
        return sd.start_async(_starts_nothing, x, dst=_like(x)).buffer  # the call

    with pytest.raises(sd.FutureNotWaitedError) as err:
        jax.eval_shape(run, x)
    message = str(err.value)
    assert f"defined at {__file__}:{marker_line(__file__, '# the def')}" in message
    assert f"start_async at {__file__}:{marker_line(__file__, '# the call')}" in message
