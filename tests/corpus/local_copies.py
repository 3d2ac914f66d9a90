"""Local copies on one device (HBM <-> VMEM), and their options.

* a copy started with a priority held in a variable (``sd.priority(level)``), for each
  level, against ``start(priority=level)`` (written for this suite).
"""

from __future__ import annotations

from typing import Any

from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._calls import local
from tests.corpus._case import OK, Case


def with_priority(level: int) -> Any:
    def ours(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, o, sem).start(priority=sd.priority(level)).wait()

    return ours


def with_priority_raw(level: int) -> Any:
    def raw(x: Any, o: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, o, sem)
        c.start(priority=level)
        c.wait()

    return raw


def _priority_case(level: int) -> Case:
    return Case(
        f"copy_with_priority_{level}_from_a_variable",
        "local_copies",
        "written for this suite",
        lambda: local(with_priority(level), [sd.dma_semaphore()]),
        {"mosaic": OK},
        twin=lambda: local(with_priority_raw(level), [pltpu.SemaphoreType.DMA(())], checked=False),
    )


CASES: list[Case] = [_priority_case(0), _priority_case(1)]
