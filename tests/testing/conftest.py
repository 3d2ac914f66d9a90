"""Fixtures for the tests of safedma.testing's simulation."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from jax.sharding import Mesh

from safedma.testing import simulated_mesh
from tests.support.simulation import python_threads, threads_left_behind


@pytest.fixture
def no_threads_left_behind() -> Iterator[None]:
    """The test may leave no thread in the interpreter and no simulate worker alive."""
    before = python_threads()
    yield
    left = threads_left_behind(before)
    if left is not None:
        pytest.fail(f"threads left behind: {left}")


@pytest.fixture
def mesh4() -> Mesh:
    return simulated_mesh(4, "x")
