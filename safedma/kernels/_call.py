"""The ``sd.pallas_call`` the HBM-input kernels of safedma.kernels make, written once.

Each kernel binds its static parameters (axis, shift, ...) to its body with
``functools.partial``; ``update_wrapper`` keeps the body's name, which
safedma's error messages show ("partial" otherwise). What is traced, and so
the Mosaic module, is the same as spelling the call out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

__all__ = ["HBM", "hbm_call"]

HBM = pl.BlockSpec(memory_space=pl.ANY)
"""A whole operand left in HBM: the kernel moves it with DMAs."""


def hbm_call(
    kernel: Callable[..., None],
    out_shape: jax.ShapeDtypeStruct,
    *,
    scratch_shapes: Sequence[object],
    name: str,
    interpret: bool | pltpu.InterpretParams,
    collective_id: int | None = None,
    out_specs: pl.BlockSpec = HBM,
    **params: object,
) -> Callable[[jax.Array], jax.Array]:
    """``sd.pallas_call`` of ``kernel`` with ``params`` bound, its one input in HBM.

    ``collective_id`` names the barrier semaphore; None passes no compiler
    parameters (jax's default).
    """
    body = functools.update_wrapper(functools.partial(kernel, **params), kernel)
    compiler_params = (
        None if collective_id is None else pltpu.CompilerParams(collective_id=collective_id)
    )
    return sd.pallas_call(
        body,
        out_shape,
        in_specs=[HBM],
        out_specs=out_specs,
        scratch_shapes=scratch_shapes,
        compiler_params=compiler_params,
        interpret=interpret,
        name=name,
    )
