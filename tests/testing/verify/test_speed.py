"""The speed structures of verify's engine compute what the plain versions computed.

Each fast path here replaces a general computation on the hot path; these tests pin
it to the general one (or to a verdict) so that speed never changes an answer.
"""

from __future__ import annotations

import numpy as np

from safedma.testing._verify._clocks import learned


def _learned_by_sorting(clocks: list[np.ndarray], amounts: list[int], need: int) -> np.ndarray:
    """The definition: per column, sort by clock and take the clock where the sum reaches need."""
    m = np.stack(clocks)
    out = np.empty(m.shape[1], dtype=np.int64)
    for q in range(m.shape[1]):
        order = sorted(range(len(clocks)), key=lambda i: (m[i, q], i))
        total = 0
        for i in order:
            total += amounts[i]
            if total >= need:
                out[q] = m[i, q]
                break
    return out


def test_learned_matches_its_definition_on_every_shape_of_wait() -> None:
    rng = np.random.default_rng(14)
    cases = 0
    for _ in range(600):
        n = int(rng.integers(1, 6))
        width = int(rng.integers(1, 7))
        clocks = [rng.integers(0, 5, size=width).astype(np.int64) for _ in range(n)]
        amounts = [int(a) for a in rng.choice([1, 2, 4, 8], size=n)]
        need = int(rng.integers(1, sum(amounts) + 1))
        got = learned(clocks, amounts, need)
        assert np.array_equal(got, _learned_by_sorting(clocks, amounts, need)), (
            clocks,
            amounts,
            need,
        )
        cases += 1
    assert cases == 600


def test_learned_does_not_write_into_the_contributions_clocks() -> None:
    a = np.array([3, 1, 2], dtype=np.int64)
    b = np.array([1, 4, 2], dtype=np.int64)
    low = learned([a, b], [4, 4], 4)  # either copy suffices: the minimum
    high = learned([a, b], [4, 4], 8)  # both are needed: the maximum
    assert low.tolist() == [1, 1, 2] and high.tolist() == [3, 4, 2]
    assert a.tolist() == [3, 1, 2] and b.tolist() == [1, 4, 2]
