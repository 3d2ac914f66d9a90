"""verify walks the kernels of one shard_map per program: a program with more is refused.

Formerly, a function that ran two ``shard_map``s (two collectives in a row) was
verified on the first one's kernels only: a copy never waited in the second kernel
verified clean. Such a program is now refused with a message naming the shard_maps and
the fix; a program with one shard_map (or none) verifies as before.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import VerificationUnsupportedError, abstract_mesh, verify

F32 = jnp.float32
MESH = abstract_mesh((4,), ("x",))
X = jax.ShapeDtypeStruct((32, 128), F32)


def _copy(*, waited: bool) -> Any:
    def kernel(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        copy.start()
        if waited:
            copy.wait()

    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)
        return out

    return jax.shard_map(per_device, mesh=MESH, in_specs=P("x"), out_specs=P("x"), check_vma=False)


def test_one_shard_map_of_its_own_is_verified() -> None:
    assert verify(_copy(waited=True), X).dmas == 4


def test_two_shard_maps_are_refused_naming_both() -> None:
    first, second = _copy(waited=True), _copy(waited=False)

    def program(x: jax.Array) -> jax.Array:
        y = first(x)  # the first shard_map
        return second(y)  # the second shard_map

    with pytest.raises(VerificationUnsupportedError) as caught:
        verify(program, X)
    text = str(caught.value)
    assert "2 shard_map(s)" in text and "the others would go unchecked" in text, text
    assert text.count("test_one_device_program.py:") >= 2, text
    assert "Verify each shard_map's function on its own" in text, text
    # each one on its own: the second's unwaited copy is found
    verify(first, X)
    with pytest.raises(Exception, match="never waited"):
        verify(second, X)
