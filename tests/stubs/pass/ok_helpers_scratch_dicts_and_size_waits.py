"""Pass: raw pltpu code in the shapes production kernels take, with the stubs. Branded
parameters, no stub error:

* semaphores taken from a ``Mapping[str, SemRef]`` (a dict of scratch);
* helpers that start a remote copy and drop the descriptor, and helpers that wait its send
  and receive sides on rebuilt descriptors (``device_id=0``, LOGICAL ids);
* a helper returning a remote descriptor (annotated with jax's ``AsyncCopyDescriptor``),
  started in one loop and waited in another;
* a second barrier on a REGULAR semaphore from a keyword ``pl.run_scoped`` used as a
  ``functools.partial`` decorator;
* a wait by the summed size of several copies on one self-copy view.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jax._src.pallas.mosaic.primitives import AsyncCopyDescriptor

from safedma import DataRef, RegularSem, SemArray, SemRef


def rdma_start(src: DataRef, dst: DataRef, target: jax.Array, send: SemRef, recv: SemRef) -> None:
    pltpu.make_async_remote_copy(src, dst, send, recv, device_id=target, device_id_type=pl.DeviceIdType.LOGICAL).start()


def rdma_wait_send(src: DataRef, send: SemRef) -> None:
    pltpu.make_async_remote_copy(src, src, send, send, device_id=0, device_id_type=pl.DeviceIdType.LOGICAL).wait_send()


def rdma_wait_recv(dst: DataRef, recv: SemRef) -> None:
    pltpu.make_async_remote_copy(dst, dst, recv, recv, device_id=0, device_id_type=pl.DeviceIdType.LOGICAL).wait_recv()


def swap(x_ref: DataRef, o_ref: DataRef, sems: Mapping[str, SemRef]) -> None:
    partner = jax.lax.axis_index("x") ^ 1
    rdma_start(x_ref, o_ref, partner, sems["send"], sems["recv"])
    rdma_wait_send(x_ref, sems["send"])
    rdma_wait_recv(o_ref, sems["recv"])


def exchange(x_ref: DataRef, recv_buf: DataRef, send_sems: SemArray, recv_sems: SemArray) -> None:
    me = jax.lax.axis_index("x")

    @functools.partial(pl.run_scoped, flag=pltpu.SemaphoreType.REGULAR)
    def _(flag: RegularSem) -> None:
        pl.semaphore_signal(flag, 1, device_id=(jax.lax.rem(me + 1, 4),))
        pl.semaphore_wait(flag, 1)

    def to_peer(offset: int) -> AsyncCopyDescriptor:
        return pltpu.make_async_remote_copy(
            x_ref, recv_buf.at[offset - 1], send_sems.at[offset - 1], recv_sems.at[offset - 1],
            device_id=(jax.lax.rem(me + offset, 4),),
        )

    for offset in range(1, 4):
        to_peer(offset).start()
    for offset in range(1, 4):
        to_peer(offset).wait()


def summed_wait(src: DataRef, window: DataRef, sem: SemRef, sizes: DataRef) -> None:
    total = sizes[0] + sizes[1]
    pltpu.make_async_copy(src.at[pl.ds(0, sizes[0])], window.at[0, pl.ds(0, sizes[0])], sem).start()
    pltpu.make_async_copy(src.at[pl.ds(0, sizes[1])], window.at[1, pl.ds(0, sizes[1])], sem).start()
    view = window.at[0, pl.ds(0, total)]
    pltpu.make_async_copy(view, view, sem).wait()
