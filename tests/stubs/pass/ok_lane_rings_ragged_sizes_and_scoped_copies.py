"""Pass: raw pltpu shapes of ring, ragged all-to-all and host-copy kernels, with the stubs.

* a ring lane: ``make_async_remote_copy`` by keyword with ``device_id_type``, its receive
  waited under one ``pl.when``, its start under another, its send waited at the end of the
  step; a startup barrier and a REGULAR handshake signalled to a tuple device id;
* a ragged all-to-all: copies sized by SMEM values, started under ``pl.when(size > 0)``,
  drained by descriptors sized by the totals;
* ``pltpu.async_copy(...).wait()`` on a ``run_scoped`` semaphore.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSem, SemArray, SemRef


def ring_lane(
    window: DataRef, dma: SemArray, sync: RegularSem, sends: jax.Array, receives: jax.Array
) -> None:
    me = jax.lax.axis_index("x")
    next_id = (jax.lax.rem(me + 1, 4),)
    prev_id = (jax.lax.rem(me + 3, 4),)

    @pl.when(pl.program_id(0) == 0)
    def _startup() -> None:
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=next_id)
        pl.semaphore_signal(barrier, 1, device_id=prev_id)
        pl.semaphore_wait(barrier, 2)

    pl.semaphore_signal(sync, 1, device_id=prev_id)
    pl.semaphore_wait(sync, 1)
    copy = pltpu.make_async_remote_copy(
        src_ref=window.at[0, 0],
        dst_ref=window.at[0, 1],
        send_sem=dma.at[0],
        recv_sem=dma.at[1],
        device_id=next_id,
    )

    @pl.when(receives)
    def _recv() -> None:
        copy.wait_recv()

    @pl.when(sends)
    def _start() -> None:
        copy.start()

    @pl.when(sends)
    def _send() -> None:
        copy.wait_send()


def all_to_all_step(
    x: DataRef, o: DataRef, sizes: DataRef, totals: DataRef, send: SemRef, recv: SemRef
) -> None:
    group = pl.program_id(0)
    size = sizes[group]
    copy = pltpu.make_async_remote_copy(
        x.at[pl.ds(0, size)], o.at[pl.ds(0, size)], send, recv, device_id=(group // 2,)
    )

    @pl.when(size > 0)
    def _start() -> None:
        copy.start()

    @pl.when(group == 7)
    def _drain() -> None:
        sent = totals[0]
        pltpu.make_async_remote_copy(
            x.at[pl.ds(0, sent)], o.at[pl.ds(0, sent)], send, recv, device_id=(group // 2,)
        ).wait_send()


def host_hbm_dma(x_ref: DataRef, y_ref: DataRef) -> None:
    def body(sem: SemRef) -> None:
        pltpu.async_copy(x_ref, y_ref, sem).wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA)
