"""Test set-up shared by the whole suite.

jax reads the host device count once, when it initialises, so the simulated
mesh size must be fixed here, before any test module imports jax: 8 CPU
devices cover the 1-D meshes of 2, 4 and 8 devices and the 2x4 mesh.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import pytest  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

# The fast lane's list of slow tests, by node id (./dev test --fast).
pytest_plugins = ["tests.support.fast_lane"]


@pytest.fixture(autouse=True)
def _fresh_interpreter() -> object:
    """Reset TPU interpret-mode state after each test, so one failure cannot leak into the next."""
    yield
    pltpu.reset_tpu_interpret_mode_state()
