"""DMA futures across pallas_calls (``safedma/_futures.py``), beyond the corpus verdicts.

``start_async`` / ``finish_async`` build the raw pair of pallas_calls (semaphore as an
output, source and buffer aliased). The kernels, their raw twins and the seeded
mistakes (a future dropped, finished twice, started with no copy or finished with no
wait) are in tests/corpus/futures.py; here: the aliases of the pair, the listing of
futures dropped at one site, and a future handed on through a function's result.
"""

from __future__ import annotations

import jax
import pytest

import safedma as sd
from safedma.testing import mosaic_kernels
from tests.corpus._calls import X, trace
from tests.corpus.futures import DST, copy_through_future, future_done, future_start


def test_the_pair_aliases_source_and_buffer() -> None:
    start, done = mosaic_kernels(copy_through_future, X)
    assert "operand_index = 0" in start.aliases
    assert "operand_index = 1" in done.aliases


def test_futures_dropped_at_one_site_are_one_line_with_their_count() -> None:
    @sd.checked_futures
    def dropped(x: jax.Array) -> jax.Array:
        for _ in range(3):
            sd.start_async(future_start, x, dst=DST)  # LOOP
        sd.start_async(future_start, x, dst=DST)  # ONCE
        return x

    with pytest.raises(sd.FutureDroppedError) as err:
        trace(dropped)
    listed = [row for row in str(err.value).splitlines() if row.startswith("  - ")]
    assert len(listed) == 2, listed
    assert listed[0].startswith("  - 3 futures of future_start, started at "), listed
    assert listed[1].startswith("  - future_start, started at "), listed
    assert "4 DMA future(s) were started" in str(err.value)


def test_a_returned_future_is_handed_on_not_dropped() -> None:
    @sd.checked_futures
    def start_only(x: jax.Array) -> sd.DmaFuture:
        return sd.start_async(future_start, x, dst=DST)

    @sd.checked_futures
    def finish_only(future: sd.DmaFuture) -> jax.Array:
        return sd.finish_async(future_done, future)

    future = jax.eval_shape(start_only, X)
    assert isinstance(future, sd.DmaFuture)
    trace(finish_only, future)
