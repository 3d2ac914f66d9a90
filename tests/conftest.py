"""Test set-up shared by the whole suite.

The simulated devices come from safedma's own pytest plugin
(``safedma_devices = 8`` in pyproject.toml: 8 CPU devices cover the 1-D
meshes of 2, 4 and 8 devices and the 2x4 mesh). Installed, safedma registers
the plugin itself; the line below also loads it from a checkout on
``PYTHONPATH`` whose installed metadata predates the plugin (the same module,
so never twice).
"""

import os

import pytest
from jax.experimental.pallas import tpu as pltpu

# verify's lockstep path is cross-checked by every verify call of the suite: where it
# proves a program, the per-device walk runs too and must agree (tests that pin a mode
# set the variable themselves).
os.environ.setdefault("SAFEDMA_VERIFY_LOCKSTEP", "check")

# safedma's own plugin, and the fast lane's list of slow tests by node id (./dev test
# --fast). (One list: a second assignment would drop the first.)
pytest_plugins = ["safedma.pytest_plugin", "tests.support.fast_lane"]


@pytest.fixture(autouse=True)
def _fresh_interpreter() -> object:
    """Reset TPU interpret-mode state after each test, so one failure cannot leak into the next."""
    yield
    pltpu.reset_tpu_interpret_mode_state()
