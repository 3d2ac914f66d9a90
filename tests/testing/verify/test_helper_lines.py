"""A copy issued through a helper under verify: the report names the line that called the
helper, where the user can act.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, verify

F32 = jnp.float32


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------------------- copies issued through a helper


def _helper_issued(drop_second_wait: bool) -> Any:
    """Every copy goes through one helper (``_go``), as production kernels do."""

    def _go(src: Any, dst: Any, sem: Any, wait: bool) -> None:
        copy = pltpu.make_async_copy(src, dst, sem)
        if wait:
            copy.wait()
        else:
            copy.start()

    def kernel(x_ref: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        _go(x_ref.at[0], buf.at[0], sems.at[0], False)
        _go(x_ref.at[1], buf.at[1], sems.at[1], False)
        _go(x_ref.at[0], buf.at[0], sems.at[0], True)
        if not drop_second_wait:
            _go(x_ref.at[1], buf.at[1], sems.at[1], True)
        o_ref[...] = buf[...]

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec((2, 8, 128), lambda: (0, 0, 0)),
            scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
            out_shape=jax.ShapeDtypeStruct((2, 8, 128), F32),
        )(x)

    return fn


def test_a_copy_issued_through_a_helper_names_the_line_that_called_it() -> None:
    assert verify(_helper_issued(False), _s(2, 8, 128)).dmas == 2
    with pytest.raises(RaceDetectedError) as caught:
        verify(_helper_issued(True), _s(2, 8, 128))
    message = str(caught.value)
    # the helper's line is the same for every copy; the caller's line says which one
    assert re.search(
        r"\(_helper_issued\.<locals>\._go, [^()]*called at "
        r"test_helper_lines\.py:\d+",
        message,
    ), message
