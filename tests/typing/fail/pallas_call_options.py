"""safedma.pallas_call's options are one typed declaration: a misspelt or mistyped one fails.

Each expected error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

import safedma
from safedma import DataRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct


def kernel(x_ref: DataRef, o_ref: DataRef) -> None:
    o_ref[...] = x_ref[...]


def misspelt(x: jax.Array) -> None:
    out = ShapeDtype(x.shape, x.dtype)
    safedma.pallas_call(kernel, out, scratch_shape=[])  # type: ignore[call-overload]  # pyright: ignore[reportCallIssue]
    safedma.pallas_call(kernel, out, name=3)  # type: ignore[call-overload]  # pyright: ignore[reportCallIssue, reportArgumentType]
