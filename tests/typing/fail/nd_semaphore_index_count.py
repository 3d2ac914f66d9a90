"""N-D semaphore arrays indexed with the wrong number of positions, and views misused.

pltpu today: a 2-D array indexed once is a row, which the copy rejects only when
it is traced ("Cannot signal on a non-()-shaped semaphore"); more positions than
the rank fail inside jax's indexer. Each expected error is the ``# type: ignore[code]``
on its line.
"""

from __future__ import annotations

from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, RegularSemArray2, SemArray, SemArray2, SemArray3, SemArray4


def too_few(x_hbm: DataRef, buf: DataRef, sems: SemArray2, sems3: SemArray3) -> None:
    # S2: a row of a 2-D array (or a 3-D array indexed twice) is not one semaphore.
    safedma.LocalCopy(x_hbm, buf, sems.at[0]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.LocalCopy(x_hbm, buf, sems3.at[0, 1]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.LocalCopy(x_hbm, buf, sems.at[pl.ds(0, 1), 0]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def too_many(sems: SemArray, sems2: SemArray2) -> None:
    # S2: more positions than the array's rank.
    sems.at[0, 1]  # type: ignore[call-overload]  # pyright: ignore[reportCallIssue, reportArgumentType]  # pyrefly: ignore[bad-index]  # ty: ignore[invalid-argument-type]
    # (sems2.at[0, 1, i] is rejected too: mypy says [index], pyright reportCallIssue.)
    sems2.at[0]  # fine: a row


def rank4_too_few(x_hbm: DataRef, buf: DataRef, sems4: SemArray4) -> None:
    # S2: three positions of a 4-D array are a row, not one semaphore.
    safedma.LocalCopy(x_hbm, buf, sems4.at[0, 1, 2]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def regular_row(flags: RegularSemArray2) -> None:
    # S2: a row of REGULAR semaphores signalled as one.
    safedma.signal(flags.at[1])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def view_is_not_a_semaphore(x_hbm: DataRef, buf: DataRef) -> None:
    # S6: a view of data is still data, not a semaphore.
    safedma.LocalCopy(x_hbm, buf, x_hbm.reshape(1))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
