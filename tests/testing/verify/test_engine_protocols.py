"""verify's engine on small raw-pltpu kernels: clean protocols pass, each bug class is caught.

The kernels here are written for the engine's unit tests; the kernel corpus
(every R-row, agreement with simulate) lives in the other test files of this
folder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.kernels import (
    all_gather,
    all_gather_bidirectional,
    all_reduce,
    gather_pages,
    pipeline,
    ppermute,
    reduce_scatter,
)
from safedma.testing import (
    DeadlockError,
    LeftoverSemaphoreError,
    RaceDetectedError,
    SemaphoreIndexError,
    SignalAfterExitError,
    SimulationError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    VerifyReport,
    abstract_mesh,
    verify,
)
from tests.support import calls, kernels_pltpu as kp

HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)
HERE = __file__.rsplit("/", 1)[-1]


def _local(
    kernel: Callable[..., None], scratch: list[Any], x: Any = X, **kw: Any
) -> Callable[[jax.Array], jax.Array]:
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=scratch,
        **kw,
    )


def _ring(
    kernel: Callable[..., None], scratch: list[Any], **kw: Any
) -> Callable[[jax.Array], jax.Array]:
    def per_device(block: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            **kw,
        )(block)
        return out

    return per_device


# ------------------------------------------------------------------ clean kernels


@pytest.mark.parametrize(
    "make", [calls.scale_copy_call, calls.reverse_halves_call, calls.double_buffered_call]
)
def test_local_twins_verify_clean(make: Callable[..., Any]) -> None:
    name = make.__name__.removesuffix("_call")
    report = verify(make(getattr(kp, name), X), X)
    assert isinstance(report, VerifyReport)
    assert report.devices == 1 and report.dmas >= 2 and report.waits == report.dmas
    assert "verified" in str(report)


def test_ring_permute_clean_on_four_devices() -> None:
    report = verify(
        _ring(kp.ring_permute, [pltpu.SemaphoreType.DMA(())] * 2),
        X,
        mesh=abstract_mesh((4,), ("x",)),
    )
    assert (report.devices, report.dmas, report.remote_dmas, report.waits) == (4, 4, 4, 8)


#: name -> (the per-device function, rows of one device's block as a function of n)
COLLECTIVES: dict[str, tuple[Callable[..., Any], Callable[[int], int]]] = {
    "ppermute": (functools.partial(ppermute, axis="x"), lambda n: 8),
    "ppermute_barrier": (functools.partial(ppermute, axis="x", collective_id=0), lambda n: 8),
    "all_gather": (functools.partial(all_gather, axis="x"), lambda n: 8),
    "all_gather_barrier": (functools.partial(all_gather, axis="x", collective_id=0), lambda n: 8),
    "all_gather_bidirectional": (
        functools.partial(all_gather_bidirectional, axis="x"),
        lambda n: 16,
    ),
    "reduce_scatter": (functools.partial(reduce_scatter, axis="x"), lambda n: 8 * n),
    "all_reduce": (functools.partial(all_reduce, axis="x"), lambda n: 8 * n),
    "all_reduce_unfused": (functools.partial(all_reduce, axis="x", fused=False), lambda n: 8 * n),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("invocations", [1, 2])
def test_safedma_collectives_clean(name: str, n: int, invocations: int) -> None:
    fn, rows = COLLECTIVES[name]
    x = jax.ShapeDtypeStruct((rows(n) * n, 128), jnp.float32)
    report = verify(fn, x, mesh=abstract_mesh((n,), ("x",)), invocations=invocations)
    assert report.devices == n and report.invocations == invocations
    assert report.remote_dmas > 0


def test_all_gather_on_2x4_mesh_along_second_axis() -> None:
    report = verify(
        functools.partial(all_gather, axis="y"),
        jax.ShapeDtypeStruct((64, 128), jnp.float32),
        mesh=abstract_mesh((2, 4), ("x", "y")),
    )
    assert report.devices == 8 and report.remote_dmas == 8 * 3


def test_pipeline_and_gather_pages_clean() -> None:
    verify(
        functools.partial(pipeline, fn=lambda c: c * 2.0, chunk_rows=8),
        jax.ShapeDtypeStruct((64, 128), jnp.float32),
    )
    pages = jax.ShapeDtypeStruct((6, 8, 128), jnp.float32)
    report = verify(gather_pages, pages, np.array([4, 0, 5], np.int32))
    assert report.dmas == 4


# ------------------------------------------------------------------ bug classes


def test_r1_destination_read_before_wait() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_hbm, buf, sem)
        c.start()
        o_hbm[...] = buf[...]  # not a VMEM read in real code, but a read all the same
        c.wait()

    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_local(kernel, [pltpu.VMEM(X.shape, X.dtype), pltpu.SemaphoreType.DMA(())]), X)


def test_r2_copy_never_waited_is_leftover() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_hbm, o_hbm, sem).start()

    with pytest.raises(LeftoverSemaphoreError, match="never waited") as err:
        verify(_local(kernel, [pltpu.VMEM(X.shape, X.dtype), pltpu.SemaphoreType.DMA(())]), X)
    assert "sem" in str(err.value) and HERE in str(err.value)


def test_r3_receive_that_never_comes_is_a_deadlock() -> None:
    def kernel(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
        me = jax.lax.axis_index("x")
        c = pltpu.make_async_remote_copy(
            x_ref, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % 4}
        )

        @pl.when(me != 0)  # device 0 never sends, device 1 waits forever
        def _() -> None:
            c.start()
            c.wait_send()

        c.wait_recv()

    with pytest.raises(DeadlockError, match=r"device 1 \(x=1\)") as err:
        verify(
            _ring(kernel, [pltpu.SemaphoreType.DMA(())] * 2), X, mesh=abstract_mesh((4,), ("x",))
        )
    assert "recv_sem" in str(err.value) and HERE in str(err.value)


def test_r5_semaphore_index_outside_its_array() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, sems: Any) -> None:
        i = pl.program_id(0) + 2  # dynamic, so jax cannot reject it while tracing
        c = pltpu.make_async_copy(x_hbm, o_hbm, sems.at[i])
        c.start()
        c.wait()

    call = pl.pallas_call(
        kernel,
        out_shape=X,
        grid=(1,),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,))],
    )
    with pytest.raises(SemaphoreIndexError, match="R5"):
        verify(call, X)


def test_r6_sending_a_buffer_nothing_wrote() -> None:
    def kernel(x_ref: Any, o_ref: Any, staging: Any, send_sem: Any, recv_sem: Any) -> None:
        me = jax.lax.axis_index("x")
        c = pltpu.make_async_remote_copy(
            staging, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % 4}
        )
        c.start()
        c.wait()

    scratch = [
        pltpu.VMEM((8, 128), X.dtype),
        pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.DMA(()),
    ]
    with pytest.raises(UnwrittenReadError, match="staging"):
        verify(_ring(kernel, scratch), X, mesh=abstract_mesh((4,), ("x",)))


def test_r7_wait_on_the_wrong_slot_with_balanced_counts() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sems: Any) -> None:
        c0 = pltpu.make_async_copy(x_hbm, bufs.at[0], sems.at[0])
        c1 = pltpu.make_async_copy(x_hbm, bufs.at[1], sems.at[1])
        c0.start()
        c1.start()
        c1.wait()
        o_hbm[...] = bufs[0]  # slot 0's own copy is not known to have landed
        c0.wait()

    scratch = [pltpu.VMEM((2, *X.shape), X.dtype), pltpu.SemaphoreType.DMA((2,))]
    with pytest.raises(RaceDetectedError, match=r"bufs\[0:1"):
        verify(_local(kernel, scratch), X)


def test_r9_shared_semaphore_early_wait() -> None:
    half = (16, 128)

    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any) -> None:
        c0 = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16)], bufs.at[0], sem)
        c1 = pltpu.make_async_copy(x_hbm.at[pl.ds(16, 16)], bufs.at[1], sem)
        c0.start()
        c1.start()
        c0.wait()  # 8 KiB of either copy satisfy it
        o_hbm[pl.ds(0, 16)] = bufs[0]
        c1.wait()
        o_hbm[pl.ds(16, 16)] = bufs[1]

    scratch = [pltpu.VMEM((2, *half), X.dtype), pltpu.SemaphoreType.DMA(())]
    with pytest.raises(RaceDetectedError, match="R7/R9"):
        verify(_local(kernel, scratch), X)


def _early_copy_kernel(read_early: bool) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any, send: Any, go: Any) -> None:
        me = jax.lax.axis_index("x")

        @pl.when(me == 0)
        def _() -> None:
            pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], bufs.at[0], sem).start()
            pl.semaphore_signal(go, 1, device_id={"x": 1})
            pltpu.make_async_copy(bufs.at[0], bufs.at[0], sem).wait()  # "the local one"
            if read_early:
                o_hbm[pl.ds(0, 8)] = bufs[0]  # engine: early
            pltpu.make_async_copy(bufs.at[1], bufs.at[1], sem).wait()  # "the incoming one"
            if not read_early:
                o_hbm[pl.ds(0, 8)] = bufs[0]
            o_hbm[pl.ds(8, 8)] = bufs[1]

        @pl.when(me == 1)
        def _() -> None:
            pl.semaphore_wait(go, 1)
            c = pltpu.make_async_remote_copy(
                x_hbm.at[pl.ds(8, 8)], bufs.at[1], send, sem, device_id={"x": 0}
            )
            c.start()
            c.wait_send()
            pltpu.make_async_copy(x_hbm, o_hbm, send).start()
            pltpu.make_async_copy(x_hbm, o_hbm, send).wait()

    return kernel


_EARLY_SCRATCH = [
    pltpu.VMEM((2, 8, 128), jnp.float32),
    pltpu.SemaphoreType.DMA(()),
    pltpu.SemaphoreType.DMA(()),
    pltpu.SemaphoreType.REGULAR(()),
]


def test_a_copy_issued_after_a_wait_but_not_ordered_after_it_counts_there() -> None:
    """Device 1 sends only once device 0 signalled, so the walk runs device 0's first wait
    (4 KiB on ``sem``) before the incoming copy exists, and that wait looks like it
    guarantees the local copy. The incoming copy is not ordered after the wait (device 1
    knows the signal, not the wait), so on a TPU its bytes may release it: the replay
    counts it there and the read of ``bufs[0]`` is a race. Read after the second wait,
    it is clean."""
    x = jax.ShapeDtypeStruct((32, 128), jnp.float32)
    mesh = abstract_mesh((2,), ("x",))
    verify(_ring(_early_copy_kernel(False), _EARLY_SCRATCH), x, mesh=mesh)
    with pytest.raises(RaceDetectedError) as caught:
        verify(_ring(_early_copy_kernel(True), _EARLY_SCRATCH), x, mesh=mesh)
    text = str(caught.value)
    assert "bufs[0:1" in text and "device 0 (x=0)" in text, text
    assert "the copy from device 1 (x=1)" in text and "not ordered after that wait" in text, text
    assert f"{HERE}:" in text, text


def test_shared_semaphore_aggregate_wait_is_clean() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, bufs: Any, sem: Any) -> None:
        c0 = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16)], bufs.at[0], sem)
        c1 = pltpu.make_async_copy(x_hbm.at[pl.ds(16, 16)], bufs.at[1], sem)
        c0.start()
        c1.start()
        pltpu.make_async_copy(bufs, bufs, sem).wait()  # one wait for both
        o_hbm[pl.ds(0, 16)] = bufs[0]
        o_hbm[pl.ds(16, 16)] = bufs[1]

    verify(_local(kernel, [pltpu.VMEM((2, 16, 128), X.dtype), pltpu.SemaphoreType.DMA(())]), X)


def test_r8_signal_to_a_device_that_never_waits_it() -> None:
    def kernel(x_ref: Any, o_ref: Any, sem: Any, dma: Any) -> None:
        me = jax.lax.axis_index("x")
        c = pltpu.make_async_copy(x_ref, o_ref, dma)
        c.start()
        c.wait()

        @pl.when(me == 0)
        def _() -> None:
            pl.semaphore_signal(sem, 1, device_id={"x": 1})

    with pytest.raises((SignalAfterExitError, LeftoverSemaphoreError)) as err:
        verify(
            _ring(kernel, [pltpu.SemaphoreType.REGULAR(()), pltpu.SemaphoreType.DMA(())]),
            X,
            mesh=abstract_mesh((4,), ("x",)),
        )
    assert "device 1 (x=1)" in str(err.value)


def _single_barrier_permute(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    n = jax.lax.axis_size("x")
    me = jax.lax.axis_index("x")
    right, left = (me + 1) % n, (me + n - 1) % n
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={"x": left})
    pl.semaphore_signal(barrier, 1, device_id={"x": right})
    pl.semaphore_wait(barrier, 2)
    c = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id={"x": right})
    c.start()  # engine: r10
    c.wait()


def _blocks(n: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((8 * n, 128), jnp.float32)


def _single_barrier_ring() -> Callable[[jax.Array], jax.Array]:
    return _ring(
        _single_barrier_permute,
        [pltpu.SemaphoreType.DMA(())] * 2,
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )


@pytest.mark.parametrize("n", [2, 4, 5, 8])
def test_r10_single_barrier_one_call_is_clean(n: int) -> None:
    verify(_single_barrier_ring(), _blocks(n), mesh=abstract_mesh((n,), ("x",)))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_r10_single_barrier_reused_across_calls_is_safe_up_to_four_devices(n: int) -> None:
    """Settled: a one-directional ring permute behind ONE barrier round (signal both
    neighbours, wait 2) is safe when called twice back to back with the same
    collective_id, on rings of up to four devices.

    The hazard of jax PR #27963: device i's barrier wait of call k released by its left
    neighbour's signals of calls k and k+1, before its right neighbour entered call k,
    so i's copy lands in a device outside the call. For the left neighbour L = i-1 to
    signal in call k+1 it must finish call k: receive from i-2, so i-2 passed its
    barrier of call k, which counts signals of i-3 and i-1; i-1's call-k+1 signal is
    impossible (it needs i-2's copy first), so i-3 entered call k. With n = 4, i-3 is
    i+1, the right neighbour: in every execution i's wait implies i+1 entered call k,
    and the chain of waits (i+1's signal, i-2's barrier wait, the copy to i-1, i-1's
    receive wait, its next-call signal) makes it known to i. n = 2, 3 likewise.
    """
    verify(_single_barrier_ring(), _blocks(n), mesh=abstract_mesh((n,), ("x",)), invocations=2)


@pytest.mark.parametrize("n", [5, 8])
def test_r10_single_barrier_reused_across_calls_races_from_five_devices(n: int) -> None:
    """From n = 5, i-3 is not i+1: with i+1 slow to start, i-3 entering lets i-2 pass
    its barrier (signals of i-3 and i-1), copy to i-1, which finishes call k and
    signals i twice; i passes its barrier and copies into i+1 before it entered the
    call (R10). The second barrier round of jax PR #27963 closes it."""
    with pytest.raises(SignalAfterExitError) as caught:
        verify(_single_barrier_ring(), _blocks(n), mesh=abstract_mesh((n,), ("x",)), invocations=2)
    text = str(caught.value)
    assert "R10" in text and "before it has entered" in text, text
    assert "land first" in text and "PR #27963" in text, text
    assert f"{HERE}:" in text, text


# ------------------------------------------------------------------ legitimate patterns


def test_handle_waited_in_each_branch_of_a_cond() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        c.start()
        odd = pl.program_id(0) % 2 == 1

        @pl.when(odd)
        def _() -> None:
            c.wait()

        @pl.when(jnp.logical_not(odd))
        def _() -> None:
            c.wait()

    call = pl.pallas_call(
        kernel,
        out_shape=X,
        grid=(3,),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )
    assert verify(call, X).waits == 3


def test_trip_count_read_from_smem() -> None:
    def kernel(n_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        def body(i: Any, carry: None) -> None:
            c = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 8, 8)], o_hbm.at[pl.ds(i * 8, 8)], sem)
            c.start()
            c.wait()
            return carry

        jax.lax.fori_loop(0, n_ref[0], body, None)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(1,),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )
    call = pl.pallas_call(kernel, out_shape=X, grid_spec=grid_spec)
    assert verify(call, np.array([4], np.int32), X).dmas == 4
    with pytest.raises(UnwrittenReadError, match="o_hbm"):
        verify(call, np.array([3], np.int32), X)  # the last rows are never written
    with pytest.raises(VerificationUnsupportedError, match="concrete array"):
        verify(call, jax.ShapeDtypeStruct((1,), jnp.int32), X)


# ------------------------------------------------------------------ beyond the interpreter


def test_reshape_and_bitcast_views_in_copies() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_hbm.reshape(4, 8, 128), buf.reshape(4, 8, 128), sem)
        c.start()
        c.wait()
        c = pltpu.make_async_copy(buf.bitcast(jnp.int32), o_hbm.bitcast(jnp.int32), sem)
        c.start()
        c.wait()

    scratch = [pltpu.VMEM(X.shape, X.dtype), pltpu.SemaphoreType.DMA(())]
    assert verify(_local(kernel, scratch), X).dmas == 2

    def partial(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x_hbm.reshape(4, 8, 128).at[1], buf.at[pl.ds(8, 8)], sem)
        c.start()
        c.wait()
        c = pltpu.make_async_copy(buf, o_hbm, sem)  # rows 0-7 and 16-31 never written
        c.start()
        c.wait()

    # A copy of a partly written block is fine (kernels copy fixed-size blocks whose
    # tail is padding); the garbage is reported where it leaves the kernel, naming
    # the copy that carried it.
    with pytest.raises(
        UnwrittenReadError,
        match=r"o_hbm\[0:32.*test_engine_protocols\.py:\d+ .*filled it from buf\[0:32",
    ):
        verify(_local(partial, scratch), X)

    def nothing(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(buf, o_hbm, sem)  # a staging buffer nothing wrote
        c.start()
        c.wait()

    # A source nothing wrote moves garbage: reported where it is read (here, the
    # kernel's return of the output), naming the copy that brought it.
    with pytest.raises(
        UnwrittenReadError,
        match=r"o_hbm\[0:32.*test_engine_protocols\.py:\d+ .*filled it from buf\[0:32, 0:128\], "
        r"which nothing wrote",
    ):
        verify(_local(nothing, scratch), X)


def test_sync_copy() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
        pltpu.sync_copy(x_hbm, buf)
        pltpu.sync_copy(buf, o_hbm)

    assert verify(_local(kernel, [pltpu.VMEM(X.shape, X.dtype)]), X).dmas == 2


def _two_cores(kernel: Callable[..., None]) -> Callable[[jax.Array], jax.Array]:
    mesh = (
        pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
        if hasattr(pltpu, "TensorCoreMesh")
        and "num_cores" in str(getattr(pltpu.TensorCoreMesh, "__dataclass_fields__", ""))
        else (pltpu.create_tensorcore_mesh("core", num_cores=2))
    )
    return pl.kernel(
        kernel,
        out_type=X,
        mesh=mesh,  # type: ignore[no-any-return]
        scratch_types=[pltpu.SemaphoreType.DMA(())],
    )


def test_pl_kernel_cores_are_participants() -> None:
    def halves(x: Any, o: Any, sem: Any) -> None:
        c = jax.lax.axis_index("core")
        cp = pltpu.make_async_copy(x.at[pl.ds(c * 16, 16)], o.at[pl.ds(c * 16, 16)], sem)
        cp.start()
        cp.wait()

    report = verify(_two_cores(halves), X)
    assert report.dmas == 2 and report.waits == 2

    def both_write_everything(x: Any, o: Any, sem: Any) -> None:
        cp = pltpu.make_async_copy(x, o, sem)
        cp.start()
        cp.wait()

    with pytest.raises(RaceDetectedError, match="core 1"):
        verify(_two_cores(both_write_everything), X)


PAGED = "jax.experimental.pallas.ops.tpu.paged_attention"


def test_jax_paged_attention_schedule_verified_and_bad_page_caught() -> None:
    paged = pytest.importorskip(PAGED).paged_attention
    q = jax.ShapeDtypeStruct((2, 4, 128), jnp.float32)
    pages = jax.ShapeDtypeStruct((2, 16, 16, 128), jnp.float32)
    lengths = np.array([40, 64], np.int32)
    fn = functools.partial(paged, pages_per_compute_block=2)
    report = verify(fn, q, pages, pages, lengths, np.arange(8, dtype=np.int32).reshape(2, 4))
    assert report.dmas > 0 and report.waits > 0
    bad = np.array([[0, 1, 2, 3], [4, 5, 99, 7]], np.int32)  # page 99 of 16
    with pytest.raises(SimulationError, match="index 99 is outside dimension 0 of size 16"):
        verify(fn, q, pages, pages, lengths, bad)
    with pytest.raises(VerificationUnsupportedError, match="lengths_ref"):
        verify(
            fn,
            q,
            pages,
            pages,
            jax.ShapeDtypeStruct((2,), jnp.int32),
            np.arange(8, dtype=np.int32).reshape(2, 4),
        )


# ------------------------------------------------------------------ DMA futures

ANY = pl.BlockSpec(memory_space=pl.ANY)


def _copy_start(x: jax.Array) -> Any:
    def kernel(x_ref: Any, aliased: Any, o_ref: Any, sem: Any) -> None:
        del aliased
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    out = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        pltpu.SemaphoreType.DMA(()),
    )
    return pl.pallas_call(
        kernel,
        out_shape=out,
        in_specs=[ANY],
        out_specs=(ANY, ANY, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
        input_output_aliases={0: 0},
    )(x)


def _copy_done(x: jax.Array, o: jax.Array, sem: jax.Array) -> Any:
    def kernel(x_ref: Any, o_ref: Any, sem: Any, aliased: Any) -> None:
        del aliased
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[ANY, ANY, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)],
        out_specs=ANY,
        input_output_aliases={1: 0},
    )(x, o, sem)


def test_dma_future_started_in_one_call_waited_in_another() -> None:
    def good(x: jax.Array) -> Any:
        return _copy_done(*_copy_start(x))

    def never_waited(x: jax.Array) -> Any:
        return _copy_start(x)[1]

    assert verify(good, X).dmas == 1
    with pytest.raises(LeftoverSemaphoreError, match="DMA future"):
        verify(never_waited, X)


def test_jax_all_gather_without_flow_control_is_reported() -> None:
    """jax's shipped ring all-gather reuses one receive semaphore per direction with no
    capacity handshake: a neighbour that runs a step ahead lands its next copy on the same
    semaphore, and a wait of one slot's bytes may be satisfied by it before the slot that
    is forwarded next has landed (R9). safedma.kernels.all_gather adds the handshake."""
    jag = pytest.importorskip("jax.experimental.pallas.ops.tpu.all_gather")
    mesh = abstract_mesh((4,), ("x",))
    fn = getattr(jag.all_gather, "__wrapped__", jag.all_gather)
    with pytest.raises(RaceDetectedError, match="all_gather.py"):
        verify(
            functools.partial(fn, mesh=mesh, axis_name="x"),
            jax.ShapeDtypeStruct((32, 128), jnp.float32),
        )


def test_emit_pipeline_under_a_tpu_abstract_mesh() -> None:
    """emit_pipeline asks for the TPU generation while tracing: trace under a TPU mesh."""
    from safedma.testing import tpu_mesh

    def kernel(x_hbm: Any, o_hbm: Any) -> None:
        def body(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(body, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    try:
        mesh = tpu_mesh("v5e:1x1")
    except Exception as err:  # no libtpu topology on this machine
        pytest.skip(f"no TPU topology for tracing: {err}")
    call = pl.pallas_call(kernel, out_shape=X, in_specs=[HBM], out_specs=HBM)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        report = verify(call, X)
    assert report.dmas == 8 and report.waits == 8
