"""T5 where the stubs catch it statically: ``add=True`` on a remote copy, a non-bool ``add``.

A priority is any ``int`` (pass/ok_priorities_from_variables.py): a type cannot accept an
``int`` variable and still reject the literal ``2``. Mosaic rejects a priority other than 0
and 1, and a non-zero priority on a remote copy, when the kernel is lowered for a TPU (T4).

A local ``add=True`` and a local copy without a semaphore are legal raw code on SparseCore
(a scatter-add; jax 0.12's push streams, ``sem=None``), so the stubs accept them
(pass/ok_sparse_core_push_and_accumulate.py); on a TensorCore they fail lowering, and
safedma's ``LocalCopy`` rejects them at trace time (T5, T6)."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def bad_values(x_ref: DataRef, o_ref: DataRef, sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_copy(x_ref, o_ref, sem).start(add=1.0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, sem, recv_sem, device_id=1).start(add=True)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
