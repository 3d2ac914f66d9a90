"""simulate and copies of zero rows.

Scatter kernels issue, per row, a remote copy and a local copy of which one has
length 0 (vLLM's fused-MoE direct write does; ``tests/core/test_row_scatter.py``
has our kernel of that construct). jax's interpreter counts a zero-length
range ``[3:3]`` as overlapping ``[3:4]``, so simulate reported a race between a
copy that moved nothing and the one that wrote the row. A zero-length access
touches no memory: it is neither checked nor recorded.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from safedma.testing import RaceDetectedError, simulate, simulated_mesh
from tests.core import test_row_scatter as scatter

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")

N = 4


def _simulate(kernel: Callable[..., None], safe: bool, x: jax.Array) -> jax.Array:
    """simulate the scatter on N simulated devices, with the tables of ``_tables``."""
    dest, pos, incoming = scatter._tables(N)
    out: jax.Array = simulate(
        scatter._per_device(kernel, safe),
        jnp.asarray(dest),
        jnp.asarray(pos),
        jnp.asarray(incoming),
        x,
        mesh=simulated_mesh(N, "x"),
        in_specs=scatter.SPECS,
        out_specs=P("x"),
    )
    return out


def _expected(x: np.ndarray, dest: np.ndarray, pos: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    rows = x.reshape(N, scatter.ROWS, -1)
    for m in range(N):
        for i in range(scatter.ROWS):
            out[dest[m, i] * scatter.ROWS + pos[m, i]] = rows[m, i]
    return out


@pytest.mark.parametrize("safe", [True, False], ids=["safedma", "raw"])
def test_a_scatter_with_zero_length_copies_simulates_clean_and_right(safe: bool) -> None:
    dest, pos, incoming = scatter._tables(N)
    x = jnp.arange(N * scatter.ROWS * 128, dtype=jnp.float32).reshape(N * scatter.ROWS, 128)
    kernel = scatter._safe_kernel(N) if safe else scatter._raw_kernel(N)
    out = _simulate(kernel, safe, x)
    np.testing.assert_array_equal(np.asarray(out), _expected(np.asarray(x), dest, pos))


def test_a_row_sent_to_the_wrong_position_is_still_a_race() -> None:
    x = jnp.ones((N * scatter.ROWS, 128), jnp.float32)
    with pytest.raises(RaceDetectedError, match="test_row_scatter.py"):
        _simulate(scatter._raw_kernel(N, "row_to_the_wrong_position"), False, x)
