"""safedma kernels run in TPU interpret mode on CPU, with exact output checks.

Races are fatal and DMAs execute eagerly (so a copy that never lands would
show up as NaN output).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support import calls
from tests.support import kernels_safedma as sdk
import safedma as sd


def test_local_copy_with_compute() -> None:
    x = calls.example_input((16, 128))
    call = calls.scale_copy_call(sd.checked(sdk.scale_copy), x, calls.strict_interpret())
    np.testing.assert_array_equal(np.asarray(call(x)), np.asarray(x * 2.0 + 1.0))


def test_sliced_copies_with_semaphore_array() -> None:
    x = calls.example_input((16, 128))
    call = calls.reverse_halves_call(sd.checked(sdk.reverse_halves), x, calls.strict_interpret())
    expected = jnp.concatenate([x[8:], x[:8]])
    np.testing.assert_array_equal(np.asarray(call(x)), np.asarray(expected))


@pytest.mark.parametrize("rows", [8, 16, 40])
def test_double_buffered_loop(rows: int) -> None:
    x = calls.example_input((rows, 128))
    call = calls.double_buffered_call(sd.checked(sdk.double_buffered), x, calls.strict_interpret())
    np.testing.assert_array_equal(np.asarray(call(x)), np.asarray(x * 3.0))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_remote_ring_permute_four_devices(dtype: jnp.dtype) -> None:
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    x = jax.device_put(calls.example_input((4 * 8, 128), dtype), NamedSharding(mesh, P("x")))
    ring = calls.ring_permute_call(
        sd.checked(sdk.ring_permute), mesh, interpret=calls.strict_interpret()
    )
    reference = jax.jit(
        jax.shard_map(
            lambda b: jax.lax.ppermute(b, "x", [(i, (i + 1) % 4) for i in range(4)]),
            mesh=mesh,
            in_specs=P("x"),
            out_specs=P("x"),
        )
    )
    np.testing.assert_array_equal(np.asarray(ring(x)), np.asarray(reference(x)))
