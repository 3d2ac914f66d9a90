"""A typed wrapper for a jax function that jax leaves partly unannotated.

    python examples/typed_jax.py

pyright strict reports every use of a function with an unannotated parameter
(reportUnknownMemberType), even a correct one; mypy has no such check. Wrap each such
function a kernel needs once, with the suppression in one place, and call the wrapper.
The getting-started page of the manual shows the wrapper; ``mypy --strict`` and pyright
strict accept this file.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Callable  # noqa: E402
from typing import TypeVar, cast  # noqa: E402

import jax  # noqa: E402

C = TypeVar("C")


# --8<-- [start:fori_loop]
def fori_loop(
    lower: int | jax.Array,
    upper: int | jax.Array,
    body: Callable[[jax.Array, C], C],
    init: C,
) -> C:
    """jax.lax.fori_loop with its types: pyright strict reports each use of jax's own."""
    result = jax.lax.fori_loop(lower, upper, body, init)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast(C, result)
    # --8<-- [end:fori_loop]


def main() -> None:
    total = fori_loop(0, 4, lambda i, acc: acc + i, jax.numpy.int32(0))
    print("fori_loop: 0 + 1 + 2 + 3 =", int(total))


if __name__ == "__main__":
    main()
