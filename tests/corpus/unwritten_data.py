"""Data nothing wrote: staging buffers sent before they are filled, garbage a copy
brings, outputs left partly unwritten.

* R6, a VMEM staging buffer sent to the right neighbour before anything wrote it
  (written for this suite).
"""

from __future__ import annotations

from typing import Any

from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import ALL, AXIS, Pair, block, caught, dma, send_right
from tests.corpus._case import Case

D = sd.DataRef
S = sd.SemRef


def r6_unwritten_staging_pltpu(
    x_ref: Any, o_ref: Any, stage: Any, send: Any, recv: Any, local: Any, *, bug: bool
) -> None:
    """Sends the VMEM staging buffer to the right neighbour; in the bug nothing wrote it."""
    if not bug:
        fill = pltpu.make_async_copy(x_ref, stage, local)
        fill.start()
        fill.wait()
    send_right(stage, o_ref, send, recv)


def r6_unwritten_staging_safedma(
    x_ref: D, o_ref: D, stage: D, send: S, recv: S, local: S, *, bug: bool
) -> None:
    if not bug:  # the bug sends the staging buffer nothing wrote
        sd.LocalCopy(x_ref, stage, local).start().wait()
    copy = sd.RemoteCopy(stage, o_ref, recv).with_send_sem(send)  # fix: r6_unwritten_staging
    copy.to(sd.neighbour(AXIS)).start().wait()  # fix: r6_unwritten_staging


PAIRS = (
    Pair(
        "r6_unwritten_staging",
        "R6",
        "silent",
        lambda: [block(), *dma(3)],
        r6_unwritten_staging_safedma,
        r6_unwritten_staging_pltpu,
        caught(
            r"Race|Unwritten|Uninit|NeverWritten|Unset",
            r"(?i)never written|nothing (ever )?wr|unwritten|uninitiali[sz]ed|not written",
            ALL,
            ("stage",),
            r"(?i)writ|copy",
        ),
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("unwritten_data")]
