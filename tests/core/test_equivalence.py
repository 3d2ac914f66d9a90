"""Zero cost, tested: each safedma kernel lowers to the Mosaic module of its pltpu twin.

Both bodies are put in the same pallas_call and cross-lowered for TPU on the
CPU; the Mosaic texts (locations stripped, kernel names normalised) must be
identical, on both supported jax versions.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.support import calls
from tests.support import kernels_pltpu as twin
from tests.support import kernels_safedma as sdk
import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic

X = jax.ShapeDtypeStruct((32, 128), jnp.float32)
MESH = abstract_mesh((4,), ("x",))
X_SHARDED = jax.ShapeDtypeStruct((4 * 8, 128), jnp.float32, sharding=NamedSharding(MESH, P("x")))

LOCAL_KERNELS: list[tuple[str, Callable[..., object]]] = [
    ("scale_copy", calls.scale_copy_call),
    ("reverse_halves", calls.reverse_halves_call),
    ("double_buffered", calls.double_buffered_call),
]


@pytest.mark.parametrize("name,make_call", LOCAL_KERNELS, ids=[n for n, _ in LOCAL_KERNELS])
def test_local_kernel_matches_its_twin(name: str, make_call: Callable[..., object]) -> None:
    ours = make_call(sd.checked(getattr(sdk, name)), X)
    theirs = make_call(getattr(twin, name), X)
    assert_same_mosaic(ours, theirs, X)  # type: ignore[arg-type]


def test_ring_permute_matches_its_twin() -> None:
    ours = calls.ring_permute_call(sd.checked(sdk.ring_permute), MESH)
    theirs = calls.ring_permute_call(twin.ring_permute, MESH)
    assert_same_mosaic(ours, theirs, X_SHARDED)


def test_pallas_call_wrapper_adds_nothing() -> None:
    """sd.pallas_call lowers like pl.pallas_call with the same body."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def wrapped(x: jax.Array) -> jax.Array:
        return sd.pallas_call(
            sdk.scale_copy,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[calls.HBM],
            out_specs=calls.HBM,
            scratch_shapes=[sd.vmem(x.shape, x.dtype), sd.dma_semaphore()],
        )(x)

    def plain(x: jax.Array) -> jax.Array:
        result: jax.Array = pl.pallas_call(
            twin.scale_copy,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[calls.HBM],
            out_specs=calls.HBM,
            scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())],
        )(x)
        return result

    assert_same_mosaic(wrapped, plain, X)


def test_a_different_body_is_detected() -> None:
    """The comparison is not vacuous: a body with a different constant differs."""
    ours = calls.scale_copy_call(sd.checked(sdk.scale_copy), X)
    theirs = calls.double_buffered_call(twin.double_buffered, X)
    with pytest.raises(AssertionError, match="enqueue_dma"):
        assert_same_mosaic(ours, theirs, X)
