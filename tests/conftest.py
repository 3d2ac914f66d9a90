"""Test set-up shared by the whole suite.

The simulated devices come from safedma's own pytest plugin
(``safedma_devices = 8`` in pyproject.toml: 8 CPU devices cover the 1-D
meshes of 2, 4 and 8 devices and the 2x4 mesh). Installed, safedma registers
the plugin itself; the line below also loads it from a checkout on
``PYTHONPATH`` whose installed metadata predates the plugin (the same module,
so never twice).
"""

import pytest
from jax.experimental.pallas import tpu as pltpu

pytest_plugins = ["safedma.pytest_plugin"]

# The fast lane's list of slow tests, by node id (./dev test --fast).
pytest_plugins = ["tests.support.fast_lane"]


@pytest.fixture(autouse=True)
def _fresh_interpreter() -> object:
    """Reset TPU interpret-mode state after each test, so one failure cannot leak into the next."""
    yield
    pltpu.reset_tpu_interpret_mode_state()
