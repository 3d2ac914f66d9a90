"""One DMA semaphore shared by copies of different sizes under strict simulation: each
wait takes its own copy's bytes, and a slice never waited is still caught.

The correct kernel must run clean under strict simulation; its broken twin must be
caught, naming the kernel's own line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import LeftoverSemaphoreError, RaceDetectedError, simulate
from tests.support.simulation import F32, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ one DMA semaphore for copies of different sizes


def _slices_through_scratch(
    s_ref: Any, x_ref: Any, cache_ref: Any, o_ref: Any, buf: Any, sem: Any, *, drop: bool
) -> None:
    # A cache update: slices of data-dependent length (0 for padding) staged
    # through VMEM, every copy on ONE semaphore, each waited by its own
    # descriptor; the output aliases the cache it scatters into.
    del o_ref
    copies = []
    for i in range(3):
        length = s_ref[2, i]
        copy = pltpu.make_async_copy(
            x_ref.at[pl.ds(s_ref[1, i], length)], buf.at[i, pl.ds(0, length)], sem
        )
        copy.start()
        copies.append(copy)
    for copy in copies[: 2 if drop else 3]:
        copy.wait()
    copies.clear()
    for i in range(3):
        length = s_ref[2, i]
        copy = pltpu.make_async_copy(
            buf.at[i, pl.ds(0, length)], cache_ref.at[pl.ds(s_ref[0, i], length)], sem
        )
        copy.start()
        copies.append(copy)
    for copy in copies:
        copy.wait()


def _cache_update(drop: bool) -> Any:
    def kernel(*refs: Any) -> None:
        _slices_through_scratch(*refs, drop=drop)

    any_space = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((32, 128), F32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), any_space, any_space],
        out_specs=any_space,
        scratch_shapes=[pltpu.VMEM((3, 8, 128), F32), pltpu.SemaphoreType.DMA],
        input_output_aliases={2: 0},
    )


_SLICES = np.array(
    [[3, 20, 0], [0, 5, 9], [5, 4, 0]], np.int32
)  # cache start, source start, length


def test_slices_of_different_lengths_on_one_semaphore_run_clean() -> None:
    x, cache = example((16, 128)), jnp.zeros((32, 128), F32)
    out = np.asarray(simulate(_cache_update(False), jnp.asarray(_SLICES), x, cache))
    expected = np.zeros((32, 128), np.float32)
    expected[3:8] = np.asarray(x)[0:5]
    expected[20:24] = np.asarray(x)[5:9]
    np.testing.assert_array_equal(out, expected)


def test_a_slice_never_waited_on_the_shared_semaphore_is_caught() -> None:
    # The third slice has length 0: its wait is the one dropped, so nothing is
    # left over; lengths 5 and 4 otherwise.
    slices = _SLICES.copy()
    slices[2, 2] = 3
    with pytest.raises((RaceDetectedError, LeftoverSemaphoreError)) as caught:
        simulate(
            _cache_update(True), jnp.asarray(slices), example((16, 128)), jnp.zeros((32, 128), F32)
        )
    assert line_of(_slices_through_scratch, "x_ref.at[pl.ds(s_ref[1, i], length)]") in str(
        caught.value
    ) or line_of(_slices_through_scratch, "copy.start()") in str(caught.value), str(caught.value)
