"""DMA futures across pallas_calls (``safedma/_futures.py``), beyond the corpus verdicts.

``start_async`` / ``finish_async`` build the raw pair of pallas_calls (semaphore as an
output, source and buffer aliased). The kernels, their raw twins and the seeded
mistakes (a future dropped, finished twice, started with no copy or finished with no
wait) are in tests/corpus/futures.py; here: the aliases of the pair, the listing of
futures dropped at one site, and a future handed on through a function's result.

Then futures on kernels written here, each lowering to the Mosaic of its raw pltpu
spelling and each seeded mistake stopped at trace time naming the user's line:

* a DMA semaphore that is a kernel operand (``memory_space=pltpu.SEMAPHORE``) outlives the
  kernel: jax's remote, scalar-prefetched and stateful futures, each finished apart; a
  copy on a scratch semaphore is still never waited (T7);
* a chunked copy as a future (vLLM tpu-inference's ``distributed/kv_transfer.py``): a
  ``pl.loop`` over a chunk count from SMEM, one copy per chunk on the returned semaphore;
* kernels that start or wait in raw pltpu or through a jitted helper, a future finished
  once in each branch, and a future whose copy a pipeline step starts;
* a start kernel that starts nothing names its own def line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_kernels, mosaic_text
from tests.corpus._calls import X, trace
from tests.corpus.futures import DST, copy_through_future, future_done, future_start
from tests.support.source_lines import line_in, marker_line, raising_lines


def test_the_pair_aliases_source_and_buffer() -> None:
    start, done = mosaic_kernels(copy_through_future, X)
    assert "operand_index = 0" in start.aliases
    assert "operand_index = 1" in done.aliases


def test_futures_dropped_at_one_site_are_one_line_with_their_count() -> None:
    @sd.checked_futures
    def dropped(x: jax.Array) -> jax.Array:
        for _ in range(3):
            sd.start_async(future_start, x, dst=DST)  # LOOP
        sd.start_async(future_start, x, dst=DST)  # ONCE
        return x

    with pytest.raises(sd.FutureDroppedError) as err:
        trace(dropped)
    listed = [row for row in str(err.value).splitlines() if row.startswith("  - ")]
    assert len(listed) == 2, listed
    assert listed[0].startswith("  - 3 futures of future_start, started at "), listed
    assert listed[1].startswith("  - future_start, started at "), listed
    assert "4 DMA future(s) were started" in str(err.value)


def test_a_returned_future_is_handed_on_not_dropped() -> None:
    @sd.checked_futures
    def start_only(x: jax.Array) -> sd.DmaFuture:
        return sd.start_async(future_start, x, dst=DST)

    @sd.checked_futures
    def finish_only(future: sd.DmaFuture) -> jax.Array:
        return sd.finish_async(future_done, future)

    future = jax.eval_shape(start_only, X)
    assert isinstance(future, sd.DmaFuture)
    trace(finish_only, future)


STEPS, ROWS, LANES = 4, 8, 128
BLOCK = pl.BlockSpec((ROWS, LANES), lambda i: (i, 0))


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


# --- a DMA future finished in branches --------------------------------------------------


def _branch_future_start(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()


def _branch_future_done(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def _finishes(shape: str) -> Callable[..., jax.Array]:
    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_branch_future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
        if shape == "switch":
            finish = lambda: sd.finish_async(_branch_future_done, future)  # noqa: E731
            return lax.switch(flag[0], [finish, lambda: finish() * 2, lambda: finish() + 1])
        first = sd.finish_async(_branch_future_done, future)  # FIRST
        maybe = lax.cond(
            flag[0] > 0, lambda: sd.finish_async(_branch_future_done, future), lambda: x
        )
        return first + maybe + sd.finish_async(_branch_future_done, future)  # AGAIN

    return f


FLAG = jax.ShapeDtypeStruct((1,), jnp.int32)


def test_a_future_finished_once_in_each_branch_of_a_switch_traces() -> None:
    jax.eval_shape(_finishes("switch"), X, FLAG)


def test_a_second_finish_in_one_block_is_caught_past_a_finish_in_a_branch() -> None:
    # Only the latest finish was once remembered: the branch's hid the first one, so the
    # finish after the cond (the same straight-line block as the first) passed.
    with pytest.raises(sd.FutureConsumedTwiceError) as err:
        jax.eval_shape(_finishes("again"), X, FLAG)
    text = str(err.value)
    first, again = line_in(_finishes, "# FIRST"), line_in(_finishes, "# AGAIN")
    assert f"finished at {__file__}:{first} and again at {__file__}:{again}" in text, text


def _start_in_a_pipeline(x_ref: Any, dst: Any, sem: Any) -> None:
    def body(x_block: Any) -> None:
        @pl.when(pl.program_id(0) == STEPS - 1)
        def _() -> None:
            sd.LocalCopy(x_ref.at[pl.ds(0, ROWS)], dst.at[pl.ds(0, ROWS)], sem).start()

    sd.emit_pipeline(body, grid=(STEPS,), in_specs=[BLOCK])(x_ref)


def _done_first_rows(x_ref: Any, buf: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref.at[pl.ds(0, ROWS)], buf.at[pl.ds(0, ROWS)], sem).started_elsewhere().wait()


def test_a_future_whose_copy_a_pipeline_step_starts_lowers() -> None:
    # The start kernel leaves its copy in flight on the future's semaphore (settled there);
    # a copy its pipeline's last step starts is handed to it. Formerly: T7 in
    # the body.
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        future = sd.start_async(_start_in_a_pipeline, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
        return sd.finish_async(_done_first_rows, future)

    assert "tpu.wait_dma" in mosaic_text(f, X, mesh=_v5p())


# --- a DMA future whose kernels start or wait in raw pltpu, or through a jitted helper ----


def _future_start(how: str) -> Callable[..., None]:
    def start(x_ref: Any, o_ref: Any, sem: Any) -> None:
        if how == "raw":
            pltpu.make_async_copy(x_ref, o_ref, sem).start()
        elif how == "helper":

            def helper(x: Any, o: Any, s: Any) -> None:
                sd.LocalCopy(x, o, s).start()

            jax.jit(helper)(x_ref, o_ref, sem)
        elif how != "nothing":
            sd.LocalCopy(x_ref, o_ref, sem).start()

    return start


def _future_done(how: str) -> Callable[..., None]:
    def done(x_ref: Any, o_ref: Any, sem: Any) -> None:
        if how == "raw":
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()
        elif how != "nothing":
            sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()

    return done


def _future(start: str, done: str) -> Callable[..., jax.Array]:
    @sd.checked_futures
    def f(x: jax.Array) -> jax.Array:
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        future = sd.start_async(_future_start(start), x, dst=shape)
        return sd.finish_async(_future_done(done), future)

    return f


@pytest.mark.parametrize(("start", "done"), [("raw", "safe"), ("safe", "raw"), ("helper", "safe")])
def test_a_future_started_or_finished_in_raw_pltpu_or_a_helper_traces(
    start: str, done: str
) -> None:
    # Formerly: FutureNotWaitedError (the start and done kernels' checks counted
    # only safedma's own starts and waits, and no copy on a helper's parameter).
    assert jax.eval_shape(_future(start, done), X).shape == X.shape


@pytest.mark.parametrize(("start", "done"), [("nothing", "raw"), ("raw", "nothing")])
def test_a_future_whose_kernel_starts_or_waits_nothing_is_still_refused(
    start: str, done: str
) -> None:
    kernel = "start kernel" if start == "nothing" else "done kernel"
    with pytest.raises(sd.FutureNotWaitedError, match=kernel):
        jax.eval_shape(_future(start, done), X)


HBM = pl.BlockSpec(memory_space=pltpu.HBM)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
SAFE, RAW = True, False


# --- a chunked copy as a DMA future -----------------------------------------------------

TRANSFER_ROWS = 64


def _chunks_start(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        num: Any,
        src_off: Any,
        dst_off: Any,
        sizes: Any,
        src: Any,
        dep: Any,
        dst_in: Any,
        *args: Any,
    ) -> None:
        del dep  # only orders this kernel after the previous transfer
        sem = args[-1]  # with a scratch semaphore added (seed), args[-1] is that scratch

        @pl.loop(0, num[0])
        def _(i: Any) -> None:
            n = sizes[i]
            dst = dst_in.at[pl.ds(dst_off[i], n)]
            if seed == "whole_block_destination":
                dst = dst_in.at[pl.ds(dst_off[i], 16)]
            if safe:
                sd.LocalCopy(src.at[pl.ds(src_off[i], n)], dst, sem).start()  # CHUNK
            else:
                pltpu.make_async_copy(src.at[pl.ds(src_off[i], n)], dst, sem).start()

    return kernel


def _chunks_done(safe: bool) -> Callable[..., None]:
    def kernel(
        num: Any, src_off: Any, dst_off: Any, sizes: Any, src: Any, dep: Any, *args: Any
    ) -> None:
        del dep
        dst_in, sem = args[0], args[1]

        @pl.loop(0, num[0])
        def _(i: Any) -> None:
            n = sizes[i]
            copy_src, copy_dst = src.at[pl.ds(src_off[i], n)], dst_in.at[pl.ds(dst_off[i], n)]
            if safe:
                sd.LocalCopy(copy_src, copy_dst, sem).started_elsewhere().wait()
            else:
                pltpu.make_async_copy(copy_src, copy_dst, sem).wait()

    return kernel


def _transfer(safe: bool, seed: str | None = None) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call
    params = pltpu.CompilerParams(has_side_effects=True)

    def run(*operands: jax.Array) -> jax.Array:
        *tables, src, dep, dst = operands
        scratch = [pltpu.SemaphoreType.DMA(())] if seed == "scratch_semaphore" else []
        out, sem = entry(
            _chunks_start(safe, seed),
            out_shape=(jax.ShapeDtypeStruct(dst.shape, dst.dtype), pltpu.SemaphoreType.DMA(())),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4,
                grid=(1,),
                in_specs=(HBM, HBM, HBM),
                out_specs=(HBM, SEM),
                scratch_shapes=scratch,
            ),
            input_output_aliases={6: 0},
            compiler_params=params,
        )(*tables, src, dep, dst)
        done: jax.Array = entry(
            _chunks_done(safe),
            out_shape=jax.ShapeDtypeStruct(dst.shape, dst.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4, grid=(1,), in_specs=[HBM, HBM, HBM, SEM], out_specs=HBM
            ),
            input_output_aliases={6: 0},
            compiler_params=params,
        )(*tables, src, dep, out, sem)
        return done

    return jax.jit(run)


def _transfer_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    table = jax.ShapeDtypeStruct((16,), jnp.int32)
    cache = jax.ShapeDtypeStruct((TRANSFER_ROWS, 8, 128), jnp.bfloat16)
    return (jax.ShapeDtypeStruct((1,), jnp.int32), table, table, table, cache, cache, cache)


def test_chunked_transfer_future_matches_raw() -> None:
    assert_same_mosaic(_transfer(SAFE), _transfer(RAW), *_transfer_args())


def test_chunked_transfer_on_a_scratch_semaphore_is_t7_at_the_chunks_start() -> None:
    # A scratch semaphore added to the start kernel shifts the author's ``args[-1]``: the
    # chunks are started on the scratch, which dies with the kernel, not on the returned one.
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_transfer(SAFE, "scratch_semaphore"), *_transfer_args())
    text = str(err.value)
    assert f"{__file__}:{line_in(_chunks_start, '# CHUNK')}" in text
    assert "started_elsewhere().wait()" in text


def test_chunk_written_as_a_whole_block_is_t1_at_the_users_line() -> None:
    # A traced length on the source, 16 rows on the destination: Mosaic rejects it on TPU.
    with pytest.raises(sd.CopyShapeMismatchError) as err:
        mosaic_text(_transfer(SAFE, "whole_block_destination"), *_transfer_args())
    assert line_in(_chunks_start, "# CHUNK") in raising_lines(err, __file__)


ANY = pl.BlockSpec(memory_space=pl.ANY)
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
    assert f"test_futures.py:{marker_line(__file__, '# lost')}" in message  # not the output's line

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
        sd.CopyNeverWaitedError, match=f"test_futures.py:{marker_line(__file__, '# in grid')}"
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
