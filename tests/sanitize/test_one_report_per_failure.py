"""A sanitized kernel that fails on several devices under ``jax.jit`` gives one report: the
error, raised once, with the other devices' reports listed in it, and no "jax.debug.callback
failed" traceback logged per device."""

from __future__ import annotations

import logging
from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import LeftoverSemaphoreError
from tests.sanitize.helpers import example, hbm_call, on_mesh

DEVICES = 4


def every_device_leaves_a_signal(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_signal(reg, 1)


def test_a_mistake_on_every_device_is_one_report_without_callback_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = hbm_call(every_device_leaves_a_signal, [pltpu.SemaphoreType.REGULAR])
    program = on_mesh(lambda x: call(x), DEVICES)
    with caplog.at_level(logging.ERROR), pytest.raises(LeftoverSemaphoreError) as caught:
        with sd.sanitizer_errors():
            jax.block_until_ready(program(example((DEVICES * 8, 128))))
    logged = [r for r in caplog.records if "callback failed" in r.getMessage()]
    assert not logged, [r.getMessage() for r in logged]
    text = str(caught.value)
    assert text.count("semaphore not back to zero") == 1 + (DEVICES - 1), text
    assert f"(and {DEVICES - 1} more sanitizer report(s)" in text
    assert text.count("LeftoverSemaphoreError: semaphore not back to zero (R2) on device") == 3
