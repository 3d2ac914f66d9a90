"""Strict simulation: each R-row of docs/catalogue.md fails with its error; legitimate patterns run clean.

Misusing kernels are written with raw pltpu where safedma's own trace-time
checks would stop them before they reach the simulator. Every failing run is
followed by a clean one, to show the interpreter state was reset, and no test
may leave a thread inside the interpreter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tests.support import calls
from tests.support import kernels_pltpu
from tests.support import kernels_safedma as sdk
from tests.support.simulation import BLOCK, BLOCK_BYTES, F32, HBM, SHORT, Kernel
from tests.support.simulation import assert_clean_afterwards, dma, example, hbm_call, ring_kernel
from tests.support.simulation import over_signalled_barrier, run_ring
import safedma as sd
from safedma.testing import KernelFailedError, LeftoverSemaphoreError, RaceDetectedError
from safedma.testing import SimulationError, SimulationTimeoutError, UnsatisfiableWaitError
from safedma.testing import simulate, simulated_mesh

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


def test_specs_without_a_mesh_are_rejected() -> None:
    with pytest.raises(ValueError, match="need a mesh"):
        simulate(hbm_call(ring_kernel(), dma(2)), example(BLOCK), in_specs=P("x"))


# ---------------------------------------------------- clean: ring permutes


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_permute_on_1d_mesh(n: int) -> None:
    run_ring(simulated_mesh(n, "x"))


@pytest.mark.parametrize("axis", ["x", "y"])
def test_ring_permute_on_2x4_mesh_along_each_axis(axis: str) -> None:
    run_ring(simulated_mesh((2, 4), ("x", "y")), axis)


def test_safedma_ring_with_its_own_shard_map_and_default_specs(mesh4: Mesh) -> None:
    # A program that already has its shard_map runs as is (mesh=None) ...
    x = jax.device_put(example((32, 128)), jax.sharding.NamedSharding(mesh4, P("x")))
    ring = calls.ring_permute_call(sd.checked(sdk.ring_permute), mesh4)
    np.testing.assert_array_equal(np.asarray(simulate(ring, x)), np.roll(np.asarray(x), 8, 0))
    # ... and a per-device body gets the default specs: leading dim over all axes.
    body = hbm_call(sd.checked(sdk.ring_permute), dma(2))
    out = simulate(body, example((32, 128)), mesh=mesh4)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 8, 0))


def test_several_arguments_and_outputs_with_per_argument_specs(mesh4: Mesh) -> None:
    def kernel(x_ref: Any, y_ref: Any, o1: Any, o2: Any, s1: Any, s2: Any) -> None:
        a = pltpu.make_async_copy(x_ref, o2, s1)  # swap them
        b = pltpu.make_async_copy(y_ref, o1, s2)
        a.start()
        b.start()
        a.wait()
        b.wait()

    def body(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        outs = (jax.ShapeDtypeStruct(y.shape, y.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype))
        o1, o2 = pl.pallas_call(
            kernel, out_shape=outs, in_specs=[HBM, HBM], out_specs=(HBM, HBM), scratch_shapes=dma(2)
        )(x, y)
        return o1, o2

    x, y = example((32, 128)), example((8, 512)) + 1.0
    o1, o2 = simulate(
        body, x, y, mesh=mesh4, in_specs=[P("x"), P(None, "x")], out_specs=(P(None, "x"), P("x"))
    )
    np.testing.assert_array_equal(np.asarray(o1), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(o2), np.asarray(x))


# ------------------------------------- clean: the legitimate patterns of docs/catalogue.md


def test_aggregate_wait_of_several_starts_on_one_semaphore() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
        for i in range(4):  # the pages of a paged-attention block
            sd.LocalCopy(x_ref.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * (3 - i), 8)], sem).start()
        sd.LocalCopy(x_ref, buf, sem).started_elsewhere().wait()  # one wait, all bytes
        sd.LocalCopy(buf, o_ref, out_sem).start().wait()

    x = example((32, 128))
    out = simulate(hbm_call(sd.checked(kernel), [pltpu.VMEM((32, 128), F32), *dma(2)]), x)
    expected = np.asarray(x).reshape(4, 8, 128)[::-1].reshape(32, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_wait_all_into_with_sizes_that_do_not_add_up_is_unsatisfiable() -> None:
    # Three pages of four: the aggregate wait asks for more bytes than arrive.
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
        for i in range(3):
            sd.LocalCopy(x_ref.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)], sem).start()
        sd.wait_all_into(buf, sem)
        sd.LocalCopy(buf, o_ref, out_sem).start().wait()

    x = example((32, 128))
    with pytest.raises(UnsatisfiableWaitError):
        simulate(
            hbm_call(sd.checked(kernel), [pltpu.VMEM((32, 128), F32), *dma(2)]), x, timeout_s=SHORT
        )


@pytest.mark.parametrize(
    "body",
    [kernels_pltpu.double_buffered, sd.checked(sdk.double_buffered)],
    ids=["pltpu", "safedma"],
)
def test_double_buffering_waits_the_previous_iterations_copy(body: Kernel) -> None:
    x = example((40, 128))
    call = calls.double_buffered_call(body, jax.ShapeDtypeStruct(x.shape, x.dtype))
    np.testing.assert_array_equal(np.asarray(simulate(call, x)), np.asarray(x) * 3.0)


def test_receive_side_wait_for_another_devices_send(mesh4: Mesh) -> None:
    # Even devices send to the odd device after them; odd devices only wait.
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any, local: Any) -> None:
        me = sd.my_index("x")
        pair = (
            sd.RemoteCopy(x_ref, o_ref, recv)
            .with_send_sem(send)
            .to(sd.device(x=me + 1 - 2 * (me % 2)))
        )

        @pl.when(me % 2 == 0)
        def _() -> None:
            pair.start().wait_send()
            sd.LocalCopy(x_ref, o_ref, local).start().wait()

        @pl.when(me % 2 == 1)
        def _() -> None:
            pair.incoming().wait_recv()

    x = example((32, 128))
    out = simulate(hbm_call(sd.checked(kernel), dma(3)), x, mesh=mesh4)
    blocks = np.asarray(x).reshape(4, 8, 128)
    np.testing.assert_array_equal(np.asarray(out).reshape(4, 8, 128), blocks[[0, 0, 2, 2]])


def test_remote_copy_into_vmem_and_hbm(mesh4: Mesh) -> None:
    def kernel(
        x_ref: Any,
        o_ref: Any,
        buf: Any,
        out_buf: Any,
        s1: Any,
        r1: Any,
        s2: Any,
        r2: Any,
        local: Any,
    ) -> None:
        right = sd.neighbour("x")
        # Into the neighbour's VMEM, then on to HBM locally ...
        sd.RemoteCopy(x_ref, buf, r1).with_send_sem(s1).to(right).start().wait()
        out_buf[...] = buf[...] + 0.5
        # ... and from VMEM straight into the neighbour's HBM output.
        sd.RemoteCopy(out_buf, o_ref, r2).with_send_sem(s2).to(right).start().wait()

    scratch = [pltpu.VMEM(BLOCK, F32), pltpu.VMEM(BLOCK, F32), *dma(5)]
    x = example((32, 128))
    out = simulate(hbm_call(sd.checked(kernel), scratch), x, mesh=mesh4)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 16, 0) + 0.5)


@pytest.mark.parametrize(
    ("target", "shift"),
    [
        (
            lambda: sd.device({"x": (sd.my_index("x") + 1) % 2, "y": (sd.my_index("y") + 3) % 4}),
            (1, 3),
        ),
        (lambda: sd.device({"y": (sd.my_index("y") + 1) % 4}), (0, 1)),
    ],
    ids=["both_axes", "one_axis"],
)
def test_dict_device_ids_on_2x4_mesh(
    target: Callable[[], sd.Device], shift: tuple[int, int]
) -> None:
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send).to(target()).start().wait()

    mesh = simulated_mesh((2, 4), ("x", "y"))
    x = example((16, 512))
    out = simulate(
        hbm_call(sd.checked(kernel), dma(2)),
        x,
        mesh=mesh,
        in_specs=P("x", "y"),
        out_specs=P("x", "y"),
    )
    expected = np.roll(np.asarray(x), (8 * shift[0], 128 * shift[1]), axis=(0, 1))
    np.testing.assert_array_equal(np.asarray(out), expected)


# -------------------------------------------------------------- R1: races


def test_r1_destination_read_before_its_wait() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, early: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, buf, sem)
        copy.start()
        early[...] = buf[...]  # too early: the copy may still be writing buf
        copy.wait()
        out = pltpu.make_async_copy(early, o_ref, sem)
        out.start()
        out.wait()

    scratch = [pltpu.VMEM(BLOCK, F32), pltpu.VMEM(BLOCK, F32), *dma()]
    with pytest.raises(
        RaceDetectedError,
        match=r"data race \(R1\): a read of VMEM buffer buf "
        r"on device 0 by device 0 at .*test_simulate.py:\d+.*kernel\)",
    ) as info:
        simulate(hbm_call(kernel, scratch), example(BLOCK))
    assert info.value.races[0].access == "read"
    assert "read only after its wait" in str(info.value)
    assert_clean_afterwards()


def test_r1_source_overwritten_before_wait_send(mesh4: Mesh) -> None:
    def kernel(x_ref: Any, o_ref: Any, src: Any, sem: Any, send: Any, recv: Any) -> None:
        fill = pltpu.make_async_copy(x_ref, src, sem)
        fill.start()
        fill.wait()
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        copy = pltpu.make_async_remote_copy(src, o_ref, send, recv, device_id={"x": (me + 1) % n})
        copy.start()
        src[...] = jnp.zeros(BLOCK, F32)  # too early: the send may still read src
        copy.wait_send()
        copy.wait_recv()

    scratch = [pltpu.VMEM(BLOCK, F32), *dma(3)]
    with pytest.raises(
        RaceDetectedError,
        match=r"a write of VMEM buffer src on device \d "
        r"\(x=\d\) by device \d \(x=\d\)",
    ) as info:
        simulate(hbm_call(kernel, scratch), example((32, 128)), mesh=mesh4)
    assert info.value.races[0].access == "write"
    assert "wait_send" in str(info.value)
    assert_clean_afterwards()


def test_r1_copy_into_an_output_still_in_flight_when_the_body_returns() -> None:
    # The never-waited copy lands in an output: interpret mode's copy-out of
    # the outputs races with it (before the exit-count check can see it).
    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    with pytest.raises(
        RaceDetectedError,
        match=r"a read of HBM buffer o_ref on device 0 by "
        r"device 0 while copying the kernel's outputs back.*still in flight",
    ):
        simulate(hbm_call(kernel, dma()), example(BLOCK))
    assert_clean_afterwards()


def _early_read(x_ref: Any, o_ref: Any, buf: Any, early: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, buf, sem)
    copy.start()
    early[...] = buf[...]
    copy.wait()
    out = pltpu.make_async_copy(early, o_ref, sem)
    out.start()
    out.wait()


@pytest.mark.parametrize("built", ["inside_fn", "before_simulate"])
def test_strict_mode_wins_over_the_kernels_own_interpret_argument(built: str) -> None:
    # The kernel asks for lenient interpret mode (no race detection, lazy DMAs);
    # simulate's strict parameters still apply, also to a pallas_call built
    # before simulate (pl.pallas_call reads the forced mode when it is built).
    lenient = pltpu.InterpretParams()
    scratch = [pltpu.VMEM(BLOCK, F32), pltpu.VMEM(BLOCK, F32), *dma()]
    call: Callable[[jax.Array], jax.Array]
    if built == "inside_fn":
        call = hbm_call(_early_read, scratch, interpret=lenient)
    else:
        call = pl.pallas_call(
            _early_read,
            out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            interpret=lenient,
        )
    with pytest.raises(RaceDetectedError):
        simulate(call, example(BLOCK))
    assert_clean_afterwards()


# ------------------------------------------- R2: semaphores not zero at exit


def test_r2_local_copy_never_waited() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any, out_sem: Any) -> None:
        pltpu.make_async_copy(x_ref, buf, sem).start()  # never waited
        copy = pltpu.make_async_copy(x_ref, o_ref, out_sem)
        copy.start()
        copy.wait()

    scratch = [pltpu.VMEM(BLOCK, F32), *dma(2)]
    with pytest.raises(
        LeftoverSemaphoreError,
        match=r"1 semaphore count not back to zero.*\n"
        rf"  device 0: DMA semaphore sem holds {BLOCK_BYTES} bytes: a copy "
        r"started at .*test_simulate.py:\d+.* was never waited",
    ) as info:
        simulate(hbm_call(kernel, scratch), example(BLOCK))
    [leftover] = info.value.leftovers
    assert (leftover.kind, leftover.device_id, leftover.count) == ("DMA", 0, BLOCK_BYTES)
    assert_clean_afterwards()


def test_r2_reports_every_semaphore_on_every_device(mesh4: Mesh) -> None:
    # jax prints only the first leftover of each device; all eight are reported.
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any, flag: Any) -> None:
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})
        copy.start()
        copy.wait_recv()  # wait_send forgotten
        pl.semaphore_signal(flag, 1)  # a signal nobody waits for

    scratch = [*dma(2), pltpu.SemaphoreType.REGULAR(())]
    with pytest.raises(LeftoverSemaphoreError, match="8 semaphore counts") as info:
        simulate(hbm_call(kernel, scratch), example((32, 128)), mesh=mesh4)
    leftovers = info.value.leftovers
    assert sorted((x.device_id, x.kind) for x in leftovers) == sorted(
        (d, k) for d in range(4) for k in ("DMA", "REGULAR")
    )
    for item in leftovers:
        if item.kind == "DMA":
            assert item.count == BLOCK_BYTES
            assert "send side of a remote copy to device" in item.hint
            assert "wait_send" in item.hint
        else:
            assert item.count == 1
            assert "semaphore_signal never waited" in item.hint
    assert "device 3 (x=3): REGULAR semaphore" in str(info.value)
    assert_clean_afterwards()


def test_r2_over_signalled_barrier(mesh4: Mesh) -> None:
    with pytest.raises(LeftoverSemaphoreError, match="BARRIER semaphore") as info:
        simulate(
            hbm_call(over_signalled_barrier, dma(), collective_id=0), example((32, 128)), mesh=mesh4
        )
    assert {(x.kind, x.count) for x in info.value.leftovers} == {("BARRIER", 1)}
    assert len(info.value.leftovers) == 4
    assert_clean_afterwards()


# ---------------------------------------------- R3: waits never satisfied


def test_r3_receiver_waits_for_a_send_that_never_comes(mesh4: Mesh) -> None:
    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})

        @pl.when(me != 0)  # device 0 never sends, so device 1 waits forever
        def _() -> None:
            copy.start()
            copy.wait_send()

        copy.wait_recv()

    start = time.monotonic()
    with pytest.raises(
        UnsatisfiableWaitError,
        match=(
            r"unsatisfiable wait \(R3\).*timeout_s=2 s.*\n  device 1 \(x=1\) waits at "
            r".*test_simulate.py:\d+.* on DMA semaphore recv for 4096 bytes, the count is 0: "
            r"no copy signalling this semaphore.*never comes"
        ),
    ) as info:
        simulate(hbm_call(kernel, dma(2)), example((32, 128)), mesh=mesh4, timeout_s=SHORT)
    elapsed = time.monotonic() - start
    [stuck] = info.value.waits
    assert (stuck.device_id, stuck.kind, stuck.value, stuck.count) == (1, "DMA", 4096, 0)
    assert elapsed < SHORT + 4.0, elapsed
    assert_clean_afterwards()


def test_r3_over_waited_barrier(mesh4: Mesh) -> None:
    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        barrier = pltpu.get_barrier_semaphore()
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        pl.semaphore_signal(barrier, 1, device_id={"x": (me + 1) % n})
        pl.semaphore_wait(barrier, 2)  # waits for two signals, gets one
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    with pytest.raises(UnsatisfiableWaitError, match="over-waited barrier") as info:
        simulate(
            hbm_call(kernel, dma(), collective_id=0),
            example((32, 128)),
            mesh=mesh4,
            timeout_s=SHORT,
        )
    assert sorted((w.device_id, w.kind, w.value, w.count) for w in info.value.waits) == [
        (d, "BARRIER", 2, 1) for d in range(4)
    ]
    assert_clean_afterwards()


def test_r3_handle_waited_twice() -> None:
    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()
        copy.wait()  # nothing left to wait for

    with pytest.raises(
        UnsatisfiableWaitError,
        match=r"device 0 waits .* on DMA semaphore sem "
        r"for 4096 bytes, the count is 0: more is waited than was copied "
        r"\(1 copy signalled it here\): a handle waited twice",
    ):
        simulate(hbm_call(kernel, dma()), example(BLOCK), timeout_s=SHORT)
    assert_clean_afterwards()


def test_r3_regular_semaphore_never_signalled() -> None:
    def kernel(x_ref: Any, o_ref: Any, flag: Any) -> None:
        pl.semaphore_wait(flag, 1)

    with pytest.raises(
        UnsatisfiableWaitError,
        match="REGULAR semaphore .* for 1, the count is "
        "0: the semaphore_signal this wait needs never comes",
    ):
        simulate(
            hbm_call(kernel, [pltpu.SemaphoreType.REGULAR(())]), example(BLOCK), timeout_s=SHORT
        )
    assert_clean_afterwards()


def test_slow_kernel_without_a_waiter_is_stopped_too() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        def body(i: Any, carry: Any) -> Any:
            buf[...] = buf[...] + 1.0  # each step goes through the interpreter
            return carry

        jax.lax.fori_loop(0, 10**9, body, 0)

    with pytest.raises(SimulationTimeoutError, match="no device was waiting") as info:
        simulate(
            hbm_call(kernel, [pltpu.VMEM(BLOCK, F32), *dma()]),
            example(BLOCK),
            timeout_s=1.0,
            uninitialized_memory="zero",
        )
    assert info.value.stopped
    assert_clean_afterwards()


def test_hard_upper_bound_when_the_watchdog_cannot_stop_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Disable the watchdog's means of stopping a run: simulate must still return.
    from safedma.testing import _interpret_probes, _runner

    held: list[tuple[_interpret_probes.InterpretRun, Exception]] = []
    real_fail = _interpret_probes.InterpretRun.fail
    monkeypatch.setattr(
        _interpret_probes.InterpretRun, "fail", lambda run, error: held.append((run, error))
    )
    monkeypatch.setattr(_interpret_probes.InterpretRun, "abort_barriers", lambda run: None)
    monkeypatch.setattr(_runner, "_GRACE_S", 0.5)

    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()
        copy.wait()

    start = time.monotonic()
    try:
        with pytest.raises(SimulationTimeoutError, match="could not stop the run") as info:
            simulate(hbm_call(kernel, dma()), example(BLOCK), timeout_s=1.0)
        elapsed = time.monotonic() - start
    finally:
        # Clean up what the disabled watchdog left spinning, whatever happened.
        for run, error in held:
            real_fail(run, error)
        for worker in [t for t in threading.enumerate() if t.name == "safedma-simulate"]:
            worker.join(5.0)
        pltpu.reset_tpu_interpret_mode_state()
    # timeout_s, two grace periods, and compilation (a few seconds on a loaded machine).
    assert elapsed < 1.0 + 2 * 0.5 + 5.0
    assert not info.value.stopped
    assert isinstance(info.value.__cause__, UnsatisfiableWaitError)
    assert_clean_afterwards()


# ------------------------------------------ R4: a copy left in flight in a loop


def _prefetch_loop(wait_last: bool) -> Kernel:
    def kernel(x_ref: Any, o_ref: Any, bufs: Any, sems: Any, out_sem: Any) -> None:
        steps = x_ref.shape[0] // 8

        def fetch(i: Any) -> Any:
            return pltpu.make_async_copy(x_ref.at[pl.ds(i * 8, 8)], bufs.at[i % 2], sems.at[i % 2])

        def body(i: Any, carry: Any) -> Any:
            fetch(i).start()

            @pl.when(i > 0)
            def _() -> None:  # wait the previous iteration's copy, write it out
                fetch(i - 1).wait()
                out = pltpu.make_async_copy(
                    bufs.at[(i - 1) % 2], o_ref.at[pl.ds((i - 1) * 8, 8)], out_sem
                )
                out.start()
                out.wait()

            return carry

        jax.lax.fori_loop(0, steps, body, 0)
        if wait_last:  # the fix: wait the last iteration's copy after the loop
            fetch(steps - 1).wait()
            out = pltpu.make_async_copy(
                bufs.at[(steps - 1) % 2], o_ref.at[pl.ds((steps - 1) * 8, 8)], out_sem
            )
            out.start()
            out.wait()

    return kernel


def test_r4_copy_left_in_flight_by_the_last_loop_iteration() -> None:
    scratch = [pltpu.VMEM((2, *BLOCK), F32), pltpu.SemaphoreType.DMA((2,)), *dma()]
    x = example((40, 128))
    with pytest.raises(
        LeftoverSemaphoreError,
        match=r"DMA semaphore sems\[0\] holds 4096 bytes: a "
        r"copy started at .* \(started 3 times\) was never waited.*left in "
        r"flight: wait for it after the loop \(R4\)",
    ) as info:
        simulate(hbm_call(_prefetch_loop(wait_last=False), scratch), x)
    assert len(info.value.leftovers) == 1
    out = simulate(hbm_call(_prefetch_loop(wait_last=True), scratch), x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# ------------------------------------------------------------ other failures


def test_other_interpreter_errors_are_kernel_failures() -> None:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, buf, sem)
        copy.start()
        copy.wait()
        start = buf[0, 0].astype(jnp.int32) + 64  # dynamic, so only the run can tell
        buf[pl.ds(0, 8), :] = buf[pl.ds(start, 8), :]  # out of bounds

    with pytest.raises(KernelFailedError, match="failed in interpret mode") as info:
        simulate(hbm_call(kernel, [pltpu.VMEM(BLOCK, F32), *dma()]), example(BLOCK))
    assert isinstance(info.value, SimulationError)
    assert_clean_afterwards()


def test_safedma_trace_errors_propagate_unchanged() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x_ref, o_ref, sem).start()  # never waited: caught at trace time

    with pytest.raises(sd.CopyNeverWaitedError):
        simulate(hbm_call(sd.checked(kernel), dma()), example(BLOCK))
    assert_clean_afterwards()
