"""What verify's report says of the kernels it ran (``VerifyReport.kernels``): kernels
that share a name are each listed by their line; one kernel called twice from one line
is listed once."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from safedma.testing import verify

X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def _double(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2


def test_kernels_with_one_name_are_each_listed_by_line() -> None:
    def fn(x: Any) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        y = pl.pallas_call(_double, out_shape=out)(x)
        return pl.pallas_call(_double, out_shape=out)(y)

    report = verify(fn, X)
    assert len(report.kernels) == 2
    assert all(k.startswith("_double (") and "test_report.py:" in k for k in report.kernels)


def test_one_kernel_called_twice_from_one_line_is_listed_once() -> None:
    def fn(x: Any) -> Any:
        for _ in range(2):
            x = pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return x

    assert verify(fn, X).kernels == ("_double",)
