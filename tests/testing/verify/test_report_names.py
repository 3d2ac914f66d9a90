"""Names in verify's reports: a ``functools.partial`` kernel is named by its function, and
the operands of pytree parameters keep their names.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import UnwrittenReadError, verify

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((16, 128), F32)


# * Buffer names in messages: a kernel whose parameters are pytrees (megablox gmm's
#   ``group_metadata`` tuple, its ``existing_out=None`` that has no operand) was named
#   from its ``def`` line, one name per parameter, so every later operand took its
#   neighbour's name (gmm's output was called ``acc_scratch``). jax's own names of the
#   operands (``group_metadata[0]``, ...) are kept unless they are a forwarded *args.
def _pair_kernel(pair: Any, o_ref: Any, sem: Any) -> None:
    first, _ = pair
    copy = pltpu.make_async_copy(first.at[0:8], o_ref.at[0:8], sem)  # rows 0:8 only
    copy.start()
    copy.wait()


def test_operands_of_pytree_parameters_keep_their_names() -> None:
    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            _pair_kernel,
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
            in_specs=[(ANY, ANY)],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )((x, x))
        return out

    with pytest.raises(UnwrittenReadError) as caught:
        verify(fn, X)
    text = str(caught.value)
    assert "nothing wrote o_ref[8:16, 0:128]" in text, text


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------------------------ a partial kernel's name


def test_a_partial_kernel_is_named_by_its_function() -> None:
    def copy_rows(x_ref: Any, o_ref: Any, sem: Any, *, rows: int) -> None:
        copy = pltpu.make_async_copy(x_ref.at[pl.ds(0, rows)], o_ref.at[pl.ds(0, rows)], sem)
        copy.start()
        copy.wait()

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            functools.partial(copy_rows, rows=8),
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=_s(8, 128),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)

    assert verify(fn, _s(8, 128)).kernels == ("copy_rows",)
