"""safedma's entry points declare their options once, typed: a misspelt or mistyped one fails.

Shown on ``safedma.core_kernel`` (``safedma.pallas_call`` takes the same kind
of declaration, ``PallasCallOptions``). Each expected error is the
``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

import safedma
from safedma import DataRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct


def kernel(x_ref: DataRef, o_ref: DataRef) -> None:
    o_ref[...] = x_ref[...]


def misspelt(x: jax.Array, mesh: object) -> None:
    out = ShapeDtype(x.shape, x.dtype)
    # Extra: an option pl.kernel does not have (scratch_types is the name) ...
    safedma.core_kernel(kernel, out, mesh=mesh, scratch_shapes=[])  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]
    # Extra: ... and one of the wrong type.
    safedma.core_kernel(kernel, out, mesh=mesh, name=3)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
