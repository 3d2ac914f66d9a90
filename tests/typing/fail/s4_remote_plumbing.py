"""S4: asymmetric remote plumbing (docs/catalogue.md): a send semaphore without a target
device, a device without a send semaphore, a receive semaphore missing, and a
send semaphore or device on a local copy.

pltpu today: a trace-time ValueError for a device without semaphores (0.12),
and a source semaphore on a local copy runs in interpret mode but fails TPU
lowering. RemoteCopy's type parameters record what has been given, so
``start()`` type-checks only on ``RemoteCopy[Given, Given]``. Each expected
error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RemoteCopy, SemRef


def send_sem_without_device(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    # S4: a send semaphore but no target device.
    half = RemoteCopy(x, o, recv).with_send_sem(send)
    half.start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    half.started_elsewhere()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    half.incoming()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def device_without_send_sem(x: DataRef, o: DataRef, recv: SemRef) -> None:
    # S4: a target device but no send semaphore.
    RemoteCopy(x, o, recv).to(safedma.neighbour("x")).start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    RemoteCopy(x, o, recv).to(safedma.device(x=0)).incoming()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def neither(x: DataRef, o: DataRef, recv: SemRef) -> None:
    # S4: a bare remote copy: no send semaphore and no device.
    RemoteCopy(x, o, recv).start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def recv_sem_missing(x: DataRef, o: DataRef, send: SemRef) -> None:
    # S4: no receive semaphore at all.
    RemoteCopy(x, o).with_send_sem(send)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]


def remote_parts_on_a_local_copy(x: DataRef, o: DataRef, sem: SemRef, send: SemRef) -> None:
    # S4: a source (send) semaphore on a local copy: green on CPU, broken on TPU today.
    safedma.LocalCopy(x, o, sem, send)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[bad-argument-count]  # ty: ignore[too-many-positional-arguments]
    safedma.LocalCopy(x, o, sem).with_send_sem(send)  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # S4: a device on a local copy.
    safedma.LocalCopy(x, o, sem).to(safedma.neighbour("x"))  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    safedma.LocalCopy(x, o, sem, device=safedma.neighbour("x"))  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]  # ty: ignore[unknown-argument]
