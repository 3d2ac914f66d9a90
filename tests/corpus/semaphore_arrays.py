"""N-D semaphore arrays and ref views: a semaphore chosen by index, per slot or per device.

* R5, a static index past the array, and an index per device that runs past it on
  devices 2 and 3 (written for this suite).
"""

from __future__ import annotations

from typing import Any

from jax import lax
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import ALL, AXIS, Pair, caught
from tests.corpus._case import Case, Raises

D = sd.DataRef

# ---------------------------------------------------------------- R5: semaphore index


def r5_static_pltpu(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """``sems`` holds two DMA semaphores; the bug's copy uses a third."""
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[2 if bug else 1])  # fix: r5_static
    c.start()  # fix: r5_static
    c.wait()  # fix: r5_static


def r5_static_safedma(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    sd.LocalCopy(x_ref, o_ref, sems.at[2 if bug else 1]).start().wait()  # fix: r5_static


def r5_per_device_pltpu(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """The bug takes one semaphore per device index: out of range on devices 2 and 3."""
    me = lax.axis_index(AXIS)
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[me if bug else me % 2])  # fix: r5_per_device
    c.start()  # fix: r5_per_device
    c.wait()  # fix: r5_per_device


def r5_per_device_safedma(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    me = sd.my_index(AXIS)
    slot = me if bug else me % 2
    sd.LocalCopy(x_ref, o_ref, sems.at[slot]).start().wait()  # fix: r5_per_device


PAIRS = (
    Pair(
        "r5_static",
        "R5",
        "silent",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        r5_static_safedma,
        r5_static_pltpu,
        caught(
            r"Range|Bounds|Index",
            r"(?i)out of (range|bounds)|outside",
            ALL,
            ("sems",),
            r"(?i)dma_semaphores\(3\)|index|semaphores",
        ),
        simulate_bug="KernelFailedError",
        # A static index outside the array is rejected when the copy is described.
        trace_bug=Raises("^SemaphoreIndexError$", exact=True, line=False),
    ),
    Pair(
        "r5_per_device",
        "R5",
        "silent",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        r5_per_device_safedma,
        r5_per_device_pltpu,
        caught(
            r"Range|Bounds|Index",
            r"(?i)out of (range|bounds)|outside",
            ("x=2", "x=3"),
            ("sems",),
            r"(?i)dma_semaphores\(4\)|index|semaphores",
        ),
        simulate_bug="KernelFailedError",
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("semaphore_arrays")]
