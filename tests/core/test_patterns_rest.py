"""Issue 13 item 8: the rest of the census. DMA on REGULAR semaphores (CountedCopy),
LOGICAL device ids, run_scoped with many scratch shapes / keywords /
collective_axes, a priority held in a variable, and select_ref."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic
from tests.corpus._calls import X, X_SHARDED, local_call, mesh_call, trace

VMEM = pltpu.VMEM((32, 128), jnp.float32)


# --- DMA on a REGULAR semaphore ---------------------------------------------------


def _counted(x: sd.DataRef, o: sd.DataRef, flag: sd.RegularSem) -> None:
    sd.CountedCopy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], flag).start().wait()
    sd.CountedCopy(x.at[pl.ds(16, 8)], o.at[pl.ds(16, 8)], flag).start()
    sd.CountedCopy(x.at[pl.ds(24, 8)], o.at[pl.ds(24, 8)], flag).start(priority=1)
    sd.wait_counted(flag, 2)


def _counted_raw(x: Any, o: Any, flag: Any) -> None:
    pltpu.make_async_copy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], flag).start()
    pl.semaphore_wait(flag, 1)
    pltpu.make_async_copy(x.at[pl.ds(16, 8)], o.at[pl.ds(16, 8)], flag).start()
    pltpu.make_async_copy(x.at[pl.ds(24, 8)], o.at[pl.ds(24, 8)], flag).start(priority=1)
    pl.semaphore_wait(flag, 2)


def test_counted_copies_match_raw() -> None:
    ours = local_call(_counted, [sd.regular_semaphore()])
    theirs = local_call(_counted_raw, [pltpu.SemaphoreType.REGULAR(())], checked=False)
    assert_same_mosaic(ours, theirs, X)


def test_a_counted_copy_never_waited_is_reported() -> None:
    def kernel(x: sd.DataRef, o: sd.DataRef, flag: sd.RegularSem) -> None:
        sd.CountedCopy(x, o, flag).start()

    with pytest.raises(sd.CopyNeverWaitedError, match="CountedCopy"):
        trace(local_call(kernel, [sd.regular_semaphore()]))


def test_a_counted_copy_needs_a_regular_semaphore() -> None:
    def kernel(x: Any, o: Any, sem: Any) -> None:
        sd.CountedCopy(x, o, sem).start().wait()

    with pytest.raises(sd.SemaphoreKindError, match="REGULAR"):
        trace(local_call(kernel, [sd.dma_semaphore()]))


# --- LOGICAL device ids -----------------------------------------------------------


def _logical(x: sd.DataRef, o: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
    target = (sd.my_index("x") + 1) % 4
    copy = sd.RemoteCopy(x, o, recv).with_send_sem(send).to(sd.logical_device(target))
    copy.start().wait()


def _logical_raw(x: Any, o: Any, send: Any, recv: Any) -> None:
    target = (jax_axis_index() + 1) % 4
    c = pltpu.make_async_remote_copy(
        x, o, send, recv, device_id=target, device_id_type=pl.DeviceIdType.LOGICAL
    )
    c.start()
    c.wait_send()
    c.wait_recv()


def jax_axis_index() -> Any:
    import jax

    return jax.lax.axis_index("x")


@pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")
def test_logical_device_ids_match_raw() -> None:
    ours = mesh_call(_logical, [sd.dma_semaphore(), sd.dma_semaphore()])
    theirs = mesh_call(
        _logical_raw, [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())], checked=False
    )
    assert_same_mosaic(ours, theirs, X_SHARDED)


def test_safedma_logical_ids_raise_no_jax_deprecation_warning() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(mesh_call(_logical, [sd.dma_semaphore(), sd.dma_semaphore()]), X_SHARDED)


def test_a_static_logical_id_outside_the_mesh_is_caught() -> None:
    def kernel(x: sd.DataRef, o: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
        sd.RemoteCopy(x, o, recv).with_send_sem(send).to(sd.logical_device(4)).start().wait()

    with pytest.raises(sd.DeviceIdError, match="outside"):
        trace(mesh_call(kernel, [sd.dma_semaphore(), sd.dma_semaphore()]), X_SHARDED)


@pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")
def test_logical_remote_signal_matches_raw() -> None:
    def ours(x: sd.DataRef, o: sd.DataRef, flag: sd.RegularSem) -> None:
        sd.signal(flag, device=sd.logical_device(0))
        sd.wait(flag)

    def raw(x: Any, o: Any, flag: Any) -> None:
        pl.semaphore_signal(flag, 1, device_id=0, device_id_type=pl.DeviceIdType.LOGICAL)
        pl.semaphore_wait(flag, 1)

    assert_same_mosaic(
        mesh_call(ours, [sd.regular_semaphore()]),
        mesh_call(raw, [pltpu.SemaphoreType.REGULAR(())], checked=False),
        X_SHARDED,
    )


# --- run_scoped: many scratch shapes, keywords, collective_axes -------------------


def _scoped(x: sd.DataRef, o: sd.DataRef) -> None:
    def body(
        a: sd.DataRef, b: sd.DataRef, sems: sd.SemArray2, one: sd.SemRef, flag: sd.RegularSem
    ) -> None:
        sd.LocalCopy(x, a, sems.at[0, 1]).start().wait()
        sd.LocalCopy(a, b, one).start().wait()
        sd.signal(flag)
        sd.wait(flag)

    sd.run_scoped(
        body,
        sd.vmem((32, 128), jnp.float32),
        sd.vmem((32, 128), jnp.float32),
        sd.dma_semaphores((2, 2)),
        sd.dma_semaphore(),
        sd.regular_semaphore(),
    )

    def named(*, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(buf, o, sem).start().wait()

    sd.run_scoped(named, buf=sd.vmem((32, 128), jnp.float32), sem=sd.dma_semaphore())


def _scoped_raw(x: Any, o: Any) -> None:
    def body(a: Any, b: Any, sems: Any, one: Any, flag: Any) -> None:
        for src, dst, sem in [(x, a, sems.at[0, 1]), (a, b, one)]:
            c = pltpu.make_async_copy(src, dst, sem)
            c.start()
            c.wait()
        pl.semaphore_signal(flag, 1)
        pl.semaphore_wait(flag, 1)

    pl.run_scoped(
        body,
        VMEM,
        VMEM,
        pltpu.SemaphoreType.DMA((2, 2)),
        pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.REGULAR(()),
    )

    def named(*, buf: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(buf, o, sem)
        c.start()
        c.wait()

    pl.run_scoped(named, buf=VMEM, sem=pltpu.SemaphoreType.DMA(()))


def test_run_scoped_many_and_keyword_match_raw() -> None:
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(local_call(_scoped), local_call(_scoped_raw, checked=False), X, mesh=mesh)


def test_run_scoped_passes_collective_axes() -> None:
    seen: dict[str, Any] = {}

    def fake(body: Any, *types: Any, **kw: Any) -> Any:
        seen.update(kw)
        return None

    import safedma._scratch as scratch

    original = scratch.pl.run_scoped
    scratch.pl.run_scoped = fake  # type: ignore[assignment]
    try:
        sd.run_scoped(lambda flag: None, sd.regular_semaphore(), collective_axes="x")
    finally:
        scratch.pl.run_scoped = original  # type: ignore[assignment]
    assert seen == {"collective_axes": "x"}


# --- priority from a variable -----------------------------------------------------


@pytest.mark.parametrize("level", [0, 1])
def test_priority_from_a_variable_matches_raw(level: int) -> None:
    def ours(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, o, sem).start(priority=sd.priority(level)).wait()

    def raw(x: Any, o: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, o, sem)
        c.start(priority=level)
        c.wait()

    assert_same_mosaic(
        local_call(ours, [sd.dma_semaphore()]),
        local_call(raw, [pltpu.SemaphoreType.DMA(())], checked=False),
        X,
    )


@pytest.mark.parametrize("level", [2, -1, True, 1.0])
def test_priority_outside_0_1_is_caught(level: Any) -> None:
    with pytest.raises(sd.PriorityError):
        sd.priority(level)


# --- select_ref -------------------------------------------------------------------


def _select(x: sd.DataRef, o: sd.DataRef, a: sd.DataRef, b: sd.DataRef, sems: sd.SemArray) -> None:
    i = pl.program_id(0) % 2
    buf = sd.select_ref(i, a, b)
    sem = sd.select_ref(i, sems.at[0], sems.at[1])
    sd.LocalCopy(x, buf, sem).start().wait()


def _select_raw(x: Any, o: Any, a: Any, b: Any, sems: Any) -> None:
    i = pl.program_id(0) % 2
    buf = pl.select_ref(i, a, b)
    sem = pl.select_ref(i, sems.at[0], sems.at[1])
    c = pltpu.make_async_copy(x, buf, sem)
    c.start()
    c.wait()


def test_select_ref_for_refs_and_semaphores_matches_raw() -> None:
    ours = local_call(
        _select,
        [sd.vmem((32, 128), jnp.float32), sd.vmem((32, 128), jnp.float32), sd.dma_semaphores(2)],
        grid=(2,),
    )
    theirs = local_call(
        _select_raw, [VMEM, VMEM, pltpu.SemaphoreType.DMA((2,))], checked=False, grid=(2,)
    )
    assert_same_mosaic(ours, theirs, X)


def test_select_ref_of_mixed_kinds_or_shapes_is_caught() -> None:
    def mixed(x: Any, o: Any, a: Any, sem: Any) -> None:
        sd.select_ref(pl.program_id(0), a, sem)

    with pytest.raises(sd.SemaphoreKindError, match="one kind"):
        trace(local_call(mixed, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()], grid=(2,)))

    def shapes(x: Any, o: Any, a: Any, b: Any) -> None:
        sd.select_ref(pl.program_id(0), a, b)

    with pytest.raises(sd.CopyShapeMismatchError, match="one shape"):
        trace(
            local_call(
                shapes, [sd.vmem((32, 128), jnp.float32), sd.vmem((8, 128), jnp.float32)], grid=(2,)
            )
        )
