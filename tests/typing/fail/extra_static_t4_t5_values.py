"""Beyond the S-rows: trace-time rows (docs/catalogue.md T4, and T5's non-bool ``add``) that
safedma's signatures also reject statically, and a *data* value where a data ref belongs (the S1
mistake made with data). Each expected error is the ``# type: ignore[code]``
on its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RegularSem, SemRef


def priorities(x: DataRef, o: DataRef, sem: SemRef, send: SemRef) -> None:
    # T4: priority outside {0, 1} on a local copy.
    safedma.LocalCopy(x, o, sem).start(priority=2).wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # T4: non-zero priority on a remote copy.
    copy = safedma.RemoteCopy(x, o, sem).with_send_sem(send).to(safedma.neighbour("x"))
    copy.start(priority=1).wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def accumulate(x: DataRef, o: DataRef, sem: SemRef) -> None:
    # T5 is trace time only for local copies: add=True lowers on SparseCore (a scatter-add
    # into o.at[indices]), so the signature takes a bool.
    # A non-bool is still a static error.
    safedma.LocalCopy(x, o, sem).start(add=1.0).wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def data_value_for_data_ref(x: DataRef, o: DataRef, sem: SemRef) -> None:
    # S1 with data: x[...] reads the values; a copy needs the ref (or a view, x.at[...]).
    safedma.LocalCopy(x[...], o, sem).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.LocalCopy(x, o[0], sem).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def float_amounts(flag: RegularSem) -> None:
    # Extra (no docs/catalogue.md row): semaphore counts are integers, not floats.
    safedma.signal(flag, 1.5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.wait(flag, 0.5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
