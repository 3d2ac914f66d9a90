"""The README's "Testing your kernels" example, verbatim in spirit: three checks per kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support import calls
from tests.support import kernels_pltpu as twin
from tests.support import kernels_safedma as sdk
import safedma as sd
from safedma.testing import (
    abstract_mesh,
    assert_same_mosaic,
    compile_for_tpu,
    simulate,
    simulated_mesh,
)


def ring(block: jax.Array) -> jax.Array:
    """The per-device body: a safedma ring permute along "x"."""
    return sd.pallas_call(
        sdk.ring_permute,
        jax.ShapeDtypeStruct(block.shape, block.dtype),
        in_specs=[calls.HBM],
        out_specs=calls.HBM,
        scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
    )(block)


def test_three_lines_per_kernel() -> None:
    x = jnp.arange(8 * 8 * 128, dtype=jnp.float32).reshape(8 * 8, 128)

    out = simulate(
        ring,
        x,
        mesh=simulated_mesh((2, 4), ("y", "x")),
        in_specs=P(("y", "x")),
        out_specs=P(("y", "x")),
    )
    compile_for_tpu(ring, jax.ShapeDtypeStruct(x.shape, x.dtype), topology="v6e:4x4")
    mesh = abstract_mesh((4,), ("x",))
    spec = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    assert_same_mosaic(
        calls.ring_permute_call(sd.checked(sdk.ring_permute), mesh),
        calls.ring_permute_call(twin.ring_permute, mesh),
        spec,
    )

    # Along "x" inside each row of 4: block (y, x) moves to (y, x + 1 mod 4).
    blocks = np.asarray(x).reshape(2, 4, 8, 128)
    np.testing.assert_array_equal(np.asarray(out).reshape(2, 4, 8, 128), np.roll(blocks, 1, axis=1))
