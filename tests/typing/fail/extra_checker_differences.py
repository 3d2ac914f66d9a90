"""Cases where the five checkers (mypy, pyright, basedpyright, pyrefly, ty) disagree.

Each case is decided in docs/type-checkers.md (D1-D3 here; D4 is the seed's
``pl.semaphore_read`` line in s1_semaphore_value.py) and written with the
expectations of exactly the checkers that report it. tests/typing/test_corpus.py
lists these lines (DISAGREEMENTS), so a checker that starts (or stops) agreeing
fails the suite and the decision gets revisited.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RemoteCopy, SemRef


def rebind_one_variable(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    # Extra (D1, mypy only): correct code. mypy fixes a variable's type at its first
    # assignment: rebinding `copy` to each builder step is an [assignment] error ...
    copy = RemoteCopy(x, o, recv)
    copy = copy.with_send_sem(send)  # type: ignore[assignment]
    copy = copy.to(safedma.neighbour("x"))  # type: ignore[assignment]
    # Extra (D1): ... and start() sees RemoteCopy[Missing, Missing]. pyright re-infers.
    copy.start().wait()  # type: ignore[misc]


def priority_from_a_variable(x: DataRef, o: DataRef, sem: SemRef) -> None:
    # Extra (D2, mypy only): correct code. mypy infers `int` for `slot = 1` and int is not
    # Literal[0, 1]; pyright narrows `slot` to Literal[1].
    slot = 1
    safedma.LocalCopy(x, o, sem).start(priority=slot).wait()  # type: ignore[arg-type]


def handle_of_a_half_configured_copy(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    # S4 (D3): both report the start() of a copy with no target device; pyright strict also
    # reports every later use of its result (Unknown), mypy types the result as RemoteHandle.
    handle = RemoteCopy(x, o, recv).with_send_sem(send).start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    handle.wait()  # pyright: ignore[reportUnknownMemberType]
