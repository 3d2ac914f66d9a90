"""Pass: raw pltpu code that annotates jax's own ``AsyncCopyDescriptor`` and refs typed with jax's types.

production kernels (jax's ops/tpu, vLLM's ragged paged attention,
tokamax) keep descriptors in helpers, lists and dicts typed with jax's
``AsyncCopyDescriptor`` (imported from ``jax._src.pallas.mosaic.primitives``: pltpu does
not export it), wait them later on either side, annotate refs ``jax.Array`` (optional
ones ``jax.Array | None``), index 2-D semaphore arrays and copy through views. Each
function here was a false positive of the stubs under mypy and pyright before.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax._src.pallas.mosaic.primitives import AsyncCopyDescriptor
from jax._src.pallas.mosaic import primitives as tpu_primitives
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemArray2, SemRef


def start_fetch(src: DataRef, dst: DataRef, sem: SemRef) -> AsyncCopyDescriptor:
    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()
    return copy


def wait_it(copy: AsyncCopyDescriptor) -> None:
    copy.wait()


def start_or_wait(op: tpu_primitives.AsyncCopyDescriptor, wait: bool = False) -> None:
    if wait:
        op.wait()
    else:
        op.start()


def listed(x_hbm: DataRef, bufs: DataRef, sems: SemArray) -> None:
    copies: list[AsyncCopyDescriptor] = []
    for i in range(4):
        copies.append(pltpu.make_async_copy(x_hbm.at[i], bufs.at[i], sems.at[i]))
    for c in copies:
        c.start()
    for c in copies:
        wait_it(c)
    first = start_fetch(x_hbm.at[0], bufs.at[0], sems.at[0])
    first.wait()
    start_or_wait(pltpu.make_async_copy(x_hbm.at[1], bufs.at[1], sems.at[1]))
    start_or_wait(pltpu.make_async_copy(x_hbm.at[1], bufs.at[1], sems.at[1]), wait=True)


def remote_stored(x_ref: DataRef, o_ref: DataRef, send_sems: SemArray, recv_sems: SemArray) -> None:
    me = jax.lax.axis_index("x")
    pending: dict[int, AsyncCopyDescriptor] = {}
    for k in range(1, 4):
        c = pltpu.make_async_remote_copy(
            x_ref.at[k], o_ref.at[k], send_sems.at[k], recv_sems.at[k], device_id=(me + k) % 4,
            device_id_type=pl.DeviceIdType.MESH,
        )
        c.start()
        pending[k] = c
    for pending_copy in pending.values():
        pending_copy.wait_send()
        pending_copy.wait_recv()
    sends: list[AsyncCopyDescriptor] = [
        pltpu.async_remote_copy(x_ref, o_ref, send_sems.at[0], recv_sems.at[0], device_id=(me + 1) % 4)
    ]
    for s in sends:
        s.wait_send()


def async_copy_result(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> AsyncCopyDescriptor:
    return pltpu.async_copy(x_hbm, buf, sem)


def priorities(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, buf, sem).start(priority=1)
    c: AsyncCopyDescriptor = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start(priority=1)
    c.wait()


class MultiPageCopy:
    """A helper class holding several page copies on one semaphore (paged attention style)."""

    def __init__(self, pages_hbm: DataRef, vmem_buf: DataRef, sem: SemRef, page_ids: Sequence[int]) -> None:
        self._copies = [
            pltpu.make_async_copy(pages_hbm.at[p], vmem_buf.at[i], sem) for i, p in enumerate(page_ids)
        ]

    def start(self) -> None:
        for c in self._copies:
            c.start()

    def wait_and_get(self) -> None:
        for c in self._copies:
            c.wait()


def mixed_list(x_ref: DataRef, o_ref: DataRef, sems: SemArray) -> None:
    me = jax.lax.axis_index("x")
    local = pltpu.make_async_copy(x_ref, o_ref, sems.at[0])
    remote = pltpu.make_async_remote_copy(x_ref, o_ref, sems.at[1], sems.at[2], device_id=(me + 1) % 4)
    both = [local, remote]
    for c in both:
        c.start()
    for c in both:
        c.wait()


def nd_sems_helpers(kv_hbm: DataRef, bkv: DataRef, sems: SemArray2, slot: jax.Array) -> None:
    def _async_copy(src: DataRef, dst: DataRef, sem: SemRef, wait: bool) -> None:
        cp = pltpu.make_async_copy(src, dst, sem)
        if wait:
            cp.wait()
        else:
            cp.start()

    flat = kv_hbm.reshape(kv_hbm.shape[0] * kv_hbm.shape[1], *kv_hbm.shape[2:])
    for i in range(4):
        _async_copy(flat.at[pl.ds(i * 16, 16)], bkv.at[slot, pl.ds(i * 16, 16)], sems.at[0, slot], wait=False)
    _async_copy(flat.bitcast(jnp.uint32), bkv.bitcast(jnp.uint32), sems.at[1, slot], wait=True)
    sem_row = sems.at[2]
    pltpu.make_async_copy(kv_hbm, bkv, sem_row.at[slot]).wait()


def optional_refs(
    x_hbm: DataRef, scale_hbm: jax.Array | None, buf: DataRef, scale_buf: jax.Array | None, sem: SemRef
) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    if scale_hbm is not None and scale_buf is not None:
        pltpu.make_async_copy(scale_hbm, scale_buf, sem).start()
        pltpu.make_async_copy(scale_hbm, scale_buf, sem).wait()
    c.wait()


def array_annotated_refs(x_ref: jax.Array, o_ref: jax.Array, sem: SemRef) -> None:
    pltpu.make_async_copy(x_ref, o_ref, sem).start()
    pltpu.make_async_copy(x_ref.at[0], o_ref.at[0], sem).wait()


def sem_through_helpers(x_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    def copy_in(sem: SemRef) -> AsyncCopyDescriptor:
        return pltpu.make_async_copy(x_hbm, buf, sem)

    pick = functools.partial(copy_in, sems.at[0])
    pick().start()
    pick().wait()
    cps = [copy_in(sems.at[i]) for i in range(2)]
    for c in cps:
        c.start()
        c.wait()


def all_to_all_jax_annotated(
    x_ref: jax.Array,
    o_ref: jax.Array,
    send_sems: jax.Array,
    recv_sems: jax.Array,
    flags: jax.Array,
    copy_sem: jax.Ref,
) -> None:
    """Semaphore arrays annotated ``jax.Array`` and indexed, and a semaphore annotated ``jax.Ref``."""
    me = jax.lax.axis_index("x")
    for k in range(1, 4):
        c = pltpu.make_async_remote_copy(
            x_ref.at[k], o_ref.at[k], send_sems.at[k], recv_sems.at[k], device_id=(me + k) % 4
        )
        c.start()
        c.wait_send()
        c.wait_recv()
    pl.semaphore_signal(flags.at[0], 1, device_id=(me + 1) % 4)
    pl.semaphore_wait(flags.at[0], 1)
    local = pltpu.make_async_copy(x_ref, o_ref, copy_sem)
    local.start()
    local.wait()
    seen = local.dst_ref
    del seen
