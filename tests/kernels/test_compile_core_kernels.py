"""Every safedma kernel in the core tests compiles with libtpu's real TPU compiler.

Compile-only: no TPU is needed. The matrix over TPU generations is marked
slow (skip it with -m 'not slow'); CI runs it all.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import pytest

from tests.support import calls
from tests.support import kernels_safedma as sdk
from tests.support.kernel_params import TOPOLOGIES
import safedma as sd
from safedma.testing import compile_for_tpu

BLOCK = (8 * 4, 128)


def _per_device(
    make_call: Callable[..., Callable[[jax.Array], jax.Array]], body: Callable[..., None]
) -> Callable[[jax.Array], jax.Array]:
    def run(block: jax.Array) -> jax.Array:
        return make_call(sd.checked(body), jax.ShapeDtypeStruct(block.shape, block.dtype))(block)

    run.__name__ = body.__name__
    return run


def _ring(body: Callable[..., None]) -> Callable[[jax.Array], jax.Array]:
    def run(block: jax.Array) -> jax.Array:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        result: jax.Array = pl.pallas_call(
            sd.checked(body),
            out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[calls.HBM],
            out_specs=calls.HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        )(block)
        return result

    run.__name__ = body.__name__
    return run


KERNELS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "scale_copy": _per_device(calls.scale_copy_call, sdk.scale_copy),
    "reverse_halves": _per_device(calls.reverse_halves_call, sdk.reverse_halves),
    "double_buffered": _per_device(calls.double_buffered_call, sdk.double_buffered),
    "ring_permute": _ring(sdk.ring_permute),
}


def _global_input(devices: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((BLOCK[0] * devices, BLOCK[1]), jnp.float32)


def test_kernels_compile_for_v6e() -> None:
    for name, fn in KERNELS.items():
        report = compile_for_tpu(fn, _global_input(4), topology="v6e:2x2")
        assert report.generated_code_size_in_bytes > 0, name
        assert report.num_devices == 4


@pytest.mark.slow
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_compiles_for_each_generation(name: str, topology: str) -> None:
    report = compile_for_tpu(KERNELS[name], _global_input(4), topology=topology)
    assert report.topology == topology
    assert report.generated_code_size_in_bytes > 0
