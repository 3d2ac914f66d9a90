"""S4: asymmetric remote plumbing: a remote copy without its device or a semaphore.

A send (source) semaphore on a local copy is legal raw code on jax 0.12 for SparseCore push
streams (``src_sem=``), so the stubs accept it (pass/ok_sparse_core_push_and_accumulate.py);
on a TensorCore it fails lowering ("not implemented on TensorCore")."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def missing_parts(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=None).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, device_id=1)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]

