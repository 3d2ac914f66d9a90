"""S5: waiting on a side a copy does not have: a local copy has no send or receive side.

``wait_read()`` and ``wait_write()`` on a local copy are jax 0.12's SparseCore push-stream
waits, so the stubs accept them (pass/ok_sparse_core_push_and_accumulate.py).

The descriptors subclass jax's ``AsyncCopyDescriptor`` (so code annotating jax's
class accepts them), so the wrong side is a method whose required keyword argument
(typed ``Never``) names the mistake, not a missing attribute.
"""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def local_waits_like_remote(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait_send()  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
    c.wait_recv()  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
    pltpu.async_copy(x_hbm, buf, sem).wait_send()  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
