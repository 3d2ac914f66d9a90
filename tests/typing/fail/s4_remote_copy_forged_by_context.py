"""S4 through an expected type: a bare RemoteCopy cannot pose as a configured one.

``RemoteCopy.__init__`` pins a new copy to ``RemoteCopy[Missing, Missing]``,
so a helper's return annotation or an annotated variable cannot make mypy
infer ``[Given, Given]`` for a copy with no send semaphore and no device.
"""

from __future__ import annotations

from safedma import DataRef, Given, RemoteCopy, SemRef


def hop(src: DataRef, dst: DataRef, recv: SemRef) -> RemoteCopy[Given, Given]:
    # S4: no .with_send_sem(...), no .to(...), but the return annotation claims both.
    return RemoteCopy(src, dst, recv)  # type: ignore[return-value]  # pyright: ignore[reportReturnType]  # pyrefly: ignore[bad-return]  # ty: ignore[invalid-explicit-return]


def annotated(src: DataRef, dst: DataRef, recv: SemRef) -> None:
    # S4: the same through an annotated variable.
    copy: RemoteCopy[Given, Given] = RemoteCopy(src, dst, recv)  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]  # pyrefly: ignore[bad-assignment]  # ty: ignore[invalid-assignment]
    copy.start().wait()
    hop(src, dst, recv).start().wait()
