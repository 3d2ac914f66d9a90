"""The ``tpu`` marker: tests that need a TPU chip (skipped, with the reason, without one)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tpu: needs a TPU chip; each risky case runs in a subprocess under a timeout"
    )
