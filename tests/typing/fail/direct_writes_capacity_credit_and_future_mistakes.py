"""Mistakes seeded into shapes production kernels take (vLLM tpu-inference, simply's MoE): a
direct-write reduce-scatter, a bidirectional reduce-scatter matmul with capacity
semaphores, a ragged all-to-all as a DMA future. Each expected error is the
``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, Given, RegularSem, RemoteCopy, SemArray, SemArray3, SemRef


def row_write_on_the_receive_array(
    staging: DataRef, out: DataRef, send_sems: SemArray, recv_sem: SemArray, dest: jax.Array
) -> None:
    # S2: the one-semaphore receive array where its slot belongs.
    RemoteCopy(staging.at[0], out.at[0], recv_sem).with_send_sem(send_sems.at[0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def slot_drained_on_the_whole_array(staging: DataRef, send_sems: SemArray) -> None:
    # S2: a staging slot drained by size on the semaphore array, not its slot.
    safedma.wait_bytes(send_sems, staging.at[0, pl.ds(0, 2)])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def row_written_to_a_float_chip(staging: DataRef, out: DataRef, send: SemRef, recv: SemRef) -> None:
    # S7: the destination chip computed as a float.
    RemoteCopy(staging, out, recv).with_send_sem(send).to(safedma.device(x=1.5))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def capacity_as_receive_semaphore(hbm: DataRef, send: SemRef, capacity: RegularSem) -> None:
    # S3: the REGULAR capacity semaphore as the copy's receive semaphore.
    RemoteCopy(hbm.at[0], hbm.at[1], capacity).with_send_sem(send)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def capacity_waited_on_the_dma_semaphore(recv: SemRef) -> None:
    # S3: the capacity wait written on the copy's DMA receive semaphore.
    safedma.wait(recv, 1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def epilogue_waits_the_description(copy: RemoteCopy[Given, Given]) -> None:
    # S9: the copy started in the other pl.when waited on its description.
    copy.wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def future_receive_on_a_semaphore_pair(
    src: DataRef, dst: DataRef, sems: SemArray3, slot: jax.Array
) -> None:
    # S2: a slot and a direction of the 3-D array: two positions of three.
    RemoteCopy(src, dst, sems.at[slot, 0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def future_receive_waited_as_a_send(copy: RemoteCopy[Given, Given]) -> None:
    # S5: another device's send, waited here through its send side.
    copy.incoming().wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def future_send_without_a_target(src: DataRef, dst: DataRef, sems: SemArray3) -> None:
    # S4: a send started with its send semaphore but no target device.
    RemoteCopy(src, dst, sems.at[0, 0, 1]).with_send_sem(sems.at[0, 0, 0]).start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
