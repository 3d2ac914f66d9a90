"""S5: waiting on the wrong side (docs/catalogue.md): ``wait_send``/``wait_recv`` on a
local copy, ``wait_read`` on a local copy, and a send-side wait on a copy this
device only receives.

pltpu today: a RuntimeError at trace time for ``wait_send``, a cryptic
TypeError (interpret) or NotImplementedError (lowering) for ``wait_read``.
safedma's handles only have the waits that exist for their side. Each
expected error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RemoteCopy, SemRef


def remote_waits_on_a_local_copy(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    handle = safedma.LocalCopy(x_hbm, buf, sem).start()
    # S5: wait_send / wait_recv exist only for remote copies.
    handle.wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle.wait_recv()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # S5: wait_read (pltpu's descriptor method) on a local copy.
    handle.wait_read()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle.wait()


def wait_read_on_started_elsewhere(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    # S5: the same on a started_elsewhere handle.
    safedma.LocalCopy(x_hbm, buf, sem).started_elsewhere().wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def send_side_on_the_receiver(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    incoming = RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.device(x=0)).incoming()
    # S5: the receiving device has nothing to wait on the send side.
    incoming.wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    incoming.wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    incoming.wait_recv()


def wait_read_on_a_remote_handle(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    handle = RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.neighbour("x")).start()
    # S5: pltpu's wait_read is not part of safedma's handle: wait_send() is the source side.
    handle.wait_read()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle.wait()
