"""One wait sized by the total of several copies under verify: clean when the total
matches, bytes left behind when it falls short.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import SimulationError, verify
from tests.support.hbm_calls import scalar_prefetch_call as _prefetch_call

F32 = jnp.float32
HERE = r"test_wait_sizes\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------ one wait sized by the total of several copies


def _total_wait() -> Any:
    """Three copies of 2 rows each into a 3-row-wide buffer, waited once with a
    descriptor of ``n[0]`` rows (the causal conv's wait: a window wider than the
    buffer, computed at run time; only its size counts)."""

    def kernel(n_ref: Any, x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        for i in range(3):
            pltpu.make_async_copy(x_ref.at[i, pl.ds(0, 2)], buf.at[i, pl.ds(0, 2)], sem).start()
        total = n_ref[0]
        pltpu.make_async_copy(buf.at[0, pl.ds(0, total)], buf.at[0, pl.ds(0, total)], sem).wait()
        o_ref[...] = buf[...]

    def fn(n: Any, x: Any) -> Any:
        return _prefetch_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((3, 3, 128), F32),
            scratch=[pltpu.VMEM((3, 3, 128), F32), pltpu.SemaphoreType.DMA],
            out_specs=pl.BlockSpec((3, 3, 128), lambda *_: (0, 0, 0)),
        )(n, x)

    return fn


def test_one_wait_sized_by_the_total_of_several_copies_is_clean() -> None:
    assert verify(_total_wait(), np.array([6], np.int32), _s(3, 3, 128)).waits == 1


def test_a_total_wait_short_of_the_copies_leaves_bytes_behind() -> None:
    with pytest.raises(SimulationError, match=HERE):
        verify(_total_wait(), np.array([5], np.int32), _s(3, 3, 128))
