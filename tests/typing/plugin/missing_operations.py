"""Plugin corpus (S5, S9): operations a copy or handle does not have. The plugin's
sentence replaces mypy's "has no attribute" message; the code stays [attr-defined]. Expectations: ``# expect[code]: message`` above the line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, LocalCopy, RemoteCopy, SemRef


def remote_waits_on_a_local_handle(x: DataRef, buf: DataRef, sem: SemRef) -> None:
    handle = LocalCopy(x, buf, sem).start()
    # expect[attr-defined]: LocalHandle has no wait_send(): a local copy has no send or receive side; call wait()
    handle.wait_send()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # expect[attr-defined]: LocalHandle has no wait_recv(): a local copy has no send or receive side; call wait()
    handle.wait_recv()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # expect[attr-defined]: LocalHandle has no wait_read(): a local copy has no send or receive side; call wait()
    LocalCopy(x, buf, sem).started_elsewhere().wait_read()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    handle.wait()


def wait_a_description(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    local = LocalCopy(x, o, send)
    # expect[attr-defined]: LocalCopy has no wait(): a copy description cannot be waited. Wait the handle that start() returns, or, for a copy started in an earlier iteration or by another device, started_elsewhere()
    local.wait()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    remote = RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.neighbour("x"))
    # expect[attr-defined]: RemoteCopy has no wait(): a copy description cannot be waited. Wait the handle that start() returns, or, for a copy started in an earlier iteration or by another device, started_elsewhere() (or incoming() on the receiving side)
    remote.wait()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # expect[attr-defined]: RemoteCopy has no wait_recv(): a copy description cannot be waited. Wait the handle that start() returns, or, for a copy started in an earlier iteration or by another device, started_elsewhere() (or incoming() on the receiving side)
    remote.wait_recv  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    remote.start().wait()


def send_side_on_the_receiver(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    incoming = RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.device(x=0)).incoming()
    # expect[attr-defined]: IncomingHandle has no wait_send(): the receiving side only has wait_recv(); the send side is waited by the sender
    incoming.wait_send()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    incoming.wait_recv()


def remote_parts_on_a_local_copy(x: DataRef, o: DataRef, sem: SemRef, send: SemRef) -> None:
    # expect[attr-defined]: LocalCopy has no to(): a LocalCopy stays on this device; for a copy to another device use RemoteCopy
    LocalCopy(x, o, sem).to(safedma.neighbour("x"))  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # expect[attr-defined]: LocalCopy has no with_send_sem(): a LocalCopy has one semaphore; for a copy to another device use RemoteCopy
    LocalCopy(x, o, sem).with_send_sem(send)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def other_attributes_are_unchanged(x: DataRef, o: DataRef, sem: SemRef) -> None:
    # Names the plugin knows nothing about keep mypy's own message.
    # expect[attr-defined]: "LocalHandle" has no attribute "wait_twice"
    LocalCopy(x, o, sem).start().wait_twice()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
