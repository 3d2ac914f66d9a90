"""A wait's result is the data ref it protected, never a semaphore.

Using what ``wait()`` returned as the next copy's semaphore is the S6 swap
(data where a semaphore belongs). Each expected error is the
``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, SemRef


def wait_result_as_a_semaphore(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    landed = safedma.LocalCopy(x_hbm, buf, sem).start().wait()
    # S6: the data ref a wait returned, passed as a semaphore.
    safedma.LocalCopy(buf, x_hbm, landed).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
