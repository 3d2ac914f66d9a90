"""Every corpus case with a ``sanitize`` verdict, run with the on-chip sanitizer on
(``sd.pallas_call(..., sanitize=...)``, raw kernels routed through it) in TPU interpret
mode on simulated CPU devices, with a short hang bound: a seeded mistake it can see is
its error naming the mistake, a device that makes it and the semaphore; a correct
program runs clean, was instrumented, and gives the outputs of its unsanitized run."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from safedma._sanitize import _sites
from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case, Ok
from tests.tools._verdicts import check

# Raw programs are written as their authors write them, LOGICAL device ids included.
pytestmark = pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")


@pytest.mark.parametrize("case", corpus.params("sanitize"))
def test_sanitize(case: Case) -> None:
    before = _sites.registered()
    out = check(case, "sanitize", _run.sanitize, within=_run.sanitizing)
    verdict = case.expect["sanitize"]
    if not isinstance(verdict, Ok):
        return
    if verdict.report.get("checks") == 0:  # no DMA or semaphore of its own
        assert _sites.registered() == before, f"{case.name}: checks put into it"
    else:
        assert _sites.registered() > before, f"{case.name}: the sanitizer instrumented nothing"
    with _run.unsanitized():
        plain = jax.block_until_ready(_run.execute(case.build()))
    _same(out, plain)


def _same(out: Any, plain: Any) -> None:
    leaves, plain_leaves = jax.tree.leaves(out), jax.tree.leaves(plain)
    assert len(leaves) == len(plain_leaves), (len(leaves), len(plain_leaves))
    for got, want in zip(leaves, plain_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
