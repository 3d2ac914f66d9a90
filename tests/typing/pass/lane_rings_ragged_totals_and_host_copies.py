"""Pass: shapes found in production DMA kernels (vLLM tpu-inference, jax's ragged all-to-all).

* a per-lane ring rotation: the ring's semaphores one scratch entry, a generic pytree
  dataclass, a startup
  barrier in ``pl.when`` on the first grid step, a per-step REGULAR handshake with the
  previous device, and per lane a remote copy whose receive is waited in one ``pl.when``,
  whose start is in another and whose send is waited at the end of the step through
  ``started_elsewhere()`` (the copies kept in a list of ``RemoteCopy[Given, Given]``);
* a ragged all-to-all: one remote copy per grid step sized by an SMEM value, started
  under ``pl.when(size > 0)``, the send and receive sides waited at the last step by
  copies sized by the traced totals;
* a host <-> HBM copy on a ``run_scoped`` DMA semaphore, with a HOST out-spec and a
  pinned-host output shape;
* the DMA part of a pipeline input that first waits a peer's remote write: chunks pushed
  to the partner (LOGICAL id, a 2-D semaphore array, the handles kept), a ``copy_in`` that
  waits the remote write by size and starts the fetch, a ``wait_in`` that waits the fetch
  by size, and the pushes' send sides waited at the end.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Generic, TypeVar

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import safedma
from safedma import (
    DataRef,
    Given,
    RegularSem,
    RemoteCopy,
    RemoteHandle,
    SemArray,
    SemArray2,
    SemRef,
)

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
ANY = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
HOST = pl.BlockSpec(memory_space=pl.HOST)
N, LANES, NBUF = 4, 2, 2
D = TypeVar("D")
R = TypeVar("R")


# --- a per-lane ring rotation ---------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingSems(Generic[D, R]):
    """One pytree class for the scratch entry and the semaphores the kernel receives."""

    dma: D
    sync: R


class Ring:
    def __init__(self, window: DataRef, sems: RingSems[SemArray, RegularSem]) -> None:
        self.window = window
        self.sems = sems
        self.step = pl.program_id(0)
        me = jax.lax.axis_index("x")
        self.next = safedma.mesh_coords(jax.lax.rem(me + 1, N))
        self.prev = safedma.mesh_coords(jax.lax.rem(me + N - 1, N))
        self.pending: list[tuple[jax.Array, RemoteCopy[Given, Given]]] = []

    def stage(self, rounds: list[jax.Array], valids: list[jax.Array]) -> None:
        @pl.when(self.step == 0)
        def _startup() -> None:
            barrier = safedma.barrier_semaphore()
            safedma.signal(barrier, 1, device=self.next)
            safedma.signal(barrier, 1, device=self.prev)
            safedma.wait(barrier, 2)

        safedma.signal(self.sems.sync, 1, device=self.prev)
        safedma.wait(self.sems.sync, 1)
        slot = jax.lax.rem(self.step, NBUF)
        for b in range(LANES):
            sends = jnp.logical_and(valids[b], rounds[b] != N - 1)
            receives = jnp.logical_and(valids[b], rounds[b] > 0)
            dst = self.window.at[slot, b + 1] if b + 1 < LANES else self.window.at[slot, 0]
            copy = (
                RemoteCopy(self.window.at[slot, b], dst, self.sems.dma.at[1])
                .with_send_sem(self.sems.dma.at[0])
                .to(self.next)
            )
            self.lane(copy, sends, receives)
            self.pending.append((sends, copy))

    def lane(self, copy: RemoteCopy[Given, Given], sends: jax.Array, receives: jax.Array) -> None:
        @pl.when(receives)
        def _wait_recv() -> None:
            copy.incoming().wait_recv()

        @pl.when(sends)
        def _start() -> None:
            copy.start()

    def finalize(self) -> None:
        for sends, copy in self.pending:
            self.wait_send(sends, copy)
        self.pending = []

    @staticmethod
    def wait_send(sends: jax.Array, copy: RemoteCopy[Given, Given]) -> None:
        @pl.when(sends)
        def _wait_send() -> None:
            copy.started_elsewhere().wait_send()


def ring_kernel(
    rounds_ref: DataRef,
    valid_ref: DataRef,
    x_hbm: DataRef,
    o_ref: DataRef,
    window: DataRef,
    load_sem: SemRef,
    sems: RingSems[SemArray, RegularSem],
) -> None:
    step = pl.program_id(0)
    slot = jax.lax.rem(step, NBUF)
    rounds = [rounds_ref[step, b] for b in range(LANES)]
    valids = [valid_ref[step, b] != 0 for b in range(LANES)]
    for b in range(LANES):
        safedma.LocalCopy(x_hbm.at[b], window.at[slot, b], load_sem).start().wait()
    ring = Ring(window, sems)
    ring.stage(rounds, valids)
    o_ref[...] += window[slot].sum(axis=0)
    ring.finalize()


def whole(step: jax.Array) -> tuple[int, int]:
    return (0, 0)


def ring(rounds: jax.Array, valid: jax.Array, x: jax.Array) -> jax.Array:
    # A pytree scratch entry goes through safedma.pallas_call's scratch_shapes (jax's
    # PrefetchScalarGridSpec annotates its scratch as shapes, lists and dicts only), so the
    # schedule tables come in as SMEM operands here.
    return safedma.pallas_call(
        ring_kernel,
        ShapeDtype((8, 128), jnp.float32),
        grid=(4,),
        in_specs=[SMEM, SMEM, ANY],
        out_specs=pl.BlockSpec((8, 128), whole),
        scratch_shapes=[
            safedma.vmem((NBUF, LANES, 8, 128), jnp.float32),
            safedma.dma_semaphore(),
            RingSems(safedma.dma_semaphores(2), safedma.regular_semaphore()),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(rounds, valid, x)


# --- a ragged all-to-all waited by totals ----------------------------------------------

GROUPS = 8


def all_to_all_kernel(
    x_hbm: DataRef,
    in_offsets: DataRef,
    in_sizes: DataRef,
    out_offsets: DataRef,
    total_sent: DataRef,
    total_received: DataRef,
    aliased: DataRef,
    o_hbm: DataRef,
    send_sem: SemRef,
    recv_sem: SemRef,
) -> None:
    del aliased
    group = (pl.program_id(0) + jax.lax.axis_index("x")) % GROUPS
    target = safedma.mesh_coords(group // (GROUPS // N))
    size = in_sizes[group]

    def rows(
        src: DataRef, dst: DataRef, start: jax.Array, at: jax.Array, count: jax.Array
    ) -> RemoteCopy[Given, Given]:
        copy = RemoteCopy(src.at[pl.ds(start, count)], dst.at[pl.ds(at, count)], recv_sem)
        return copy.with_send_sem(send_sem).to(target)

    copy = rows(x_hbm, o_hbm, in_offsets[group], out_offsets[group], size)

    @pl.when(size > 0)
    def _start() -> None:
        copy.start()

    @pl.when(pl.program_id(0) == GROUPS - 1)
    def _drain() -> None:
        zero = jnp.int32(0)
        rows(x_hbm, o_hbm, zero, zero, total_sent[0]).started_elsewhere().wait_send()
        rows(x_hbm, o_hbm, zero, zero, total_received[0]).incoming().wait_recv()


def all_to_all(
    x: jax.Array, in_off: jax.Array, in_size: jax.Array, out_off: jax.Array, out: jax.Array
) -> jax.Array:
    sent = in_size.sum(keepdims=True)
    return safedma.pallas_call(
        all_to_all_kernel,
        ShapeDtype(out.shape, out.dtype),
        grid=(GROUPS,),
        in_specs=[ANY, SMEM, SMEM, SMEM, SMEM, SMEM, ANY],
        out_specs=ANY,
        scratch_shapes=[safedma.dma_semaphore(), safedma.dma_semaphore()],
        input_output_aliases={6: 0},
    )(x, in_off, in_size, out_off, sent, sent, out)


# --- a host <-> HBM copy on a scoped semaphore ----------------------------------------


def host_hbm_dma(x_ref: DataRef, y_ref: DataRef) -> None:
    def body(sem: SemRef) -> None:
        safedma.LocalCopy(x_ref, y_ref, sem).start().wait()

    safedma.run_scoped(body, safedma.dma_semaphore())


def device_to_host(x: jax.Array, mesh: Mesh) -> jax.Array:
    host = NamedSharding(mesh, P(), memory_kind="pinned_host")
    return safedma.pallas_call(
        host_hbm_dma,
        ShapeDtype(x.shape, x.dtype, sharding=host),
        in_specs=[ANY],
        out_specs=HOST,
        name="d2h_dma_kernel",
    )(x)


def host_to_device(x: jax.Array) -> jax.Array:
    return safedma.pallas_call(
        host_hbm_dma,
        ShapeDtype(x.shape, x.dtype),
        in_specs=[HOST],
        out_specs=ANY,
        name="h2d_dma_kernel",
    )(x)


# --- a pipeline input that first waits a peer's remote write --------------------------

CHIPS, SEQ = 2, 8


def push_chunks(
    x_hbm: DataRef, recv_hbm: DataRef, send_sems: SemArray2, recv_sems: SemArray2
) -> list[RemoteHandle]:
    partner = safedma.logical_device(1 - jax.lax.axis_index("x"))
    handles: list[RemoteHandle] = []
    for chip in range(CHIPS):
        rows = pl.ds(chip * SEQ, SEQ)
        copy = RemoteCopy(x_hbm.at[rows], recv_hbm.at[rows], recv_sems.at[chip, 0])
        handles.append(copy.with_send_sem(send_sems.at[chip, 0]).to(partner).start())
    return handles


def remote_wait_copy_in(
    src: DataRef, window: DataRef, chip: jax.Array, remote: SemRef, fetch: SemRef
) -> None:
    safedma.wait_bytes(remote, window)
    safedma.LocalCopy(src.at[pl.ds(chip * SEQ, SEQ)], window, fetch).start()


def remote_wait_wait_in(window: DataRef, fetch: SemRef) -> None:
    safedma.wait_bytes(fetch, window)


def drain(handles: list[RemoteHandle]) -> None:
    for handle in handles:
        handle.wait_send()
