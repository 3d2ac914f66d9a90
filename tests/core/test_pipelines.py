"""Pipelined kernels (``emit_pipeline``, prefetch loops, unrolled banks): the ledger's rules
for a body with a parent reach the copies a step starts and the waits after it.

* an accumulator written back at the pipeline's last step and waited after it (jax's
  pipelining guide's reductions, tokamax's / maxtext's ragged matmuls);
* per-step stores drained by their total size after the pipeline; a semaphore the body
  scopes itself stays the body's;
* nested pipelines: the outer step prefetches, the inner pipeline's first step waits;
* a wait in a pipeline body stands for a copy started before the pipeline, on the same
  semaphore only;
* the next block prefetched inside a ``lax.while_loop`` body (a ragged paged attention);
* an ``emit_pipeline`` used as the ``pallas_call`` body, three outputs;
* a Python-unrolled two-bank pipeline whose waits rebuild the copy (a decode kernel).

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
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

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.hbm_calls import one_step_hbm_call as _call
from tests.support.source_lines import line_in

STEPS, ROWS, LANES = 4, 8, 128
BLOCK = pl.BlockSpec((ROWS, LANES), lambda i: (i, 0))
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


def _copy(safe: bool, src: Any, dst: Any, sem: Any) -> None:
    if safe:
        sd.LocalCopy(src, dst, sem).start()  # STARTED
    else:
        pltpu.make_async_copy(src, dst, sem).start()


def _wait(safe: bool, src: Any, dst: Any, sem: Any, how: str = "started_elsewhere") -> None:
    if not safe:  # a wait by size is the wait of a copy of that size (dst to dst)
        pltpu.make_async_copy(dst if how == "wait_bytes" else src, dst, sem).wait()
    elif how == "wait_bytes":
        sd.wait_bytes(sem, dst)
    else:
        sd.LocalCopy(src, dst, sem).started_elsewhere().wait()


# --- an accumulator written back at the pipeline's last step, waited after it -----------


def _write_back(
    safe: bool, where: str = "kernel", how: str = "started_elsewhere", seed: str = ""
) -> Callable[..., None]:
    """Sum the row blocks of ``x`` in a VMEM accumulator across the steps of a pipeline; at
    the last step start the accumulator's copy to ``o`` on a kernel semaphore, and wait it
    after the pipeline (``where``: in the kernel, in a ``fori_loop`` of two passes, under a
    ``pl.when``, in a ``run_scoped`` block that allocates the semaphores, in the body of an
    outer pipeline around the inner one, or with the pipeline's buffers given as scratch)."""
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any, *allocs: Any) -> None:
        def one_pass(sems: Any = sems) -> None:
            start_sem = sems.at[1] if seed == "wrong_slot" else sems.at[0]

            def body(x_ref: Any) -> None:
                step = pl.program_id(0)

                @pl.when(step == 0)
                def _() -> None:
                    acc[...] = jnp.zeros_like(acc)

                acc[...] += x_ref[...]

                @pl.when(step == STEPS - 1)
                def _() -> None:
                    _copy(safe, acc, o_hbm.at[pl.ds(0, ROWS)], start_sem)  # LAST STEP

            # "allocations": the pipeline's buffers (and their DMA((2,)) semaphores, of the
            # type of ``sems``) are the kernel's scratch, so its own waits are on them.
            given = {"allocations": allocs[0]} if allocs else {}
            emit(body, grid=(STEPS,), in_specs=[BLOCK])(x_hbm, **given)
            if seed != "wait_dropped":
                _wait(safe, acc, o_hbm.at[pl.ds(0, ROWS)], sems.at[0], how)  # AFTER

        if where in ("kernel", "allocations"):
            one_pass()
        elif where == "fori_loop":

            def twice(i: Any, carry: Any) -> Any:
                one_pass()
                return carry

            lax.fori_loop(0, 2, twice, 0)
        elif where == "when":
            pl.when(pl.program_id(0) == 0)(one_pass)
        elif where == "scoped":
            # The semaphores scoped around the pipeline: in the kernel's frame the
            # pipeline's own waits (on the buffers it scopes) are waits on some scoped
            # semaphore, as these are; they must not stand for the body's copy.
            pl.run_scoped(one_pass, pltpu.SemaphoreType.DMA((2,)))
        elif where == "nested":

            def outer(o_ref: Any) -> None:
                one_pass()
                o_ref[...] = acc[...]

            emit(outer, grid=(1,), out_specs=[BLOCK])(o_hbm)

    return kernel


def _write_back_call(safe: bool, **kw: str) -> Any:
    scratch: list[Any] = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    if kw.get("where") == "allocations":
        scratch.append((pltpu.BufferedRef.input(BLOCK, jnp.float32),))
    return _call(_write_back(safe, **kw), safe, scratch)


X = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)


@pytest.mark.parametrize("how", ["started_elsewhere", "wait_bytes"])
@pytest.mark.parametrize(
    "where", ["kernel", "fori_loop", "when", "scoped", "nested", "allocations"]
)
def test_a_copy_the_last_step_starts_waited_after_the_pipeline_matches_raw(
    where: str, how: str
) -> None:
    # Formerly: T7 in the body ('body' was checked as a kernel of its own).
    assert_same_mosaic(
        _write_back_call(SAFE, where=where, how=how),
        _write_back_call(RAW, where=where, how=how),
        X,
        mesh=_v5p(),
    )


@pytest.mark.parametrize("where", ["kernel", "fori_loop", "scoped", "nested", "allocations"])
def test_a_body_copy_nothing_waits_is_t7_naming_the_body(where: str) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_write_back_call(SAFE, where=where, seed="wait_dropped"), X, mesh=_v5p())
    text = str(err.value)
    # The pipeline's own waits (on its buffers' semaphores, in the kernel's frame) do not
    # stand for the body's copy once it is handed to the kernel.
    assert text.startswith("kernel 'kernel'"), text
    started = f"{__file__}:{line_in(_copy, '# STARTED')}"
    assert f"{started} (called from {__file__}:{line_in(_write_back, '# LAST STEP')}" in text
    inside = " inside 'outer'" if where == "nested" else ""
    assert f"in the body 'body'{inside}, started at" in text, text


def test_a_body_copy_waited_on_another_slot_after_the_pipeline_is_t7() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_write_back_call(SAFE, seed="wrong_slot"), X, mesh=_v5p())
    assert f"called from {__file__}:{line_in(_write_back, '# LAST STEP')}" in str(err.value)


# --- per-step stores, drained by their total size after the pipeline --------------------


def _drained_after(safe: bool, seed: str = "") -> Callable[..., None]:
    """Each step stages its block in its own row of ``stage`` and stores it to ``o`` on
    slot ``step % 2``; the kernel drains each slot by the size of the stores it carried."""
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, stage: Any, sems: Any) -> None:
        def body(x_ref: Any) -> None:
            step = pl.program_id(0)
            stage[step] = x_ref[...] * 2
            dst = o_hbm.at[pl.ds(step * ROWS, ROWS)]
            _copy(safe, stage.at[step], dst, sems.at[step % 2])  # STORE

        emit(body, grid=(STEPS,), in_specs=[BLOCK])(x_hbm)
        for slot in range(2):
            if seed == "drain_dropped":
                break
            rows = stage.at[pl.ds(0, STEPS // 2)]
            _wait(safe, rows, rows, sems.at[slot], "wait_bytes")

    return kernel


def _drained_call(safe: bool, seed: str = "") -> Any:
    scratch = [pltpu.VMEM((STEPS, ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(_drained_after(safe, seed), safe, scratch)


def test_per_step_stores_drained_by_size_after_the_pipeline_match_raw() -> None:
    # Formerly: T7 in the body for the stores.
    assert_same_mosaic(_drained_call(SAFE), _drained_call(RAW), X, mesh=_v5p())


def test_per_step_stores_never_drained_are_t7_in_the_kernel() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_drained_call(SAFE, "drain_dropped"), X, mesh=_v5p())
    text = str(err.value)
    assert f"called from {__file__}:{line_in(_drained_after, '# STORE')}" in text, text
    assert "in the body 'body'" in text, text


# --- a semaphore the body scopes itself stays the body's --------------------------------


def _scoped_in_body(safe: bool, seed: str = "") -> Callable[..., None]:
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        def body(x_ref: Any) -> None:
            acc[...] = x_ref[...]
            step = pl.program_id(0)

            def scoped(sem: Any) -> None:
                dst = o_hbm.at[pl.ds(step * ROWS, ROWS)]
                _copy(safe, acc, dst, sem)  # SCOPED
                if seed != "wait_dropped":
                    _wait(safe, acc, dst, sem)

            pl.run_scoped(scoped, pltpu.SemaphoreType.DMA)

        emit(body, grid=(STEPS,), in_specs=[BLOCK])(x_hbm)
        del sems

    return kernel


def _scoped_call(safe: bool, seed: str = "") -> Any:
    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(_scoped_in_body(safe, seed), safe, scratch)


def test_a_run_scoped_semaphore_in_the_body_matches_raw() -> None:
    assert_same_mosaic(_scoped_call(SAFE), _scoped_call(RAW), X, mesh=_v5p())


def test_a_copy_on_a_semaphore_the_body_scopes_is_t7_in_the_body() -> None:
    # Not handed to the kernel: outside the body the semaphore is gone, and there only
    # its type could match it (the pipeline's own waits would).
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_scoped_call(SAFE, "wait_dropped"), X, mesh=_v5p())
    text = str(err.value)
    assert text.startswith("kernel 'body'"), text
    assert f"called from {__file__}:{line_in(_scoped_in_body, '# SCOPED')}" in text, text


# --- nested pipelines: the outer step prefetches, the inner pipeline's first step waits --


def _prefetch_for_inner(safe: bool, seed: str = "") -> Callable[..., None]:
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        def outer(o_ref: Any) -> None:
            _copy(safe, x_hbm.at[pl.ds(0, ROWS)], acc, sems.at[0])  # OUTER PREFETCH

            def inner(x_ref: Any) -> None:
                @pl.when(pl.program_id(0) == 0)
                def _() -> None:
                    if seed != "wait_dropped":
                        _wait(safe, x_hbm.at[pl.ds(0, ROWS)], acc, sems.at[0])

                acc[...] += x_ref[...]

            emit(inner, grid=(STEPS,), in_specs=[BLOCK])(x_hbm)
            o_ref[...] = acc[...]

        emit(outer, grid=(2,), out_specs=[BLOCK])(o_hbm)

    return kernel


def _prefetch_call(safe: bool, seed: str = "") -> Any:
    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(_prefetch_for_inner(safe, seed), safe, scratch)


def test_an_outer_steps_prefetch_waited_in_the_inner_pipeline_matches_raw() -> None:
    assert_same_mosaic(_prefetch_call(SAFE), _prefetch_call(RAW), X, mesh=_v5p())


def test_an_outer_steps_prefetch_nothing_waits_is_t7_naming_the_outer_body() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_prefetch_call(SAFE, "wait_dropped"), X, mesh=_v5p())
    text = str(err.value)
    assert "in the body 'outer', started at" in text, text
    where = f"called from {__file__}:{line_in(_prefetch_for_inner, '# OUTER PREFETCH')}"
    assert where in text, text


ANY = pl.BlockSpec(memory_space=pl.ANY)


def _banks(safe: bool) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, inbuf: Any, outbuf: Any, gather: Any, scatter: Any) -> None:
        def copy(src: Any, dst: Any, sem: Any) -> Any:
            return sd.LocalCopy(src, dst, sem) if safe else pltpu.make_async_copy(src, dst, sem)

        def rows(n: int) -> Any:
            return pl.ds(n * 8, 8)

        for n in range(2):
            copy(x_hbm.at[rows(n)], inbuf.at[n], gather.at[n]).start()
        for n in range(STEPS):
            bank = n % 2
            got = copy(x_hbm.at[rows(n)], inbuf.at[bank], gather.at[bank])
            (got.started_elsewhere() if safe else got).wait()
            if n >= 2:
                old = copy(outbuf.at[bank], o_hbm.at[rows(n - 2)], scatter.at[bank])
                (old.started_elsewhere() if safe else old).wait()
            outbuf[bank] = inbuf[bank] * 2.0
            copy(outbuf.at[bank], o_hbm.at[rows(n)], scatter.at[bank]).start()
            if n + 2 < STEPS:
                copy(x_hbm.at[rows(n + 2)], inbuf.at[bank], gather.at[bank]).start()
        for n in (STEPS - 1, STEPS - 2):
            last = copy(outbuf.at[n % 2], o_hbm.at[rows(n)], scatter.at[n % 2])
            (last.started_elsewhere() if safe else last).wait()

    return kernel


def test_unrolled_two_bank_pipeline_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((STEPS * 8, 128), jnp.float32)

    def call(safe: bool) -> Any:
        vmem = sd.vmem if safe else pltpu.VMEM
        sems = sd.dma_semaphores(2) if safe else pltpu.SemaphoreType.DMA((2,))
        entry: Any = sd.pallas_call if safe else pl.pallas_call
        return jax.jit(
            entry(
                _banks(safe),
                x,
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=[
                    vmem((2, 8, 128), jnp.float32),
                    vmem((2, 8, 128), jnp.float32),
                    sems,
                    sems,
                ],
            )
        )

    assert_same_mosaic(call(True), call(False), x)


# --- the mechanism, on a small kernel -----------------------------------------------------


def _prologue_then_pipeline(wait_in_body: str) -> Any:
    """A copy started before an ``emit_pipeline`` and waited at every step of its body
    (``wait_in_body``: how), next to a copy on another semaphore that nothing waits."""

    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any, other: Any) -> None:
        sd.LocalCopy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[0]).start()  # PROLOGUE
        if wait_in_body == "leak":
            sd.LocalCopy(x_hbm.at[pl.ds(8, 8)], buf, other).start()  # LEAKED

        def body(x_ref: Any, o_ref: Any, b_ref: Any, s_ref: Any) -> None:
            slot = pl.program_id(0) % 2
            if wait_in_body == "wait_bytes":
                sd.wait_bytes(s_ref.at[slot], b_ref)
            else:
                sd.LocalCopy(
                    x_hbm.at[pl.ds(0, 8)], b_ref, s_ref.at[slot]
                ).started_elsewhere().wait()
            o_ref[...] = x_ref[...] + b_ref[...]

        block = pl.BlockSpec((8, 128), lambda i: (i, 0))
        sd.emit_pipeline(body, grid=(4,), in_specs=[block], out_specs=block)(
            x_hbm, o_hbm, scratches=[buf, sems]
        )

    x = jax.ShapeDtypeStruct((32, 128), jnp.float32)
    return sd.pallas_call(
        kernel,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=x,
        scratch_shapes=[
            pltpu.VMEM((8, 128), jnp.float32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA(()),
        ],
    ), x


@pytest.mark.parametrize("how", ["wait_bytes", "started_elsewhere"])
def test_a_wait_in_a_pipeline_body_stands_for_a_copy_started_before_it(how: str) -> None:
    call, x = _prologue_then_pipeline(how)
    assert "tpu.wait_dma" in mosaic_text(call, x, mesh=_v5p())  # before the fix: T7 (prologue)


def test_a_wait_in_a_pipeline_body_does_not_cover_another_semaphore() -> None:
    call, x = _prologue_then_pipeline("leak")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(call, x, mesh=_v5p())
    text = str(err.value)
    assert f"{__file__}:{line_in(_prologue_then_pipeline, '# LEAKED')}" in text
    assert f":{line_in(_prologue_then_pipeline, '# PROLOGUE')}" not in text


PAGES, PAGE, D, BLOCK_PAGES = 8, 8, 128, 2


def _tpu_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- the next block prefetched inside a while_loop body -----------------------------------


def _while_prefetch(safe: bool, *, wait_on_other: bool = False) -> Callable[..., None]:
    make = sd.LocalCopy if safe else pltpu.make_async_copy

    def kernel(count_ref: Any, pages: Any, o_ref: Any, buf: Any, sems: Any, others: Any) -> None:
        count = count_ref[0]

        def copy(block: Any, slot: Any, on: Any) -> Any:
            return make(
                pages.at[pl.ds(block * BLOCK_PAGES, BLOCK_PAGES)], buf.at[slot], on.at[slot]
            )

        copy(0, 0, sems).start()

        def more(state: tuple[Any, Any]) -> Any:
            return state[0] < count

        def step(state: tuple[Any, Any]) -> tuple[Any, Any]:
            block, slot = state
            following = jax.lax.select(slot == 0, 1, 0)

            @pl.when(block + 1 < count)
            def _prefetch() -> None:
                copy(block + 1, following, sems).start()

            current = copy(block, slot, others if wait_on_other else sems)
            (current.started_elsewhere() if safe else current).wait()
            o_ref[...] += buf.at[slot][...].reshape(o_ref.shape)
            return block + 1, following

        jax.lax.while_loop(more, step, (0, 0))

    return kernel


def _while_call(kernel: Callable[..., None], entry: Any) -> Any:
    def run(count: jax.Array, pages: jax.Array) -> Any:
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            in_specs=[ANY],
            out_specs=pl.BlockSpec((BLOCK_PAGES * PAGE, D), lambda i, *_: (0, 0)),
            grid=(1,),
            scratch_shapes=[
                pltpu.VMEM((2, BLOCK_PAGES, PAGE, D), jnp.float32),
                sd.dma_semaphores(2),
                sd.dma_semaphores(2),
            ],
        )
        shape = jax.ShapeDtypeStruct((BLOCK_PAGES * PAGE, D), jnp.float32)
        return entry(kernel, out_shape=shape, grid_spec=grid_spec)(count, pages)

    return jax.jit(run)


def _while_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((PAGES, PAGE, D), jnp.float32),
    )


def test_prefetch_inside_a_while_loop_body_matches_raw() -> None:
    assert_same_mosaic(
        _while_call(_while_prefetch(SAFE), sd.pallas_call),
        _while_call(_while_prefetch(RAW), pl.pallas_call),
        *_while_args(),
        mesh=_tpu_mesh(),
    )


def test_while_loop_wait_on_the_other_semaphore_array_is_t7() -> None:
    broken = _while_call(_while_prefetch(SAFE, wait_on_other=True), sd.pallas_call)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_while_args(), mesh=_tpu_mesh())
    message = str(err.value)
    prefetch = line_in(_while_prefetch, "copy(block + 1, following, sems).start()")
    assert f"{__file__}:{prefetch}" in message, message
    assert "on the semaphore the copy was started on" in message


# --- an emit_pipeline as the pallas_call body, three outputs ------------------------------

T, S, E, TB = 64, 4, 128, 16


def _three_outputs(pallas_call: Any, emit_pipeline: Any) -> Any:
    def body(x_ref: Any, w_ref: Any, *refs: Any) -> None:
        outs = iter(refs)
        s = x_ref[...].sum(axis=-1) * w_ref[0, 0]
        for ref, value in zip(
            outs, (s, s * 2, jnp.broadcast_to(s[:, :, None], (TB, S, S))), strict=True
        ):
            ref[...] = value

    def rows(*shape: int) -> pl.BlockSpec:
        return pl.BlockSpec((TB, *shape), lambda i: (i, *(0,) * len(shape)))

    pipeline = emit_pipeline(
        body,
        grid=(T // TB,),
        in_specs=(rows(S, E), pl.BlockSpec((8, 128), lambda i: (0, 0))),
        out_specs=(rows(S), rows(S), rows(S, S)),
        dimension_semantics=(pltpu.PARALLEL,),
    )
    hbm = pl.BlockSpec(memory_space=pltpu.HBM)

    def run(x: jax.Array, w: jax.Array) -> Any:
        shapes = (
            jax.ShapeDtypeStruct((T, S), jnp.float32),
            jax.ShapeDtypeStruct((T, S), jnp.float32),
            jax.ShapeDtypeStruct((T, S, S), jnp.float32),
        )
        first, second, third = pallas_call(
            pipeline, out_shape=shapes, in_specs=[hbm] * 2, out_specs=[hbm] * 3
        )(x, w)
        return first + second + third.sum(-1)

    return jax.jit(run)


def test_emit_pipeline_as_the_kernel_body_with_three_outputs_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((T, S, E), jnp.float32)
    w = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert_same_mosaic(
        _three_outputs(sd.pallas_call, sd.emit_pipeline),
        _three_outputs(pl.pallas_call, pltpu.emit_pipeline),
        x,
        w,
        mesh=_tpu_mesh(),
    )
