"""Plugin corpus (S4): start(), started_elsewhere() and incoming() on a RemoteCopy in
each of the three half-configured states. mypy's own [misc] stays; the plugin's
sentence follows it. Expectations: ``# expect[code]: message`` above the line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RemoteCopy, SemRef


def send_sem_but_no_device(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    half = RemoteCopy(x, o, recv).with_send_sem(send)
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has a send semaphore but no target device: call .to(device) before .start()
    half.start()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has a send semaphore but no target device: call .to(device) before .started_elsewhere()
    half.started_elsewhere()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has a send semaphore but no target device: call .to(device) before .incoming()
    half.incoming()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def device_but_no_send_sem(x: DataRef, o: DataRef, recv: SemRef) -> None:
    half = RemoteCopy(x, o, recv).to(safedma.neighbour("x"))
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has a target device but no send semaphore: call .with_send_sem(sem) before .start()
    half.start()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has a target device but no send semaphore: call .with_send_sem(sem) before .incoming()
    half.incoming()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def neither(x: DataRef, o: DataRef, recv: SemRef) -> None:
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has no send semaphore and no target device: call .with_send_sem(sem).to(device) before .start() (for a copy on this device, use LocalCopy)
    RemoteCopy(x, o, recv).start().wait()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[misc]
    # expect[safedma-incomplete-copy]: RemoteCopy has no send semaphore and no target device: call .with_send_sem(sem).to(device) before .started_elsewhere() (for a copy on this device, use LocalCopy)
    RemoteCopy(x, o, recv).started_elsewhere().wait_recv()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def complete(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    # Both parts given, in either order: nothing to report.
    RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.neighbour("x")).start().wait()
    RemoteCopy(x, o, recv).to(safedma.neighbour("x")).with_send_sem(send).incoming().wait_recv()
