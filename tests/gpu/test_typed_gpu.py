"""safedma.gpu: typed kernels trace to their raw plgpu twins, and each mistake is named.

Every kernel is traced on CPU (nothing is compiled or run). A mistake test checks the
error class, what the message says (the buffer, the barrier, the fix) and that it
names the line of this file where the mistake is, marked ``# <- name``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from safedma import gpu
from safedma.testing._gpu.jax_seam import plgpu_available

if not (gpu.available() and plgpu_available()):
    pytest.skip(
        "this jax has no Pallas Mosaic GPU API (plgpu.kernel with out_type, barrier types) "
        "that safedma.gpu lowers to",
        allow_module_level=True,
    )

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from examples import gpu_double_buffer as example
from safedma.testing import GpuVerifyReport, verify_gpu

T = 64
X = jax.ShapeDtypeStruct((4 * T, 128), jnp.float32)
HERE = Path(__file__)


def _line(tag: str) -> str:
    """``file:line`` of the line of this file marked ``# <- tag``."""
    lines = HERE.read_text().splitlines()
    (number,) = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# <- {tag}")]
    return f"{HERE}:{number}"


def _kernel(body: Callable[..., None], *, arrivals: int = 1) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        return plgpu.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_types=[
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.SMEM((2, T, 128), jnp.float32),
                plgpu.Barrier(num_arrivals=arrivals, num_barriers=2),
            ],
        )(x)

    return run


def _trace(body: Callable[..., None], **kw: Any) -> str:
    return example.jaxpr_text(_kernel(body, **kw), X)


def _wrap(tma: gpu.Tma, smem_in: Any, smem_out: Any, bars: Any) -> tuple[Any, Any, Any]:
    return tma.smem(smem_in, "smem_in"), tma.smem(smem_out, "smem_out"), tma.barriers(bars)


# --- the example and its twin ------------------------------------------------------------


def test_the_typed_example_traces_to_its_raw_twin() -> None:
    x = jax.ShapeDtypeStruct((example.STEPS * example.ROWS, example.COLS), jnp.float32)
    typed = example.jaxpr_text(example.kernel(example.typed_body), x)
    raw = example.jaxpr_text(example.kernel(example.raw_body), x)
    assert typed == raw
    assert typed.count("barrier_wait") == example.STEPS
    assert typed.count("wait_smem_to_gmem[n=1 wait_read_only=True]") == example.STEPS - 2
    assert typed.count("wait_smem_to_gmem[n=0 wait_read_only=False]") == 1


@pytest.mark.parametrize("body", [example.typed_body, example.raw_body], ids=["typed", "raw"])
def test_verify_gpu_proves_both_clean(body: Callable[..., None]) -> None:
    x = jax.ShapeDtypeStruct((example.STEPS * example.ROWS, example.COLS), jnp.float32)
    steps = example.STEPS
    assert verify_gpu(example.kernel(body), x) == GpuVerifyReport(
        kernels=1, programs=1, copies_in=steps, copies_out=steps, barrier_waits=steps
    )


def test_two_loads_on_one_two_arrival_barrier_wait_once() -> None:
    """Both handles observe the same phase: the first wait emits the barrier_wait, the
    second emits nothing."""

    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            a = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            b = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], ins.at(1), barriers.at(0))
            first, second = a.wait(), b.wait()
            done = gpu.commit_smem(outs.at(0).write(first.read() + second.read()))
            gpu.copy_smem_to_gmem(done, o_gmem.at[pl.ds(0, T)])
            tma.wait_all_stores()

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], smem_in.at[1], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] + smem_in[1]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.wait_smem_to_gmem(0)

    assert _trace(typed, arrivals=2) == _trace(raw, arrivals=2)
    verify_gpu(_kernel(typed, arrivals=2), X)


def test_a_store_waited_by_name_waits_for_the_stores_after_it() -> None:
    """Three stores in flight: waiting the first by name leaves the two after it in flight
    (n=2); waiting the third leaves none (n=0) and covers the second, whose wait then
    emits nothing."""

    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            ready = gpu.commit_smem(outs.at(0).write(x.read() * 2), outs.at(1).write(x.read() * 3))
            first = gpu.copy_smem_to_gmem(ready[0], o_gmem.at[pl.ds(0, T)])
            second = gpu.copy_smem_to_gmem(ready[1], o_gmem.at[pl.ds(T, T)])
            third = gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(2 * T, T)])
            again = first.wait(read_only=True)
            third.wait(read_only=True)
            second.wait(read_only=True)  # covered by the wait of the third: nothing emitted
            gpu.copy_smem_to_gmem(
                gpu.commit_smem(again.write(x.read())), o_gmem.at[pl.ds(3 * T, T)]
            )
            tma.wait_all_stores()

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        smem_out[0] = smem_in[0] * 2
        smem_out[1] = smem_in[0] * 3
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.copy_smem_to_gmem(smem_out.at[1], o_gmem.at[pl.ds(T, T)])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[pl.ds(2 * T, T)])
        plgpu.wait_smem_to_gmem(2, wait_read_only=True)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        smem_out[0] = smem_in[0]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(3 * T, T)])
        plgpu.wait_smem_to_gmem(0)

    typed_text = _trace(typed)
    assert "wait_smem_to_gmem[n=2 wait_read_only=True]" in typed_text
    assert typed_text == _trace(raw)
    verify_gpu(_kernel(typed), X)


# --- mistakes, each at its line --------------------------------------------------------


def _raises(body: Callable[..., None], error: type[Exception], *, arrivals: int = 1) -> str:
    with pytest.raises(error) as caught:
        jax.make_jaxpr(_kernel(body, arrivals=arrivals))(X)
    return str(caught.value)


def test_a_load_handle_waited_twice() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            block, buffer = x_gmem.at[pl.ds(0, T)], ins.at(0)
            load = gpu.copy_gmem_to_smem(block, buffer, barriers.at(0))  # <- l0
            load.wait()  # <- l1
            load.wait()  # <- l2

    message = _raises(body, gpu.HandleWaitedTwiceError)
    assert f"TMA load into smem_in[0] (started at {_line('l0')})" in message
    assert f"waited at {_line('l1')} and again at {_line('l2')}" in message
    assert "kernel hangs" in message and "Delete the second wait" in message


def test_a_store_handle_waited_twice() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            store = gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(0, T)])
            store.wait()  # <- s1
            store.wait()  # <- s2

    message = _raises(body, gpu.HandleWaitedTwiceError)
    assert f"waited at {_line('s1')} and again at {_line('s2')}" in message
    assert "TMA store from smem_in[0]" in message


def test_a_buffer_read_while_its_load_lands() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            buffer = ins.at(1)
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], buffer, barriers.at(1))  # <- start
            buffer.read()  # <- read

    message = _raises(body, gpu.BufferBusyError)
    assert f"read of smem_in[1] at {_line('read')}" in message
    assert f"the TMA load into it started at {_line('start')}" in message
    assert "Wait the load's handle (buffer = handle.wait())" in message


def test_a_store_of_written_smem_without_commit() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            out = outs.at(0)
            out.write(x.read() * 2)  # <- write
            gpu.copy_smem_to_gmem(out, o_gmem.at[pl.ds(0, T)])  # <- uncommitted

    message = _raises(body, gpu.MissingCommitError)
    assert f"TMA store from smem_out[0] at {_line('uncommitted')}" in message
    assert f"the kernel wrote at {_line('write')} without commit_smem" in message
    assert "safedma.gpu.commit_smem(written)" in message


def test_a_buffer_overwritten_while_its_store_reads_it() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            ready = gpu.commit_smem(outs.at(0).write(x.read() * 2))
            gpu.copy_smem_to_gmem(ready, o_gmem.at[pl.ds(0, T)])  # <- reading
            ready.write(x.read() * 3)  # <- overwrite

    message = _raises(body, gpu.BufferBusyError)
    assert f"write to smem_out[0] at {_line('overwrite')}" in message
    assert f"the TMA store from it started at {_line('reading')}" in message
    assert "store.wait(read_only=True)" in message


def test_a_load_into_a_buffer_a_store_reads() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(0, T)])  # <- stored
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], x, barriers.at(1))  # <- reload

    message = _raises(body, gpu.BufferBusyError)
    assert f"a TMA load into smem_in[0] at {_line('reload')}" in message
    assert f"the TMA store from it started at {_line('stored')}" in message


def test_a_wait_on_a_barrier_short_of_arrivals() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            load = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            load.wait()  # <- short

    message = _raises(body, gpu.BarrierPhaseError, arrivals=2)
    assert f"wait() at {_line('short')}" in message
    assert "phase of barriers[0] that needs 2 arrivals, but only 1 were issued" in message
    assert "num_arrivals=1" in message


def test_a_second_load_on_a_barrier_whose_phase_is_not_waited() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))  # <- first
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], ins.at(1), barriers.at(0))  # <- second

    message = _raises(body, gpu.BarrierPhaseError)
    assert f"the TMA load into smem_in[1] at {_line('second')} arrives on barriers[0]" in message
    assert f"already got its 1 arrival(s) ({_line('first')})" in message
    assert "Wait the earlier load's handle" in message


def test_a_traced_index_is_refused_with_the_way_out() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, _ = _wrap(tma, smem_in, smem_out, bars)

            def step(i: Any, carry: None) -> None:
                ins.at(i % 2)  # <- traced
                return carry

            jax.lax.fori_loop(0, 2, step, None)

    message = _raises(body, TypeError)
    assert _line("traced") in message and "Python int index" in message
    assert re.search(r"Unroll the loop", message)


def test_an_smem_ref_where_a_barrier_belongs_is_refused() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        gpu.Tma().barriers(smem_in, "smem_in")  # <- not_barrier

    message = _raises(body, TypeError)
    assert f"smem_in at {_line('not_barrier')}" in message and "plgpu.Barrier" in message


# --- Tma.fori_loop -------------------------------------------------------------------------


def test_the_typed_loop_traces_to_its_raw_twin_and_is_clean() -> None:
    x = jax.ShapeDtypeStruct((example.LOOP_STEPS * example.ROWS, example.COLS), jnp.float32)
    typed = example.jaxpr_text(example.kernel(example.typed_loop_body), x)
    assert typed == example.jaxpr_text(example.kernel(example.raw_loop_body), x)
    assert "fori_loop" in typed or "scan" in typed or "while" in typed
    steps = example.LOOP_STEPS
    for body in (example.typed_loop_body, example.raw_loop_body):
        assert verify_gpu(example.kernel(body), x) == GpuVerifyReport(
            kernels=1, programs=1, copies_in=steps, copies_out=steps, barrier_waits=steps
        )


def _loop(step: Callable[..., Any], carry: Callable[..., tuple[Any, ...]]) -> Callable[..., None]:
    """A kernel body: one load in flight, then ``tma.fori_loop(0, 3, step, carry(...))``,
    then a wait of each handle the loop returns."""

    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            first = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            env = (tma, ins, outs, barriers, x_gmem, o_gmem)
            for handle in tma.fori_loop(0, 3, lambda it, c: step(env, it, c), carry(first)):
                handle.wait()

    return body


def _prefetch(env: Any, it: Any) -> Any:
    _, ins, _, barriers, x_gmem, _ = env
    block = x_gmem.at[pl.ds((it.index + 1) * T, T)]
    return gpu.copy_gmem_to_smem(block, ins.at(it.slot(1)), barriers.at(it.slot(1)))


def test_a_loop_step_that_returns_its_own_load_is_refused() -> None:
    def step(env: Any, it: Any, carry: Any) -> Any:
        (load,) = carry
        _prefetch(env, it)
        return (load,)

    message = _raises(_loop(step, lambda first: (first,)), gpu.LoopCarryError)
    assert "does not match its start one step on" in message
    start, end = message.split("At the start of step i: ")[1].split("At the end, seen from")
    assert "smem_in[i]: loading (carry[0], on barriers[i])" in start
    assert "smem_in[i]: loading (not carried, on barriers[i])" in end
    assert "step.slot(k + 1) where it received step.slot(k)" in message


def test_a_load_in_flight_left_out_of_the_carry_is_refused() -> None:
    def step(env: Any, it: Any, carry: Any) -> Any:
        return carry

    message = _raises(_loop(step, lambda first: ()), gpu.LoopCarryError)
    assert "the TMA load into smem_in[0] started at" in message
    assert "not in the loop's carry: pass its handle" in message


def test_a_mistake_in_a_loop_step_names_its_line() -> None:
    def step(env: Any, it: Any, carry: Any) -> Any:
        (load,) = carry
        nxt = _prefetch(env, it)
        env[1].at(it.slot(1)).read()  # <- early_read
        load.wait()
        return (nxt,)

    message = _raises(_loop(step, lambda first: (first,)), gpu.BufferBusyError)
    assert f"read of smem_in[i+1] at {_line('early_read')}" in message


def test_a_correct_loop_step_traces() -> None:
    def step(env: Any, it: Any, carry: Any) -> Any:
        (load,) = carry
        nxt = _prefetch(env, it)
        load.wait()
        return (nxt,)

    jax.make_jaxpr(_kernel(_loop(step, lambda first: (first,))))(X)


def test_an_int_index_in_a_loop_step_is_refused() -> None:
    def step(env: Any, it: Any, carry: Any) -> Any:
        env[2].at(0)  # <- int_in_loop
        return carry

    message = _raises(_loop(step, lambda first: (first,)), TypeError)
    assert f"smem_out.at(0) at {_line('int_in_loop')}" in message
    assert "step.slot(k)" in message


def test_a_buffer_taken_before_the_loop_is_refused_in_its_step() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            out = outs.at(1)

            def step(it: Any, carry: Any) -> Any:
                out.read()  # <- outside_view
                return carry

            tma.fori_loop(0, 2, step, ())

    message = _raises(body, gpu.LoopCarryError)
    assert f"smem_out[1] used at {_line('outside_view')} was taken outside the loop" in message


def test_the_handles_carried_into_a_loop_are_used_up() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            first = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))

            def step(it: gpu.Step, carry: tuple[gpu.LoadHandle]) -> tuple[gpu.LoadHandle]:
                block = x_gmem.at[pl.ds((it.index + 1) * T, T)]
                nxt = gpu.copy_gmem_to_smem(block, ins.at(it.slot(1)), barriers.at(it.slot(1)))
                carry[0].wait()
                return (nxt,)

            (last,) = tma.fori_loop(0, 3, step, (first,))  # <- loop
            last.wait()
            first.wait()  # <- stale

    message = _raises(body, gpu.HandleWaitedTwiceError)
    assert f"waited at the loop at {_line('loop')} and again at {_line('stale')}" in message


def test_a_barrier_arrival_counts_toward_its_phase() -> None:
    """A two-arrival barrier: one copy and one barrier_arrive complete the phase."""

    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            load = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            barriers.at(0).arrive()
            x = load.wait()
            gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(0, T)])
            tma.wait_all_stores()

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_arrive(bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.wait_smem_to_gmem(0)

    assert _trace(typed, arrivals=2) == _trace(raw, arrivals=2)
    verify_gpu(_kernel(typed, arrivals=2), X)


def test_each_program_of_a_grid_copies_its_own_block() -> None:
    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            block = pl.ds(jax.lax.axis_index("g") * T, T)
            x = gpu.copy_gmem_to_smem(x_gmem.at[block], ins.at(0), barriers.at(0)).wait()
            gpu.copy_smem_to_gmem(x, o_gmem.at[block])
            tma.wait_all_stores()

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        block = pl.ds(jax.lax.axis_index("g") * T, T)
        plgpu.copy_gmem_to_smem(x_gmem.at[block], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[block])
        plgpu.wait_smem_to_gmem(0)

    def grid(body: Callable[..., None]) -> Callable[[Any], Any]:
        def run(x: Any) -> Any:
            return plgpu.kernel(
                body,
                out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                scratch_types=[
                    plgpu.SMEM((2, T, 128), jnp.float32),
                    plgpu.SMEM((2, T, 128), jnp.float32),
                    plgpu.Barrier(num_arrivals=1, num_barriers=2),
                ],
                grid=(4,),
                grid_names=("g",),
            )(x)

        return run

    assert example.jaxpr_text(grid(typed), X) == example.jaxpr_text(grid(raw), X)
    assert verify_gpu(grid(typed), X).programs == 4


def test_wrapping_a_ref_in_a_loop_step_is_refused() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        tma = gpu.Tma()

        def step(it: Any, carry: Any) -> Any:
            tma.smem(smem_in)  # <- wrap_in_loop
            return carry

        tma.fori_loop(0, 2, step, ())

    message = _raises(body, gpu.LoopCarryError)
    assert f"Tma.smem at {_line('wrap_in_loop')}" in message and "before Tma.fori_loop" in message


# --- handles dropped at the end of the body ----------------------------------------------


def test_a_load_handle_dropped_without_a_wait() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:  # <- load_body
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(1), barriers.at(1))  # <- dropped

    message = _raises(body, gpu.HandleDroppedError)
    assert f"with gpu.Tma() block at {_line('load_body')} ends with 1 copy handle(s)" in message
    assert f"the TMA load into smem_in[1] started at {_line('dropped')}" in message
    assert "buffer = load.wait()" in message and "carry it through Tma.fori_loop" in message


def test_a_store_handle_dropped_without_a_wait() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, outs, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            first = gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(0, T)])
            first.wait(read_only=True)
            gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(T, T)])  # <- unwaited_store

    message = _raises(body, gpu.HandleDroppedError)
    assert "1 copy handle(s) never waited" in message
    assert f"the TMA store from smem_in[0] started at {_line('unwaited_store')}" in message
    assert "store.wait(read_only=True), or tma.wait_all_stores()" in message


def test_a_handle_a_loop_returns_and_the_body_drops_names_its_line_in_the_step() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            first = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))

            def step(it: gpu.Step, carry: tuple[gpu.LoadHandle]) -> tuple[gpu.LoadHandle]:
                block = x_gmem.at[pl.ds((it.index + 1) * T, T)]
                buffer, barrier = ins.at(it.slot(1)), barriers.at(it.slot(1))
                nxt = gpu.copy_gmem_to_smem(block, buffer, barrier)  # <- in_step
                carry[0].wait()
                return (nxt,)

            tma.fori_loop(0, 3, step, (first,))

    message = _raises(body, gpu.HandleDroppedError)
    assert f"the TMA load into smem_in[1] started at {_line('in_step')}" in message


def test_handles_carried_through_a_loop_and_waited_in_later_steps_are_not_dropped() -> None:
    """The example's loop: each store is waited two steps after it starts, the last load
    and stores after the loop, the store the loop returns unnamed by wait_all_stores."""
    x = jax.ShapeDtypeStruct((example.LOOP_STEPS * example.ROWS, example.COLS), jnp.float32)
    text = example.jaxpr_text(example.kernel(example.typed_loop_body), x)
    assert text.count("wait_smem_to_gmem[n=0 wait_read_only=False]") == 1


def test_a_store_covered_by_a_later_stores_wait_is_not_dropped() -> None:
    """Waiting the second store by name (n=0) waits the first, whose handle is dropped;
    stores whose reads are done may finish their GMEM writes after the kernel."""

    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            x = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0)).wait()
            gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(0, T)])
            second = gpu.copy_smem_to_gmem(x, o_gmem.at[pl.ds(T, T)])
            second.wait(read_only=True)

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[pl.ds(T, T)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    assert _trace(typed) == _trace(raw)
    verify_gpu(_kernel(typed), X)


def test_a_load_landed_under_another_handles_wait_is_not_dropped() -> None:
    """Two loads on one two-arrival barrier: the first handle's wait observes both, so
    the second has landed though its own handle is never waited."""

    def typed(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            a = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], ins.at(1), barriers.at(0))
            gpu.copy_smem_to_gmem(a.wait(), o_gmem.at[pl.ds(0, T)]).wait()

    def raw(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], smem_in.at[0], bars.at[0])
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(T, T)], smem_in.at[1], bars.at[0])
        plgpu.barrier_wait(bars.at[0])
        plgpu.copy_smem_to_gmem(smem_in.at[0], o_gmem.at[pl.ds(0, T)])
        plgpu.wait_smem_to_gmem(0)

    assert _trace(typed, arrivals=2) == _trace(raw, arrivals=2)
    verify_gpu(_kernel(typed, arrivals=2), X)


def test_a_mistake_in_the_body_is_raised_as_itself_not_as_a_dropped_handle() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
            gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))
            raise ValueError("the body's own error")

    assert _raises(body, ValueError) == "the body's own error"


def test_a_copy_outside_the_with_block_of_its_tma_is_refused() -> None:
    def before(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        tma = gpu.Tma()
        ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
        gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))  # <- unopened

    def after(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        with gpu.Tma() as tma:
            ins, _, barriers = _wrap(tma, smem_in, smem_out, bars)
        gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))  # <- closed

    message = _raises(before, TypeError)
    assert (
        f"copy_gmem_to_smem() at {_line('unopened')}: the buffer's Tma is never opened" in message
    )
    assert "with gpu.Tma() as tma:" in message
    message = _raises(after, TypeError)
    assert f"at {_line('closed')}: the buffer's Tma is closed" in message


def test_a_tma_is_opened_once() -> None:
    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        tma = gpu.Tma()
        with tma:
            pass
        with tma:  # <- reopened
            pass

    message = _raises(body, TypeError)
    assert f"with Tma at {_line('reopened')}: this Tma was opened before" in message
