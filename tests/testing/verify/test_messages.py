"""verify's errors name the user's own line, the device's mesh coordinates and the fix.

The kernels are written here, so the line an error must name is in this
file (marked ``# fix: <name>``); run on both jax versions. Also: the
face exports ``verify`` and its report, a clean report counts what it saw,
and what verify cannot decide (control flow on vector data, a needed value
given only as a shape) is said, pointing to ``simulate`` or naming the
operand.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma as sd
import safedma.kernels as sk
from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    UnsatisfiableWaitError,
    abstract_mesh,
    verify,
)
from tests.corpus._case import library_lines, marked_lines, names_line

HERE = Path(__file__)
HBM = pl.BlockSpec(memory_space=pl.ANY)
# Errors that mean verify is missing or could not take the program: never a verdict.
NOT_A_VERDICT = (ImportError, AttributeError, TypeError, NotImplementedError)
BLOCK = (8, 128)
RING = abstract_mesh((4,), ("x",))
GRID = abstract_mesh((2, 4), ("y", "x"))


def call(kernel: Any, scratch: list[Any]) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
        )(x)
        return out

    return per_device


def checked(kernel: Any, scratch: list[Any]) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        return sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
        )(x)

    return per_device


def run(fn: Any, mesh: Any) -> Any:
    devices = int(jnp.prod(jnp.array(mesh.axis_sizes)))
    x = jax.ShapeDtypeStruct((BLOCK[0] * devices, BLOCK[1]), jnp.float32)
    return verify(fn, x, mesh=mesh)


def raised(fn: Any, mesh: Any) -> BaseException:
    with pytest.raises(Exception) as caught:
        run(fn, mesh)
    error = caught.value
    if isinstance(error, NOT_A_VERDICT) or not isinstance(error, SimulationError):
        raise error
    return error


def assert_names_line(error: BaseException, marker: str) -> None:
    lines = marked_lines(HERE, marker)
    assert names_line(str(error), HERE, lines), (
        f"the user's line {HERE.name}:{lines} is not named:\n{error}"
    )
    # Lines inside the installed package, wherever the checkout is (its folder may be
    # called safedma too).
    assert not library_lines(str(error)), f"a line inside safedma is named:\n{error}"


def vmem() -> Any:
    return pltpu.VMEM(BLOCK, jnp.float32)


def dma() -> Any:
    return pltpu.SemaphoreType.DMA(())


# ------------------------------------------------------------------ the face


def test_verify_and_its_report_are_exported_from_safedma_testing() -> None:
    import safedma.testing as testing

    assert "verify" in testing.__all__
    assert "VerifyReport" in testing.__all__


def test_a_clean_report_counts_devices_copies_and_waits() -> None:
    def ring(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me, n = lax.axis_index("x"), lax.axis_size("x")
        c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})
        c.start()
        c.wait()

    report = run(call(ring, [dma(), dma()]), RING)
    assert report.devices == 4
    assert report.dmas >= 4 and report.remote_dmas >= 4, report
    assert report.waits >= 4, report
    assert "4 device" in str(report)


# ------------------------------------------------------------------ the line, device, fix


def leak_on_device_2(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    @pl.when(lax.axis_index("x") == 2)
    def _() -> None:
        pltpu.make_async_copy(x_ref, buf, sem).start()  # fix: msg_leak

    c = pltpu.make_async_copy(x_ref, o_ref, out_sem)
    c.start()
    c.wait()


def test_a_leak_on_one_device_names_it_the_line_and_the_fix() -> None:
    error = raised(call(leak_on_device_2, [vmem(), dma(), dma()]), RING)
    assert isinstance(error, LeftoverSemaphoreError), type(error).__name__
    text = str(error)
    assert "x=2" in text and not re.search(r"\bx=[013]\b", text), text
    assert re.search(r"\bsem\b", text), text
    assert "wait" in text, text
    assert_names_line(error, "msg_leak")


def two_signals_one_wait(x_ref: Any, o_ref: Any, sem: Any, reg: Any) -> None:
    right = {"x": (lax.axis_index("x") + 1) % lax.axis_size("x")}
    pl.semaphore_signal(reg, 1, device_id=right)  # fix: msg_two_signals
    pl.semaphore_signal(reg, 1, device_id=right)  # fix: msg_two_signals
    pl.semaphore_wait(reg, 1)
    c = pltpu.make_async_copy(x_ref, o_ref, sem)
    c.start()
    c.wait()


def test_a_leftover_a_wait_took_part_of_says_what_is_left_not_that_none_was_waited() -> None:
    """One wait of 1 took either of two signals (whichever landed first): the message
    says 1 of the 2 is left and names both lines, never "was never waited" for each."""
    error = raised(call(two_signals_one_wait, [dma(), pltpu.SemaphoreType.REGULAR]), RING)
    assert isinstance(error, LeftoverSemaphoreError), type(error).__name__
    text = str(error)
    assert "holds 1: its waits took 1 of the 2 brought by" in text, text
    assert "never waited" not in text, text
    assert len(marked_lines(HERE, "msg_two_signals")) == 2
    for line in marked_lines(HERE, "msg_two_signals"):
        assert f"{HERE.name}:{line}" in text, (line, text)


def safedma_leak_on_device_2(
    x_ref: sd.DataRef, o_ref: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef, out_sem: sd.SemRef
) -> None:
    @pl.when(sd.my_index("x") == 2)
    def _() -> None:
        sd.LocalCopy(x_ref, buf, sem).start()  # fix: msg_sd_leak

    sd.LocalCopy(x_ref, o_ref, out_sem).start().wait()


def test_a_safedma_leak_is_rejected_at_trace_time_naming_the_users_line() -> None:
    """A copy under pl.when with no wait on any path is wrong on every path, so safedma's
    trace-time check rejects it before verify runs,
    and it names the user's start, never a line inside safedma."""
    fn = checked(
        safedma_leak_on_device_2,
        [sd.vmem(BLOCK, jnp.float32), sd.dma_semaphore(), sd.dma_semaphore()],
    )
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        run(fn, RING)
    assert_names_line(caught.value, "msg_sd_leak")


def safedma_leak_through_started_elsewhere(
    x_ref: sd.DataRef, o_ref: sd.DataRef, bufs: sd.DataRef, sems: sd.SemArray, out_sem: sd.SemRef
) -> None:
    # The second slot is 1 on every device, through arithmetic (an exclusive or) whose
    # values the trace-time check does not follow: it may be any slot there, so the
    # check cannot tell the copies apart and the leak is verify's.
    me = sd.my_index("x")
    other = (me ^ me) + 1
    sd.LocalCopy(x_ref, bufs.at[0], sems.at[0]).start()
    sd.LocalCopy(x_ref, bufs.at[other], sems.at[other]).start()  # fix: msg_sd_slot
    sd.LocalCopy(x_ref, bufs.at[0], sems.at[0]).started_elsewhere().wait()
    sd.LocalCopy(x_ref, o_ref, out_sem).start().wait()


def safedma_leak_on_a_computed_slot(
    x_ref: sd.DataRef, o_ref: sd.DataRef, bufs: sd.DataRef, sems: sd.SemArray, out_sem: sd.SemRef
) -> None:
    # A computed slot that can only be 1: no wait (all on slot 0) can stand for it.
    other = sd.my_index("x") * 0 + 1
    sd.LocalCopy(x_ref, bufs.at[0], sems.at[0]).start()
    sd.LocalCopy(x_ref, bufs.at[other], sems.at[other]).start()  # fix: msg_sd_computed
    sd.LocalCopy(x_ref, bufs.at[0], sems.at[0]).started_elsewhere().wait()
    sd.LocalCopy(x_ref, o_ref, out_sem).start().wait()


def test_a_leak_on_a_computed_slot_no_wait_reaches_is_rejected_at_trace_time() -> None:
    fn = checked(
        safedma_leak_on_a_computed_slot,
        [sd.vmem((2, *BLOCK), jnp.float32), sd.dma_semaphores(2), sd.dma_semaphore()],
    )
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        run(fn, RING)
    assert_names_line(caught.value, "msg_sd_computed")


def test_a_safedma_copy_is_located_at_the_users_start_not_inside_safedma() -> None:
    fn = checked(
        safedma_leak_through_started_elsewhere,
        [sd.vmem((2, *BLOCK), jnp.float32), sd.dma_semaphores(2), sd.dma_semaphore()],
    )
    error = raised(fn, RING)
    assert isinstance(error, LeftoverSemaphoreError), type(error).__name__
    assert_names_line(error, "msg_sd_slot")


def leak_on_one_corner(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
    corner = (lax.axis_index("y") == 1) & (lax.axis_index("x") == 3)

    @pl.when(corner)
    def _() -> None:
        pltpu.make_async_copy(x_ref, buf, sem).start()  # fix: msg_corner

    c = pltpu.make_async_copy(x_ref, o_ref, out_sem)
    c.start()
    c.wait()


def test_devices_are_named_by_all_their_mesh_coordinates() -> None:
    error = raised(call(leak_on_one_corner, [vmem(), dma(), dma()]), GRID)
    text = str(error)
    assert re.search(r"y=1,\s*x=3", text), text
    assert_names_line(error, "msg_corner")


def receiver_without_sender(x_ref: Any, o_ref: Any, send: Any, recv: Any, local: Any) -> None:
    me = lax.axis_index("x")
    c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": 1})

    @pl.when(me == 1)
    def _receive() -> None:
        c.wait_recv()  # fix: msg_no_sender

    @pl.when(me != 1)
    def _own() -> None:
        own = pltpu.make_async_copy(x_ref, o_ref, local)
        own.start()
        own.wait()


def test_a_wait_nobody_can_release_is_a_deadlock_on_that_device() -> None:
    error = raised(call(receiver_without_sender, [dma(), dma(), dma()]), RING)
    assert isinstance(error, UnsatisfiableWaitError), type(error).__name__
    text = str(error)
    assert "x=1" in text and re.search(r"\brecv\b", text), text
    assert_names_line(error, "msg_no_sender")


def read_before_wait(x_ref: Any, o_ref: Any, buf: Any, res: Any, sem: Any, out: Any) -> None:
    c = pltpu.make_async_copy(x_ref, buf, sem)
    c.start()
    res[...] = buf[...] + 1.0  # fix: msg_race
    c.wait()
    d = pltpu.make_async_copy(res, o_ref, out)
    d.start()
    d.wait()


def test_a_race_names_the_read_and_the_copy_and_says_to_wait_first() -> None:
    error = raised(call(read_before_wait, [vmem(), vmem(), dma(), dma()]), RING)
    assert isinstance(error, RaceDetectedError), type(error).__name__
    text = str(error)
    assert re.search(r"\bbuf\b", text) and "wait" in text, text
    assert_names_line(error, "msg_race")


# ------------------------------------------------------------------ what verify cannot decide


def branch_on_data(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(x_ref, buf, sem)
    c.start()
    c.wait()

    @pl.when(buf[0, 0] > 0.0)  # fix: msg_data
    def _() -> None:
        d = pltpu.make_async_copy(buf, o_ref, sem)
        d.start()
        d.wait()


def test_control_flow_on_vector_data_points_to_simulate() -> None:
    error = raised(call(branch_on_data, [vmem(), dma()]), RING)
    assert "simulate" in str(error), str(error)
    assert_names_line(error, "msg_data")


def test_a_needed_value_given_only_as_a_shape_names_the_operand() -> None:
    pages = jax.ShapeDtypeStruct((4 * 4, 8, 128), jnp.float32)
    indices = jax.ShapeDtypeStruct((4,), jnp.int32)
    with pytest.raises(Exception) as caught:
        verify(sk.gather_pages, pages, indices, mesh=RING, in_specs=(P("x"), P()), out_specs=P("x"))
    error = caught.value
    if isinstance(error, NOT_A_VERDICT):
        raise error
    assert isinstance(error, SimulationError), type(error).__name__
    assert "indices" in str(error), str(error)


# ------------------------------------------- helpers' callers, unnamed parameters


def _filled_by_helper(drain: bool) -> Any:
    """The output is filled by a helper of another module, then read back."""
    from tests.support import dma_helpers

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        dma_helpers.fill_rows(buf, x_ref, sem, 2)  # fix: msg_helper_call
        if drain:
            dma_helpers.drain_rows(buf, x_ref, sem, 2)
        o_ref[...] = buf[0:8]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    return fn


def test_a_copy_in_another_modules_helper_names_the_kernel_line_that_called_it() -> None:
    x = jax.ShapeDtypeStruct(BLOCK, jnp.float32)
    assert verify(_filled_by_helper(True), x).dmas == 2
    with pytest.raises(RaceDetectedError) as caught:
        verify(_filled_by_helper(False), x)
    message = str(caught.value)
    # the copy's own line is in the helper module (inside its fori_loop body), the
    # call is this file's; the named_scope wrapper between them does not hide it
    assert "dma_helpers.py:" in message and "fill_rows.<locals>.body" in message, message
    (line,) = marked_lines(HERE, "msg_helper_call")
    assert f"called at {HERE}:{line} in _filled_by_helper.<locals>.kernel" in message, message


def _copy_in_when_body() -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        @pl.when(pl.program_id(0) == 0)  # fix: msg_when_guard
        def _() -> None:
            pltpu.make_async_copy(x_ref, buf, sem).start()  # fix: msg_when_body

        o_ref[...] = buf[...]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            grid=(1,),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=pl.BlockSpec(BLOCK, lambda i: (0, 0)),
            scratch_shapes=[pltpu.VMEM(BLOCK, jnp.float32), pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    return fn


def test_a_copy_in_a_pl_when_body_names_its_own_line_and_its_condition() -> None:
    """A body jax runs (pl.when, fori_loop) is written once: no caller is added; a
    copy started in it names the condition it runs under."""
    with pytest.raises(SimulationError) as caught:
        verify(_copy_in_when_body(), jax.ShapeDtypeStruct(BLOCK, jnp.float32))
    message = str(caught.value)
    (line,) = marked_lines(HERE, "msg_when_body")
    (guard,) = marked_lines(HERE, "msg_when_guard")
    expected = (
        f"{HERE}:{line} (_copy_in_when_body.<locals>.kernel.<locals>._, "
        f"under the condition at {HERE.name}:{guard})"
    )
    assert expected in message, message
    assert "called at" not in message, message


def _star_args_kernel() -> Any:
    def kernel(*refs: Any) -> None:
        x_ref, o_ref, buf, sem = refs
        pltpu.make_async_copy(x_ref, buf, sem).start()
        o_ref[...] = buf[...]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            scratch_shapes=[pltpu.VMEM(BLOCK, jnp.float32), pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    return fn


def test_a_kernel_taking_star_args_names_buffers_by_role_position_and_type() -> None:
    with pytest.raises(RaceDetectedError) as caught:
        verify(_star_args_kernel(), jax.ShapeDtypeStruct(BLOCK, jnp.float32))
    message = str(caught.value)
    assert "buffer scratch 0 (parameter 2: vmem float32[8,128])" in message, message
