"""Trace checks on pipelined kernels: write-backs waited after the pipeline, per-step
stores drained by size.

Correct kernels around ``sd.emit_pipeline`` that the ledger's rules for pipelines reach (a
body's ledger with a parent, waits by slot recorded up the chain, raw waits counted from
where a body began), each written in safedma and in raw pltpu: the safedma one must
trace and lower to the same Mosaic module as its raw twin. Then the seeded mistakes the
trace checks must still stop (T7), naming the user's line.

The protocols are those of pipelined kernels that finish with a write the kernel waits
after the pipeline (an accumulator written back at the last step, as jax's pipelining
guide's reductions and tokamax's / maxtext's ragged matmuls do with their output block),
and of per-step stores drained by their total size once the pipeline is done.
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
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
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


def _call(kernel: Callable[..., None], safe: bool, scratch: list[Any]) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call
    x = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)
    return entry(
        kernel,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=x,
        grid=(1,),
        scratch_shapes=scratch,
    )


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


# --- DMA accumulate with an indexed side, in a kernel known to run on TensorCores --------


def _indexed_add(how: str) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, idx: Any, sem: Any) -> None:
        idx[...] = jnp.arange(ROWS, dtype=jnp.int32)
        src, dst = x_hbm.at[pl.ds(0, ROWS)], o_hbm.at[idx]
        if how == "sync_copy":
            sd.sync_copy(src, dst, add=True)  # ADD BY SYNC_COPY
        else:
            sd.LocalCopy(src, dst, sem).start(add=True).wait()  # ADD BY START

    return kernel


def _core_mesh() -> Any:
    if hasattr(pltpu, "TensorCoreMesh"):
        return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)  # jax 0.12
    return pltpu.create_tensorcore_mesh("core", num_cores=2)


@pytest.mark.parametrize("entry", ["pallas_call", "core_kernel"])
@pytest.mark.parametrize("how", ["start", "sync_copy"])
def test_an_indexed_add_on_tensor_cores_is_t5(entry: str, how: str) -> None:
    # add=True was once let through wherever a side is indexed by an array (SparseCore's
    # indirect copies), so this reached jax's TensorCore lowering: "DMA with add=True is
    # not supported" (NotImplementedError), and interpret mode does a plain copy.
    scratch = [pltpu.VMEM((ROWS,), jnp.int32), pltpu.SemaphoreType.DMA(())]
    if entry == "pallas_call":
        call = _call(_indexed_add(how), SAFE, scratch)
    else:
        call = sd.core_kernel(_indexed_add(how), X, mesh=_core_mesh(), scratch_types=scratch)
    with pytest.raises(sd.UnsupportedDmaError) as err:
        jax.eval_shape(call, X)
    assert "This kernel runs on TensorCores" in str(err.value), err.value
    marker = "# ADD BY START" if how == "start" else "# ADD BY SYNC_COPY"
    assert line_in(_indexed_add, marker) in raising_lines(err, __file__)


# --- a DMA future finished in branches --------------------------------------------------


def _future_start(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()


def _future_done(x_ref: Any, o_ref: Any, sem: Any) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def _finishes(shape: str) -> Callable[..., jax.Array]:
    @sd.checked_futures
    def f(x: jax.Array, flag: jax.Array) -> jax.Array:
        future = sd.start_async(_future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
        if shape == "switch":
            finish = lambda: sd.finish_async(_future_done, future)  # noqa: E731
            return lax.switch(flag[0], [finish, lambda: finish() * 2, lambda: finish() + 1])
        first = sd.finish_async(_future_done, future)  # FIRST
        maybe = lax.cond(flag[0] > 0, lambda: sd.finish_async(_future_done, future), lambda: x)
        return first + maybe + sd.finish_async(_future_done, future)  # AGAIN

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
