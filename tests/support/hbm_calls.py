"""pallas_calls over HBM operands that several test modules wrap their kernels in, so a
kernel's test says only what differs: its body and its scratch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

ANY = pl.BlockSpec(memory_space=pl.ANY)
STEPS, ROWS, LANES = 4, 8, 128


def one_step_hbm_call(kernel: Callable[..., None], safe: bool, scratch: list[Any]) -> Any:
    """One grid step over a (STEPS * ROWS, LANES) f32 input and output left in HBM, through
    ``sd.pallas_call`` when ``safe`` and jax's own otherwise."""
    entry: Any = sd.pallas_call if safe else pl.pallas_call
    x = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)
    return entry(
        kernel,
        in_specs=[ANY],
        out_specs=ANY,
        out_shape=x,
        grid=(1,),
        scratch_shapes=scratch,
    )


def scalar_prefetch_call(
    kernel: Any,
    *,
    out_shape: Any,
    scratch: list[Any],
    prefetch: int = 1,
    inputs: int = 1,
    out_specs: Any = ANY,
    **options: Any,
) -> Any:
    """``pl.pallas_call`` with ``prefetch`` scalar-prefetch operands and ``inputs`` HBM ones."""
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=prefetch,
            in_specs=[ANY] * inputs,
            out_specs=out_specs,
            scratch_shapes=scratch,
        ),
        out_shape=out_shape,
        **options,
    )
