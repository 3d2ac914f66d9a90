"""Semaphore array declarations (``safedma/_sem_arrays.py``): ``dma_semaphores`` and
``regular_semaphores`` take an int or a tuple and make jax's own scratch types.

Copies and signals on N-D arrays, their raw twins and the indices caught at trace time
are in tests/corpus/semaphore_arrays.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from jax.experimental.pallas import tpu as pltpu

import safedma as sd


def test_declarations_take_an_int_or_a_tuple() -> None:
    assert sd.dma_semaphores(3) == pltpu.SemaphoreType.DMA((3,))
    assert sd.dma_semaphores((2, 3)) == pltpu.SemaphoreType.DMA((2, 3))
    assert sd.regular_semaphores((2, 2)) == pltpu.SemaphoreType.REGULAR((2, 2))
    assert sd.dma_semaphores((2, 3, 4, 5)) == pltpu.SemaphoreType.DMA(
        (2, 3, 4, 5)
    )  # rank 4: SemArray4
    bad_shapes: list[Any] = [0, (2, 0), (), (1, 2, 3, 4, 5), 2.0, True]
    for bad in bad_shapes:
        with pytest.raises(ValueError, match="positive int"):
            sd.dma_semaphores(bad)
