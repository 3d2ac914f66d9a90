"""An array of PRNG keys as a kernel operand under verify: an extended dtype with no host
values, copied and read like any other operand.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, verify

HERE = r"test_prng_keys\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)


# ---------------------------------------------------------------- PRNG key operand


def _copy_keys(*, wait: bool) -> Any:
    """Copy an array of PRNG keys (an extended dtype) through VMEM."""

    def kernel(k_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(k_ref, buf, sem)
        copy.start()
        if wait:
            copy.wait()
        pltpu.sync_copy(buf, o_ref)

    def fn(keys: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(keys.shape, keys.dtype),
            scratch_shapes=[pltpu.VMEM(keys.shape, keys.dtype), pltpu.SemaphoreType.DMA],
        )(keys)

    return fn


def test_an_array_of_prng_keys_is_an_operand_without_host_values() -> None:
    keys = jax.random.split(jax.random.key(0), 8)
    assert verify(_copy_keys(wait=True), keys).dmas == 2


def test_a_prng_key_copy_read_before_its_wait_is_caught() -> None:
    keys = jax.random.split(jax.random.key(0), 8)
    with pytest.raises(RaceDetectedError, match=HERE):
        verify(_copy_keys(wait=False), keys)
