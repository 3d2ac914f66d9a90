"""The runner: cancellation, stuck versus slow, failures reported at once and as themselves,
concurrent interpret-mode use, and runs this jax cannot simulate.

Every test is bounded: the kernels that would run forever are stopped by an
interrupt, the watchdog or the failure under test, and each test asserts how
long that took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh

from safedma.testing import ConcurrentInterpretError, KernelFailedError, SimulationTimeoutError
from safedma.testing import SimulationUnsupportedError, UnsatisfiableWaitError, simulate
from safedma.testing import simulated_mesh
from safedma.testing import _interpret_probes
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, dma, example, hbm_call
from tests.support.simulation import ring_kernel, slow_scratch, slow_sender, spin

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

# jaxlib 0.10.2 hangs copying large callback arguments with many devices (why: the probe).
COPIES_CAN_HANG = _interpret_probes.large_callback_copies_can_hang()


# ------------------------------------------------------------ 1: cancellation


@pytest.fixture
def alarm() -> Iterator[Callable[[float], None]]:
    """Arms SIGALRM to raise KeyboardInterrupt in this thread, as Ctrl-C or pytest-timeout do.

    It fires again every second until an interrupt is on its way out: CPython
    drops an exception raised while a weak-reference callback or a finaliser
    runs (jax has many), so one signal can be lost, as a user's single Ctrl-C
    can be; a user presses again. It stays quiet while one is being handled,
    so the cleanup under test is not cut by a second.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)

    def arm(after_s: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, after_s, 1.0)

    try:
        yield arm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.mark.parametrize("after_s", [0.2, 2.5], ids=["while_compiling", "while_running"])
def test_interrupt_during_4_device_simulate_leaves_the_process_usable(
    alarm: Callable[[float], None],
    mesh4: Mesh,
    after_s: float,
) -> None:
    # Before: 10 of 11 such interrupts broke every later simulate (timeouts,
    # blocked device threads, exit 134).  After: the run is failed on every
    # device, its threads end, the state is reset and the interrupt goes on.
    call = hbm_call(slow_sender(10**9), slow_scratch())
    alarm(after_s)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        simulate(call, example((32, 128)), mesh=mesh4, timeout_s=120, uninitialized_memory="zero")
    disarm()
    assert time.monotonic() - start < after_s + 20.0  # bounded, with room for a loaded machine
    assert _interpret_probes.current_interpret_run() is None  # interpreter state reset
    assert_clean_afterwards()  # and the next simulate works


def test_interrupted_process_exits_normally(tmp_path: Any) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent("""
        import os, signal
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        from jax.experimental.pallas import tpu as pltpu
        from safedma.testing import simulate, simulated_mesh
        from tests.support.simulation import (
            dma, example, hbm_call, ring_kernel, slow_scratch, slow_sender)

        def interrupt(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, interrupt)
        mesh = simulated_mesh(4, "x")
        signal.setitimer(signal.ITIMER_REAL, 2.5)
        try:
            simulate(hbm_call(slow_sender(10**9), slow_scratch()), example((32, 128)),
                     mesh=mesh, timeout_s=120, uninitialized_memory="zero")
        except KeyboardInterrupt:
            print("interrupted")
        simulate(hbm_call(ring_kernel(), dma(2)), example((32, 128)), mesh=mesh)
        print("next run clean")
    """)
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=os.getcwd(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "interrupted\nnext run clean\n" in result.stdout


# ------------------------------------------------------- 2: stuck versus slow


def test_slow_sender_outliving_timeout_is_a_timeout_saying_it_was_still_running(
    mesh4: Mesh,
) -> None:
    # Before: UnsatisfiableWaitError "can never be satisfied ... the send never
    # comes", for a kernel that was only slow.
    start = time.monotonic()
    with pytest.raises(SimulationTimeoutError, match="still running") as info:
        simulate(
            hbm_call(slow_sender(10**9), slow_scratch()),
            example((32, 128)),
            mesh=mesh4,
            timeout_s=2.0,
            uninitialized_memory="zero",
        )
    assert not isinstance(info.value, UnsatisfiableWaitError)
    assert time.monotonic() - start < 2.0 + 25.0  # compilation included
    text = str(info.value)
    assert "device 0 (x=0) was running" in text
    assert "device 1 (x=1) was waiting at" in text and "simulation.py" in text
    assert "can never be satisfied" not in text
    assert info.value.stopped
    assert_clean_afterwards()


def test_slow_sender_within_timeout_passes(mesh4: Mesh) -> None:
    x = example((32, 128))
    out = simulate(
        hbm_call(slow_sender(300), slow_scratch()),
        x,
        mesh=mesh4,
        timeout_s=60.0,
        uninitialized_memory="zero",
    )
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 8, 0))


def test_unsatisfiable_wait_is_reported_as_soon_as_every_device_is_blocked(
    mesh4: Mesh,
) -> None:
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})

        @pl.when(me != 0)
        def _() -> None:
            copy.start()
            copy.wait_send()

        copy.wait_recv()

    start = time.monotonic()
    with pytest.raises(UnsatisfiableWaitError, match="found after") as info:
        simulate(hbm_call(kernel, dma(2)), example((32, 128)), mesh=mesh4, timeout_s=60.0)
    assert time.monotonic() - start < 15.0  # not the 60 s timeout
    assert info.value.found_after_s is not None and info.value.found_after_s < 5.0
    assert [w.device_id for w in info.value.waits] == [1]


# ----------------------------------------- 3, 4: failures at once, as themselves


def _raise_on_device_2(i: Any) -> None:
    if int(i) == 2:
        raise ValueError("device two refuses on purpose")


def test_exception_in_a_callback_on_one_device_is_reported_at_once_as_itself(
    mesh4: Mesh,
) -> None:
    # Before: reported after the whole timeout as an unsatisfiable wait blaming
    # device 3, the ValueError only in __cause__.
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        jax.debug.callback(_raise_on_device_2, jax.lax.axis_index("x"))
        ring_kernel()(x_ref, o_ref, send, recv)

    start = time.monotonic()
    with pytest.raises(KernelFailedError) as info:
        simulate(hbm_call(kernel, dma(2)), example((32, 128)), mesh=mesh4, timeout_s=60.0)
    assert time.monotonic() - start < 20.0  # not the 60 s timeout
    text = str(info.value)
    assert "ValueError: device two refuses on purpose" in text
    assert "on device 2 (x=2)" in text
    assert "test_runner.py" in text and "_raise_on_device_2" in text
    assert " waits " not in text and "unsatisfiable" not in text
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.device == "device 2 (x=2)"
    assert_clean_afterwards()


def _out_of_bounds_on_device_1() -> Callable[..., None]:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, send: Any, recv: Any, local: Any) -> None:
        me = jax.lax.axis_index("x")
        # Device 1 reads 8 rows starting at row 64 of its 8-row block.
        start = jnp.where(me == 1, 64, 0)
        fill = pltpu.make_async_copy(x_ref.at[pl.ds(start, 8)], buf, local)
        fill.start()
        fill.wait()
        ring_kernel()(x_ref, o_ref, send, recv)

    return kernel


@pytest.mark.slow
def test_out_of_bounds_dma_on_one_device_names_the_index_error_every_time(
    mesh4: Mesh,
) -> None:
    # Before: on jax 0.12 about 1 run in 4 said "BrokenBarrierError:" with the
    # IndexError neither in the message nor in __cause__.
    call = hbm_call(_out_of_bounds_on_device_1(), [pltpu.VMEM(BLOCK, F32), *dma(3)])
    x = example((32, 128))
    messages = []
    for _ in range(20):
        with pytest.raises(KernelFailedError) as info:
            simulate(call, x, mesh=mesh4, timeout_s=60.0)
        messages.append(str(info.value))
        assert isinstance(info.value.__cause__, IndexError), info.value.__cause__
    for text in messages:
        assert "IndexError" in text and "BrokenBarrierError" not in text, text
        assert "on device 1 (x=1)" in text, text
        assert "test_runner.py" in text, text
    assert_clean_afterwards()


def test_out_of_bounds_dma_names_the_index_error_and_the_users_line(mesh4: Mesh) -> None:
    call = hbm_call(_out_of_bounds_on_device_1(), [pltpu.VMEM(BLOCK, F32), *dma(3)])
    with pytest.raises(
        KernelFailedError,
        match=r"on device 1 \(x=1\) at .*test_runner\.py:\d+ "
        r"\(.*kernel[^)]*\): IndexError",
    ):
        simulate(call, example((32, 128)), mesh=mesh4, timeout_s=60.0)
    assert_clean_afterwards()


# -------------------------------------------- 7: runs this jax cannot simulate


@pytest.mark.skipif(not COPIES_CAN_HANG, reason="jaxlib 0.11.2 and newer copy without hanging")
def test_many_devices_with_large_buffers_are_refused_up_front_on_jax_0_10() -> None:
    # Before: never finished, then told the user to raise timeout_s.
    mesh = simulated_mesh(8, "x")
    x = jnp.ones((8 * 256, 128), F32)  # 128 KiB per device
    start = time.monotonic()
    with pytest.raises(
        SimulationUnsupportedError, match=r"128 KiB per device.*jax 0\.11\.2 or newer"
    ):
        simulate(hbm_call(ring_kernel(), dma(2)), x, mesh=mesh, timeout_s=60.0)
    assert time.monotonic() - start < 10.0


@pytest.mark.skipif(COPIES_CAN_HANG, reason="refused up front on jaxlib 0.10.2")
def test_many_devices_with_large_buffers_run_on_jax_0_11_and_later() -> None:
    mesh = simulated_mesh(8, "x")
    x = example((8 * 256, 128))
    out = simulate(hbm_call(ring_kernel(), dma(2)), x, mesh=mesh, timeout_s=60.0)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 256, 0))


def test_many_devices_with_small_buffers_still_run() -> None:
    mesh = simulated_mesh(8, "x")
    x = example((8 * 64, 128))  # 32 KiB per device
    out = simulate(hbm_call(ring_kernel(), dma(2)), x, mesh=mesh, timeout_s=60.0)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 64, 0))


# ------------------------------------------------ 8: concurrent interpret mode


def _plain_call() -> Callable[[jax.Array], jax.Array]:
    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    return hbm_call(kernel, dma(), interpret=pltpu.InterpretParams())


def test_plain_interpret_kernel_in_another_thread_is_refused_and_the_simulation_unharmed(
    mesh4: Mesh,
) -> None:
    # Before: the simulated run failed with "KernelFailedError: AssertionError:".
    plain = jax.jit(_plain_call())
    y = example(BLOCK)
    np.testing.assert_array_equal(np.asarray(plain(y)), np.asarray(y))  # compiled, works
    errors: list[BaseException] = []
    results: list[object] = []

    def other_thread() -> None:
        deadline = time.monotonic() + 60.0
        while _interpret_probes.current_interpret_run() is None:  # the simulation runs
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        try:
            results.append(jax.block_until_ready(plain(y)))
        except Exception as err:
            errors.append(err)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        x = example((32, 128))
        out = simulate(
            hbm_call(slow_sender(400), slow_scratch()),
            x,
            mesh=mesh4,
            timeout_s=60.0,
            uninitialized_memory="zero",
        )
    finally:
        thread.join(60.0)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 8, 0))
    assert not results, "the plain kernel should have overlapped the simulation"
    [error] = errors
    assert "while safedma.testing.simulate was running" in str(error)
    assert "refused" in str(error)
    # Afterwards the plain kernel runs again.
    np.testing.assert_array_equal(np.asarray(plain(y)), np.asarray(y))


def test_simulate_refuses_to_start_while_another_thread_runs_an_interpret_kernel() -> None:
    # Starting would reset interpret mode under the other kernel's feet.
    def long_kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        spin(buf, 400)
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    lenient = pltpu.InterpretParams(uninitialized_memory="zero")
    other = jax.jit(hbm_call(long_kernel, [pltpu.VMEM(BLOCK, F32), *dma()], interpret=lenient))
    y = example(BLOCK)
    np.testing.assert_array_equal(np.asarray(other(y)), np.asarray(y))  # compiled, works
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(jax.block_until_ready(other(y))))
    thread.start()
    try:
        deadline = time.monotonic() + 30.0
        while _interpret_probes.current_interpret_run() is None:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        with pytest.raises(ConcurrentInterpretError, match="another thread is running"):
            simulate(_plain_call(), example(BLOCK))
    finally:
        thread.join(60.0)
    [out] = results
    np.testing.assert_array_equal(np.asarray(out), np.asarray(y))  # the other kernel unharmed
