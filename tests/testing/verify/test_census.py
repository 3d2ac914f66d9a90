"""The census kernels (tests/support/census_kernels.py) under verify.

They use what jax's interpreter cannot run (ref views, DMA futures), so verify
is the only CPU check of their protocol.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import safedma as sd
from safedma.testing import RaceDetectedError, abstract_mesh, verify
from tests.support import census_kernels as ck

X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def test_rpa_prefetch_with_2d_semaphores_and_views_is_clean() -> None:
    steps, num_pages = 3, 16
    call = ck.rpa_call(ck.rpa_prefetch, steps, num_pages, sd.pallas_call, ck.rpa_scratch())
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.integers(0, num_pages, steps * ck.PAGES), jnp.int32)
    pages = jax.ShapeDtypeStruct((num_pages, ck.PAGE_ROWS, ck.LANES), jnp.float32)
    report = verify(call, table, pages)
    assert report.dmas == 15 and report.waits == 15


def test_future_pair_is_clean() -> None:
    assert verify(ck.copy_through_future, X).dmas == 1


def test_chained_futures_are_clean() -> None:
    assert verify(ck.staggered_futures, X).dmas == 4


@pytest.mark.xfail(
    strict=True,
    raises=RaceDetectedError,
    reason="known false alarm: verify's early-signal rule (a contribution unordered with "
    "a semaphore's last wait) fires on one semaphore shared by local copies, sends and "
    "receives and waited by total size, even though nothing is read between the waits",
)
def test_moe_all_to_all_waited_by_size_is_clean() -> None:
    mesh = abstract_mesh((4,), (ck.AXIS,))
    x = jax.ShapeDtypeStruct((4 * 4 * 8, 128), jnp.float32)
    verify(ck.moe_call(ck.moe_all_to_all, mesh, sd.pallas_call), x)
