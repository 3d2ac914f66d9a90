"""Copy options (``safedma/_dma_options.py``): ``sd.priority`` takes 0 or 1 only.

Copies started with a priority from a variable, and ``select_ref``, against their raw
twins: tests/corpus/local_copies.py and tests/corpus/semaphore_arrays.py.
"""

from __future__ import annotations

from typing import Any

import pytest

import safedma as sd


@pytest.mark.parametrize("level", [2, -1, True, 1.0])
def test_priority_outside_0_1_is_caught(level: Any) -> None:
    with pytest.raises(sd.PriorityError):
        sd.priority(level)
