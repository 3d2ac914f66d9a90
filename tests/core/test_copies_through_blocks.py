"""Copies whose semaphore or buffer reaches a block (a branch, a loop, a pipeline, a jitted
helper) as an argument: paired by the slot they name, not lost at the block's edge.

* a copy a pipeline step starts on a semaphore that reaches the pipeline as a ``lax.cond``
  / ``lax.switch`` operand or a ``fori_loop`` carry, waited after the pipeline;
* ``jax_use_emit_pipeline_primitive``: the pipeline is one equation whose body jaxpr the
  raw-wait reader follows;
* a copy on a branch's or loop's argument, waited after it on the array it received;
* a copy started in a ``jax.jit`` helper on its parameter, waited by the kernel.

Each correct kernel lowers to the same Mosaic module as its raw twin on a device-free
``tpu="v5p"`` mesh; each seeded mistake is stopped at trace time naming the user's line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)
STEPS, ROWS, LANES = 4, 8, 128
BLOCK = pl.BlockSpec((ROWS, LANES), lambda i: (i, 0))
X = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)
SAFE, RAW = True, False


def _v5p() -> Any:
    """A device-free mesh naming the TPU generation (jax 0.12 asks for one to lower)."""
    return abstract_mesh((1,), ("x",), tpu="v5p")


@pytest.fixture(params=["loops", "primitive"])
def pipeline_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each pipeline test twice: traced as jax's loops (the default) and as one
    ``emit_pipeline`` equation (``jax_use_emit_pipeline_primitive``)."""
    before = jax.config.jax_use_emit_pipeline_primitive
    jax.config.update("jax_use_emit_pipeline_primitive", request.param == "primitive")
    try:
        yield str(request.param)
    finally:
        jax.config.update("jax_use_emit_pipeline_primitive", before)


def _call(kernel: Callable[..., None], safe: bool, scratch: list[Any]) -> Any:
    entry: Any = sd.pallas_call if safe else pl.pallas_call
    return entry(
        kernel, in_specs=[ANY], out_specs=ANY, out_shape=X, grid=(1,), scratch_shapes=scratch
    )


# --- a pipeline's write-back on a semaphore passed into a branch or a loop --------------


def _copy(safe: bool, src: Any, dst: Any, sem: Any) -> None:
    if safe:
        sd.LocalCopy(src, dst, sem).start()  # STARTED
    else:
        pltpu.make_async_copy(src, dst, sem).start()


def _passed_in(safe: bool, where: str, wait: str = "started_elsewhere", seed: str = "") -> Any:
    """Sum the row blocks of ``x`` in ``acc`` across a pipeline; its last step starts the
    accumulator's copy to ``o``, waited after the pipeline. The pipeline runs in a block
    that receives the semaphores as its argument (``where``: a ``lax.cond`` branch, both
    branches of a ``lax.switch``, a ``fori_loop`` of two passes carrying them), in a
    ``run_scoped`` block that allocates them, or in the kernel with the last step passing
    them into a ``lax.cond`` of its own (``body_cond``)."""
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        def one_pass(sems: Any) -> None:
            def body(x_ref: Any) -> None:
                step = pl.program_id(0)

                @pl.when(step == 0)
                def _() -> None:
                    acc[...] = jnp.zeros_like(acc)

                acc[...] += x_ref[...]

                def last(sems: Any) -> None:
                    _copy(safe, acc, o_hbm.at[pl.ds(0, ROWS)], sems.at[0])  # LAST STEP

                if where == "body_cond":  # the step passes them into its own branch
                    lax.cond(step == STEPS - 1, last, lambda sems: None, sems)
                else:
                    pl.when(step == STEPS - 1)(lambda: last(sems))

            emit(body, grid=(STEPS,), in_specs=[BLOCK])(x_hbm)
            if seed == "wait_dropped":
                return
            slot = sems.at[1] if seed == "wrong_slot" else sems.at[0]
            if safe and wait == "started_elsewhere":
                sd.LocalCopy(acc, o_hbm.at[pl.ds(0, ROWS)], slot).started_elsewhere().wait()
            else:  # raw, as a safedma kernel may write it too
                pltpu.make_async_copy(acc, o_hbm.at[pl.ds(0, ROWS)], slot).wait()

        if where == "cond":
            lax.cond(pl.program_id(0) == 0, one_pass, lambda sems: None, sems)
        elif where == "switch":
            lax.switch(pl.program_id(0), [one_pass, one_pass], sems)
        elif where == "scoped":  # semaphores of the run_scoped block around the pipeline
            pl.run_scoped(one_pass, pltpu.SemaphoreType.DMA((2,)))
        elif where == "body_cond":
            one_pass(sems)
        else:

            def twice(i: Any, sems: Any) -> Any:
                one_pass(sems)
                return sems

            lax.fori_loop(0, 2, twice, sems)

    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(kernel, safe, scratch)


WHERE = ["cond", "switch", "fori_loop", "scoped", "body_cond"]


@pytest.mark.parametrize("wait", ["started_elsewhere", "raw"])
@pytest.mark.parametrize("where", WHERE)
def test_a_write_back_on_a_semaphore_passed_into_a_block_matches_raw(
    where: str, wait: str, pipeline_kind: str
) -> None:
    # Formerly: T7 in the body (the semaphore, a new tracer in the block, was
    # not handed to the kernel: outside, only its type could match it); scoped: T7 in the
    # kernel with the raw wait (a wait on "some scoped semaphore" there).
    assert_same_mosaic(_passed_in(SAFE, where, wait), _passed_in(RAW, where, wait), X, mesh=_v5p())


@pytest.mark.parametrize("seed", ["wait_dropped", "wrong_slot"])
@pytest.mark.parametrize("where", WHERE)
def test_a_write_back_on_a_passed_semaphore_never_waited_is_t7_naming_the_body(
    where: str, seed: str, pipeline_kind: str
) -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_passed_in(SAFE, where, seed=seed), X, mesh=_v5p())
    text = str(err.value)
    # Handed to the kernel: the pipeline's own waits (on its buffers' semaphores, of the
    # same type) and the wait on the other slot do not stand for it there.
    assert text.startswith("kernel 'kernel'"), text
    assert "in the body 'body', started at" in text, text
    started = f"{__file__}:{line_in(_copy, '# STARTED')}"
    assert f"{started} (called from {__file__}:{line_in(_passed_in, '# LAST STEP')}" in text


# --- raw waits inside the pipeline primitive are followed -------------------------------


def _prefetch(safe: bool, seed: str = "") -> Any:
    """The kernel prefetches the first block into ``acc`` on ``sems.at[0]``; the
    pipeline's first step waits it (raw) before adding the blocks. Seed ``polled``: the
    step only reads that semaphore's value and waits a copy of its own on ``other``, so
    nothing waits the prefetch."""
    emit: Any = sd.emit_pipeline if safe else pltpu.emit_pipeline

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any, other: Any) -> None:
        _copy(safe, x_hbm.at[pl.ds(0, ROWS)], acc, sems.at[0])  # PREFETCH

        def body(x_ref: Any) -> None:
            if seed == "polled":
                pl.semaphore_read(sems.at[0])
                pltpu.make_async_copy(x_ref, acc, other).start()
                pltpu.make_async_copy(x_ref, acc, other).wait()
            else:

                @pl.when(pl.program_id(0) == 0)
                def _() -> None:
                    pltpu.make_async_copy(x_hbm.at[pl.ds(0, ROWS)], acc, sems.at[0]).wait()

            acc[...] += x_ref[...]

        emit(body, grid=(STEPS,), in_specs=[BLOCK])(x_hbm)
        del o_hbm

    scratch = [
        pltpu.VMEM((ROWS, LANES), jnp.float32),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.DMA(()),
    ]
    return _call(kernel, safe, scratch)


def test_a_prefetch_waited_raw_in_the_first_step_matches_raw(pipeline_kind: str) -> None:
    assert_same_mosaic(_prefetch(SAFE), _prefetch(RAW), X, mesh=_v5p())


def test_a_prefetch_the_steps_only_poll_is_t7(pipeline_kind: str) -> None:
    # A miss formerly with the primitive: the body's raw waits were not followed,
    # so every semaphore the body closes over (sems, read only) counted as waited.
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_prefetch(SAFE, "polled"), X, mesh=_v5p())
    text = str(err.value)
    assert text.startswith("kernel 'kernel'"), text
    assert f"called from {__file__}:{line_in(_prefetch, '# PREFETCH')}" in text, text


# --- a copy on a branch's or loop's argument, waited after it on the array it received ----


def _started_in_a_block(where: str, wait: str, slot: int) -> Any:
    """A copy started on ``s.at[0]`` where ``s`` is a ``lax.cond`` branch's operand or a
    ``fori_loop`` carry (the kernel's ``sems``), waited after the block on ``sems.at[slot]``
    (through safedma or raw)."""

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        src, dst = x_hbm.at[pl.ds(0, ROWS)], o_hbm.at[pl.ds(0, ROWS)]

        def start(s: Any) -> None:
            sd.LocalCopy(src, dst, s.at[0]).start()  # IN THE BLOCK

        if where == "cond":
            lax.cond(pl.program_id(0) == 0, start, lambda s: None, sems)
        else:

            def once(i: Any, s: Any) -> Any:
                start(s)
                return s

            lax.fori_loop(0, 1, once, sems)
        if wait == "raw":
            pltpu.make_async_copy(src, dst, sems.at[slot]).wait()
        else:
            sd.LocalCopy(src, dst, sems.at[slot]).started_elsewhere().wait()
        del acc

    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(kernel, SAFE, scratch)


@pytest.mark.parametrize("wait", ["started_elsewhere", "raw"])
@pytest.mark.parametrize("where", ["cond", "fori_loop"])
def test_a_copy_on_a_block_argument_waited_after_the_block_traces(where: str, wait: str) -> None:
    assert "wait_dma" in mosaic_text(_started_in_a_block(where, wait, 0), X, mesh=_v5p())


@pytest.mark.parametrize("wait", ["started_elsewhere", "raw"])
@pytest.mark.parametrize("where", ["cond", "fori_loop"])
def test_a_copy_on_a_block_argument_waited_on_the_other_slot_is_t7(where: str, wait: str) -> None:
    # A miss formerly: a block's argument met any semaphore of its type, at any
    # slot; it is now followed out to the array it received, so the slots are compared.
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_started_in_a_block(where, wait, 1), X, mesh=_v5p())
    text = str(err.value)
    assert f"started at {__file__}:{line_in(_started_in_a_block, '# IN THE BLOCK')}" in text


def _view_into_a_branch(slot: int) -> Any:
    """A window ``sems.at[pl.ds(1, 2)]`` passed into a branch, whose copy is on its first
    semaphore (``sems`` slot 1); waited after the branch on ``sems.at[slot]``."""

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        src, dst = x_hbm.at[pl.ds(0, ROWS)], o_hbm.at[pl.ds(0, ROWS)]

        def start(window: Any) -> None:
            sd.LocalCopy(src, dst, window.at[0]).start()  # IN THE WINDOW

        lax.cond(pl.program_id(0) == 0, start, lambda window: None, sems.at[pl.ds(1, 2)])
        sd.LocalCopy(src, dst, sems.at[slot]).started_elsewhere().wait()
        del acc

    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((3,))]
    return _call(kernel, SAFE, scratch)


def test_a_copy_on_a_window_passed_into_a_branch_is_paired_by_its_slot_in_the_array() -> None:
    assert "wait_dma" in mosaic_text(_view_into_a_branch(1), X, mesh=_v5p())
    for slot in (0, 2):
        with pytest.raises(sd.CopyNeverWaitedError) as err:
            mosaic_text(_view_into_a_branch(slot), X, mesh=_v5p())
        where = f"{__file__}:{line_in(_view_into_a_branch, '# IN THE WINDOW')}"
        assert f"started at {where}" in str(err.value)


# --- a copy started in a jax.jit helper on its parameter, waited by the kernel ------------


def _helper_starts(safe: bool, slot: int) -> Any:
    """A ``jax.jit`` helper called in the kernel starts the copy on its semaphore
    parameter ``s.at[0]`` (a new tracer in the helper's jaxpr, the kernel's ``sems``); the
    kernel waits it after the call on ``sems.at[slot]``."""

    def start(x: Any, o: Any, s: Any) -> None:
        _copy(safe, x.at[pl.ds(0, ROWS)], o.at[pl.ds(0, ROWS)], s.at[0])

    def kernel(x_hbm: Any, o_hbm: Any, acc: Any, sems: Any) -> None:
        jax.jit(start)(x_hbm, o_hbm, sems)  # HELPER
        src, dst = x_hbm.at[pl.ds(0, ROWS)], o_hbm.at[pl.ds(0, ROWS)]
        if safe:
            sd.LocalCopy(src, dst, sems.at[slot]).started_elsewhere().wait()
        else:
            pltpu.make_async_copy(src, dst, sems.at[slot]).wait()
        del acc

    scratch = [pltpu.VMEM((ROWS, LANES), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
    return _call(kernel, safe, scratch)


def test_a_copy_a_jitted_helper_starts_waited_by_the_kernel_matches_raw() -> None:
    # Formerly: T7 (the helper's parameter is a tracer of its own jaxpr).
    assert_same_mosaic(_helper_starts(SAFE, 0), _helper_starts(RAW, 0), X, mesh=_v5p())


def test_a_copy_a_jitted_helper_starts_waited_on_the_other_slot_is_t7() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_helper_starts(SAFE, 1), X, mesh=_v5p())
    # jax's jit calls the helper: the chain of user lines ends at the helper's own line.
    started = f"{__file__}:{line_in(_copy, '# STARTED')}"
    helper = f"{__file__}:{line_in(_helper_starts, '_copy(safe, x.at')}"
    assert f"started at {started} (called from {helper}" in str(err.value), err.value
