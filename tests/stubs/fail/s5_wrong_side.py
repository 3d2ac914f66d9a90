"""S5: waiting on a side a copy does not have: a local copy has only ``wait()``."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def local_waits_like_remote(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    c.wait_recv()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    c.wait_read()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    pltpu.async_copy(x_hbm, buf, sem).wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
