"""Every single-chip kernel and DMA pattern safedma supports, run on a TPU chip.

Each case (tests/tpu/lane_kernels.py) runs on the chip and under
``safedma.testing.simulate`` on the host CPU in this process; both outputs must
equal numpy's, and ``safedma.testing.verify`` must prove the kernel's protocol.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.tpu import _chip
from tests.tpu.lane_kernels import CASES

pytestmark = pytest.mark.tpu


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_on_chip_matches_numpy_and_simulation(name: str, tpu: Any) -> None:
    case = CASES[name]()
    done = _chip.check_on_chip(
        case.fn, *case.args, want=case.want, device=tpu, simulate_limit=case.simulate_limit
    )
    print(f"{name}: chip output right; {done}")
