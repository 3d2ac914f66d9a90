"""S9: only a started copy's handle can be waited (docs/catalogue.md). A description is
not a handle; waiting for a copy started elsewhere goes through the named
``started_elsewhere()`` / ``incoming()`` API.

pltpu today lets any descriptor be waited, and rebuilding one just to wait is
common and error-prone. Each expected error is the ``# type: ignore[code]`` on
its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, LocalCopy, RemoteCopy, SemRef


def wait_a_local_description(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    copy = LocalCopy(x_hbm, buf, sem)
    # S9: an unstarted local copy has no wait().
    copy.wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle = copy.start()
    handle.wait()


def wait_a_remote_description(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    copy = RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.neighbour("x"))
    # S9: an unstarted remote copy has none of the waits.
    copy.wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    copy.wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    copy.wait_recv()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    copy.start().wait()


def handles_are_not_descriptions(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    handle = LocalCopy(x_hbm, buf, sem).start()
    # S9: a handle cannot be started again ...
    handle.start()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle.wait()
    # ... and wait() returns the destination, a data ref, which cannot be waited again.
    LocalCopy(x_hbm, buf, sem).start().wait().wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def started_elsewhere_is_a_handle_not_a_copy(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    pending = LocalCopy(x_hbm, buf, sem).started_elsewhere()
    # S9: the started_elsewhere() handle is for waiting only; it does not start the copy.
    pending.start()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    pending.wait()
