"""S2: a semaphore array where one semaphore belongs (``.at[i]`` forgotten), and
indexing a single semaphore again (docs/catalogue.md).

pltpu today: "Cannot signal on a non-()-shaped semaphore" at trace time on a
start, and only a Mosaic verifier error on a wait-only path. Each expected
error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, RegularSem, RegularSemArray, SemArray, SemRef


def forgot_at_local(x_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    # S2: the whole SemArray as a local copy's semaphore.
    safedma.LocalCopy(x_hbm, buf, sems).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S2: a slice of the array is still an array, not one semaphore.
    safedma.LocalCopy(x_hbm, buf, sems.at[pl.ds(0, 1)]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.LocalCopy(x_hbm, buf, sems.at[0:1]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def forgot_at_wait_only(x_hbm: DataRef, buf: DataRef, sems: SemArray) -> None:
    # S2 on a wait-only path (no Python check in pltpu today).
    safedma.LocalCopy(x_hbm, buf, sems).started_elsewhere().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def forgot_at_remote(
    x_ref: DataRef, o_ref: DataRef, send_sems: SemArray, recv_sems: SemArray
) -> None:
    # S2: arrays as the receive and the send semaphore of a remote copy.
    copy = safedma.RemoteCopy(x_ref, o_ref, recv_sems)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.with_send_sem(send_sems).to(safedma.neighbour("x")).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def forgot_at_regular(flags: RegularSemArray) -> None:
    # S2: a REGULAR semaphore array signalled and waited as if it were one semaphore.
    safedma.signal(flags)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.wait(flags)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.read(flags)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def index_a_single_semaphore(sem: SemRef, flag: RegularSem, sems: SemArray) -> None:
    # S2: indexing a scalar semaphore again: it has no .at ...
    sem.at[0]  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    flag.at[0]  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    sems.at[0].at[0]  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
    # ... and no [...].
    sem[0]  # type: ignore[index]  # pyright: ignore[reportIndexIssue]  # pyrefly: ignore[bad-index]  # ty: ignore[not-subscriptable]


def scratch_array_for_one_semaphore(x_hbm: DataRef, o_hbm: DataRef) -> None:
    def body(sem: SemRef) -> None:
        safedma.LocalCopy(x_hbm, o_hbm, sem).start().wait()

    # S2: run_scoped allocates an array of 2 DMA semaphores for a body that takes one.
    safedma.run_scoped(body, safedma.dma_semaphores(2))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
