"""verify's compiled-body cache is bounded: a process verifying program after program
(a test suite, a benchmark) keeps a fixed number of compiled bodies, not one per
program it ever saw, and a body compiled once is reused while it is kept."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import verify
from safedma.testing._verify.program import compiler

BLOCK = (8, 128)


def _fresh_program() -> Any:
    """A new function object each call: jax traces it anew, so its jaxprs are new."""

    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    return fn


def test_the_compiled_body_cache_keeps_at_most_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "_CACHE", type(compiler._CACHE)())
    monkeypatch.setattr(compiler, "_CACHE_SIZE", 4)
    x = jax.ShapeDtypeStruct(BLOCK, jnp.float32)
    for _ in range(12):
        assert verify(_fresh_program(), x).dmas == 1
        assert len(compiler._CACHE) <= 4


def test_a_program_verified_again_reuses_its_compiled_bodies() -> None:
    program = _fresh_program()
    x = jax.ShapeDtypeStruct(BLOCK, jnp.float32)
    verify(program, x)
    kept = {id(c) for _, c in compiler._CACHE.values()}
    verify(program, x)
    assert kept & {id(c) for _, c in compiler._CACHE.values()}
