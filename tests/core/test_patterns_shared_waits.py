"""Issue 13 item 3: one DMA semaphore shared by local copies and remote sends and
receives, waited by total size (``wait_bytes``, ``wait_copies``).

The kernel scope accepts it (no false alarm on either side), the Mosaic is the
raw self-descriptor wait, and the waits still count: a kernel that never waits
the shared semaphore is still reported.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import assert_same_mosaic
from tests.support import census_kernels as ck
from tests.support.patterns import X, X_SHARDED, local_call, mesh_call, trace


def _gather_then_wait_copies(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    first = sd.LocalCopy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem)
    second = sd.LocalCopy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem)
    first.start()
    second.start()
    sd.wait_copies(sem, first, second)
    sd.LocalCopy(buf, o, sem).start().wait()


def _gather_raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
    pltpu.make_async_copy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
    pltpu.make_async_copy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
    for part in (buf.at[pl.ds(0, 16)], buf.at[pl.ds(16, 16)]):
        pltpu.make_async_copy(part, part, sem).wait()
    c = pltpu.make_async_copy(buf, o, sem)
    c.start()
    c.wait()


SCRATCH = [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]
RAW_SCRATCH = [pltpu.VMEM((32, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]


def test_wait_copies_matches_raw_self_descriptor_waits() -> None:
    assert_same_mosaic(
        local_call(_gather_then_wait_copies, SCRATCH),
        local_call(_gather_raw, RAW_SCRATCH, checked=False),
        X,
    )


def test_wait_bytes_is_one_self_descriptor_wait() -> None:
    def ours(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
        sd.LocalCopy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
        sd.wait_bytes(sem, buf)

    def raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
        pltpu.make_async_copy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
        pltpu.make_async_copy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
        pltpu.make_async_copy(buf, buf, sem).wait()

    assert_same_mosaic(local_call(ours, SCRATCH), local_call(raw, RAW_SCRATCH, checked=False), X)


def test_moe_all_to_all_is_accepted_by_the_kernel_scope() -> None:
    trace(mesh_call(ck.moe_all_to_all, [sd.dma_semaphore()]), X_SHARDED)


def test_moe_without_the_size_waits_is_still_reported() -> None:
    def no_waits(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        me = sd.my_index("x")
        copy = sd.RemoteCopy(x.at[pl.ds(0, 8)], o.at[pl.ds(me * 8, 8)], sem)
        copy.with_send_sem(sem).to(sd.neighbour("x")).start()
        sd.LocalCopy(x.at[pl.ds(8, 8)], o.at[pl.ds(8, 8)], sem).start()

    with pytest.raises(sd.CopyNeverWaitedError, match="2 copies"):
        trace(mesh_call(no_waits, [sd.dma_semaphore()]), X_SHARDED)


def test_a_wait_before_the_start_in_trace_order_settles_it() -> None:
    """Pipelined loops wait the previous step's copies before starting the next."""

    def kernel(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
        @pl.when(pl.program_id(0) > 0)
        def _() -> None:
            sd.wait_bytes(sem, buf)

        sd.LocalCopy(x, buf, sem).start()

    trace(local_call(kernel, SCRATCH, grid=(3,)))


def test_wait_copies_of_a_copy_on_another_semaphore_is_caught() -> None:
    def kernel(
        x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef, other: sd.SemRef
    ) -> None:
        copy = sd.LocalCopy(x, buf, other)
        copy.start()
        sd.wait_copies(sem, copy)

    with pytest.raises(sd.SemaphoreKindError, match="does not signal the waited semaphore"):
        trace(local_call(kernel, [*SCRATCH, sd.dma_semaphore()]))


def test_wait_bytes_checks_its_arguments() -> None:
    def kernel(x: Any, o: Any, buf: Any, sem: Any) -> None:
        sd.wait_bytes(buf, sem)

    with pytest.raises(sd.SemaphoreKindError):
        trace(local_call(kernel, SCRATCH))
