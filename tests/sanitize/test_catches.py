"""The sanitizer catches each kind of mistake, raw pltpu and safedma alike, in interpret mode:
the right class, the user's line, the semaphore or buffer by its parameter name, the device."""

from __future__ import annotations

import re
from typing import Any

import jax
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import (
    DeadlockError,
    LeftoverSemaphoreError,
    OutOfBoundsDmaError,
    SemaphoreIndexError,
)
from tests.sanitize.helpers import (
    F32,
    example,
    hbm_call,
    on_mesh,
    past_the_trace_checks,
    settle,
    started_never_waited,
)
from tests.support.simulation import line_of

X = (64, 128)


def _vmem(rows: int = 8) -> Any:
    return pltpu.VMEM((rows, 128), F32)


# ---------------------------------------------------------------- hangs


def raw_wait_never_started(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    # Inside a while loop: the trace-time checks leave a wait whose run count is traced
    # (at the body's top level they report this wait before any run).
    past_the_trace_checks(
        lambda: pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem).wait()  # hangs
    )


def raw_regular_never_signalled(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_wait(reg, 1)  # hangs


def safedma_started_elsewhere_never(
    x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef
) -> None:
    sd.LocalCopy(x_hbm.at[pl.ds(0, 8)], buf, sem).started_elsewhere().wait()  # hangs


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_raw_dma_wait_that_would_hang(mode: str) -> None:
    call = hbm_call(raw_wait_never_started, [_vmem(), pltpu.SemaphoreType.DMA(())], mode=mode)
    with pytest.raises(DeadlockError) as caught:
        call(example(X))
    text = str(caught.value)
    assert line_of(raw_wait_never_started, ".wait()") in text
    assert "DMA semaphore sem " in text and "device 0" in text
    assert "for 4096 bytes" in text and "still held 0 bytes" in text
    assert "skipped it and the kernel returned" in text


def test_regular_semaphore_wait_that_would_hang() -> None:
    call = hbm_call(raw_regular_never_signalled, [pltpu.SemaphoreType.REGULAR])
    with pytest.raises(DeadlockError, match=r"REGULAR semaphore reg for 1;") as caught:
        call(example(X))
    assert line_of(raw_regular_never_signalled, "pl.semaphore_wait") in str(caught.value)


def test_safedma_wait_that_would_hang() -> None:
    call = hbm_call(safedma_started_elsewhere_never, [_vmem(), sd.dma_semaphore()])
    with pytest.raises(DeadlockError) as caught:
        call(example(X))
    assert line_of(safedma_started_elsewhere_never, ".wait()") in str(caught.value)
    assert "DMA semaphore sem " in str(caught.value)


def test_a_hung_wait_returns_within_the_bound() -> None:
    """The kernel returns: 100 polls of at most about 1 ms each, not a hang."""
    import time

    call = hbm_call(raw_regular_never_signalled, [pltpu.SemaphoreType.REGULAR])
    start = time.perf_counter()
    with pytest.raises(DeadlockError):
        call(example(X))
    assert time.perf_counter() - start < 30


# ---------------------------------------------------------------- leftovers


def raw_started_never_waited(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem))


def raw_signal_never_waited(x_hbm: Any, o_hbm: Any, regs: Any) -> None:
    pl.semaphore_signal(regs.at[1], 3)


def raw_scoped_leftover(x_hbm: Any, o_hbm: Any) -> None:
    def body(buf: Any, scoped_sem: Any) -> None:
        started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, scoped_sem))

    pl.run_scoped(body, _vmem(), pltpu.SemaphoreType.DMA(()))


def safedma_signal_never_waited(x_hbm: sd.DataRef, o_hbm: sd.DataRef, reg: sd.RegularSem) -> None:
    sd.signal(reg, 2)


def test_dma_semaphore_left_non_zero_at_exit() -> None:
    call = hbm_call(raw_started_never_waited, [_vmem(), pltpu.SemaphoreType.DMA(())])
    with pytest.raises(LeftoverSemaphoreError) as caught:
        call(example(X))
    text = str(caught.value)
    assert re.search(r"DMA semaphore sem of kernel raw_started_never_waited holds 4096 bytes", text)
    assert "kernel exit" in text and "device 0" in text and "never waited" in text
    assert caught.value.leftovers[0].kind == "DMA"
    assert caught.value.leftovers[0].count == 4096


def test_regular_semaphore_left_non_zero_names_its_slot() -> None:
    call = hbm_call(raw_signal_never_waited, [pltpu.SemaphoreType.REGULAR((2,))])
    with pytest.raises(LeftoverSemaphoreError, match=r"REGULAR semaphore regs\[1\] .* holds 3 "):
        call(example(X))


def test_run_scoped_semaphore_left_non_zero_at_the_end_of_its_scope() -> None:
    call = hbm_call(raw_scoped_leftover, [])
    with pytest.raises(LeftoverSemaphoreError) as caught:
        call(example(X))
    text = str(caught.value)
    assert "DMA semaphore scoped_sem" in text
    assert f"end of the run_scoped body at {line_of(raw_scoped_leftover, 'pl.run_scoped')}" in text


def test_safedma_signal_never_waited() -> None:
    call = hbm_call(safedma_signal_never_waited, [sd.regular_semaphore()])
    with pytest.raises(LeftoverSemaphoreError, match=r"REGULAR semaphore reg of kernel"):
        call(example(X))


def signals_each_step(x_hbm: Any, o_hbm: Any, reg: Any, *, waits: int) -> None:
    pl.semaphore_signal(reg, 1)

    @pl.when(pl.program_id(0) == pl.num_programs(0) - 1)
    def _() -> None:
        pl.semaphore_wait(reg, waits)


# The kernel only signals: it never writes its output, which verify reports.
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_grid_kernel_semaphores_are_checked_at_the_last_step_only() -> None:
    import functools

    ok = hbm_call(
        functools.partial(signals_each_step, waits=4), [pltpu.SemaphoreType.REGULAR], grid=(4,)
    )
    ok(example(X))  # non-zero between steps is fine
    short = hbm_call(
        functools.partial(signals_each_step, waits=3), [pltpu.SemaphoreType.REGULAR], grid=(4,)
    )
    with pytest.raises(LeftoverSemaphoreError, match=r"holds 1 at kernel exit"):
        short(example(X))


# ---------------------------------------------------------------- bounds


def raw_window_from_a_loop(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    def body(i: Any, carry: Any) -> Any:
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 30, 8)], buf, sem)
        copy.start()  # i = 2: rows 60:68 of 64
        copy.wait()
        return carry

    lax.fori_loop(0, 3, body, 0)


def raw_semaphore_index_from_a_loop(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    def body(i: Any, carry: Any) -> Any:
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[i])
        copy.start()  # i = 2 of 2 semaphores
        copy.wait()
        return carry

    lax.fori_loop(0, 3, body, 0)


def safedma_window(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    def body(i: jax.Array, carry: int) -> int:
        sd.LocalCopy(buf, o_hbm.at[pl.ds(i * 30, 8)], sem).start().wait()
        return carry

    lax.fori_loop(0, 3, body, 0)


def test_raw_copy_window_out_of_bounds() -> None:
    call = hbm_call(raw_window_from_a_loop, [_vmem(), pltpu.SemaphoreType.DMA(())])
    with pytest.raises(OutOfBoundsDmaError) as caught:
        call(example(X))
    text = str(caught.value)
    assert line_of(raw_window_from_a_loop, "copy.start()") in text
    assert "reads source x_hbm[60:68, 0:128] (shape (64, 128))" in text
    assert "the window 60:68 is outside 0:64" in text and "not issued" in text


def test_safedma_copy_window_out_of_bounds_is_the_first_mistake_not_its_wait() -> None:
    """The copy is skipped; its wait then cannot be satisfied, and is not reported."""
    call = hbm_call(safedma_window, [_vmem(), sd.dma_semaphore()])
    with pytest.raises(OutOfBoundsDmaError, match=r"writes destination o_hbm\[60:68, 0:128\]"):
        call(example(X))


def test_semaphore_index_out_of_range() -> None:
    call = hbm_call(raw_semaphore_index_from_a_loop, [_vmem(), pltpu.SemaphoreType.DMA((2,))])
    with pytest.raises(SemaphoreIndexError) as caught:
        call(example(X))
    assert isinstance(caught.value, sd.SemaphoreIndexError)
    text = str(caught.value)
    assert "uses semaphore sems[2] (shape (2,)); index 2 in dimension 0 is outside 0:2" in text
    assert line_of(raw_semaphore_index_from_a_loop, "copy.start()") in text


# ---------------------------------------------------------------- under jit


def test_under_jit_the_error_surfaces_through_sanitizer_errors() -> None:
    call = jax.jit(hbm_call(raw_window_from_a_loop, [_vmem(), pltpu.SemaphoreType.DMA(())]))
    with pytest.raises(jax.errors.JaxRuntimeError):
        jax.block_until_ready(call(example(X)))
    settle()
    with pytest.raises(OutOfBoundsDmaError) as caught, sd.sanitizer_errors():
        jax.block_until_ready(call(example(X)))
    assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)


def test_sanitizer_errors_as_a_decorator() -> None:
    call = jax.jit(hbm_call(raw_regular_never_signalled, [pltpu.SemaphoreType.REGULAR]))

    @sd.sanitizer_errors()
    def run() -> None:
        jax.block_until_ready(call(example(X)))

    with pytest.raises(DeadlockError):
        run()


# ---------------------------------------------------------------- several devices

RING = 4


def raw_ring_one_sender_skips(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    me = lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(me + 1) % RING)

    @pl.when(me != 1)  # device 1 never sends: device 2 waits forever
    def _() -> None:
        copy.start()
        copy.wait_send()

    copy.wait_recv()


def test_remote_receive_that_would_hang_names_its_device() -> None:
    def per_device(x: jax.Array) -> jax.Array:
        return hbm_call(
            raw_ring_one_sender_skips, [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]
        )(x)

    program = on_mesh(per_device, RING)
    with pytest.raises(DeadlockError) as caught, sd.sanitizer_errors():
        jax.block_until_ready(program(example((RING * 8, 128))))
    text = str(caught.value)
    assert "device 2 (x=2)" in text and "wait_recv" in text and "recv_sem" in text
    assert line_of(raw_ring_one_sender_skips, "copy.wait_recv()") in text
    assert "(a lower bound" in text or "for 4096 bytes" in text
