"""Mistakes seeded into shapes production kernels take (vLLM tpu-inference, jax's ragged
all-to-all): a per-lane ring rotation with its semaphores in a dataclass, a ragged all-to-all waited by
totals, a host <-> HBM copy on a scoped semaphore. Each expected error is the
``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, Given, RegularSem, RemoteCopy, SemArray, SemArray2, SemRef


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RingSems:
    dma: SemArray
    sync: RegularSem


def lane_without_send_semaphore(window: DataRef, sems: RingSems, sends: jax.Array) -> None:
    # S4: the lane's copy goes to the next device with no send semaphore.
    copy = RemoteCopy(window.at[0, 0], window.at[0, 1], sems.dma.at[1]).to(safedma.neighbour("x"))

    @pl.when(sends)
    def _start() -> None:
        copy.start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def pending_half_built(
    window: DataRef, sems: RingSems, pending: list[RemoteCopy[Given, Given]]
) -> None:
    # S4: a half-built copy kept for the end-of-step send waits.
    pending.append(RemoteCopy(window.at[0, 0], window.at[0, 1], sems.dma.at[1]))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def handshake_as_receive_semaphore(window: DataRef, sems: RingSems) -> None:
    # S3: the REGULAR per-step handshake semaphore as the copy's receive semaphore.
    RemoteCopy(window.at[0, 0], window.at[0, 1], sems.sync)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def handshake_on_the_dma_semaphore(sems: RingSems) -> None:
    # S3: the per-step handshake signalled on a DMA semaphore.
    safedma.signal(sems.dma.at[0], 1, device=safedma.neighbour("x", -1))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def receive_waited_on_the_description(copy: RemoteCopy[Given, Given]) -> None:
    # S9: the incoming block waited on the description, not through incoming().
    copy.wait_recv()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def drain_send_side_on_the_receiver(copy: RemoteCopy[Given, Given]) -> None:
    # S5: the all-to-all's send total waited through the receiving side.
    copy.incoming().wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def all_to_all_target_as_float(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    # S7: the target device computed as a float.
    RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.mesh_coords(1.5))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def host_copy_on_the_semaphore_value(x_ref: DataRef, y_ref: DataRef) -> None:
    def body(sem: SemRef) -> None:
        # S1: the semaphore's value where the semaphore belongs.
        safedma.LocalCopy(x_ref, y_ref, safedma.read(sem)).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]

    safedma.run_scoped(body, safedma.dma_semaphore())


def host_copy_on_a_regular_scoped_semaphore(x_ref: DataRef, y_ref: DataRef) -> None:
    def body(sem: SemRef) -> None:
        safedma.LocalCopy(x_ref, y_ref, sem).start().wait()

    # S3: the scoped semaphore declared REGULAR for a body that copies on it.
    safedma.run_scoped(body, safedma.regular_semaphore())  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def remote_write_waited_on_the_whole_array(window: DataRef, recv_sems: SemArray2) -> None:
    # S2: the peer's write waited on the 2-D semaphore array, not its [chip, mb] slot.
    safedma.wait_bytes(recv_sems, window)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def fetch_on_the_window(src: DataRef, window: DataRef) -> None:
    # S6: the window slot passed as the fetch's semaphore.
    safedma.LocalCopy(src, window, window.at[0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
