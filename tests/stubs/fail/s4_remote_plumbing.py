"""S4: asymmetric remote plumbing: a remote copy without its device or a semaphore, a send semaphore on a local copy."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def missing_parts(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=None).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, device_id=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]


def send_sem_on_a_local_copy(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    # jax 0.12's src_sem= runs in interpret mode but fails TPU lowering ("not implemented on TensorCore").
    pltpu.make_async_copy(x_ref, o_ref, recv_sem, src_sem=send_sem)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]  # ty: ignore[unknown-argument]
    pltpu.async_copy(x_ref, o_ref, recv_sem, src_sem=send_sem)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]  # ty: ignore[unknown-argument]
