"""Pass: DMA priorities given as ``int`` values, the way production kernels pass them on.

A helper that takes ``priority=0`` and forwards it (``def fetch(i, priority=0)``: pyright
types the parameter ``int`` from its default) and a priority chosen at trace time. The
stubs take any ``int``; Mosaic rejects a priority other than 0 and 1, and a non-zero
priority on a remote copy, when the kernel is lowered for a TPU ("only support priority 0
or 1", "non-zero priority is not supported for remote DMA"), and jax rejects a negative
one at trace time.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemRef


def fetch_with_priority(
    x_hbm: DataRef, bufs: DataRef, sems: SemArray, steps: int, urgent: bool
) -> None:
    def fetch(step: int | jax.Array, priority: int = 0) -> None:
        slot = step % 2
        pltpu.make_async_copy(x_hbm.at[pl.ds(step * 8, 8)], bufs.at[slot], sems.at[slot]).start(
            priority=priority
        )

    fetch(0)
    fetch(1, priority=1)
    level = 1 if urgent else 0
    fetch(2, level)
    pltpu.async_copy(x_hbm, bufs.at[0], sems.at[0], priority=level).wait()
    del steps


def send_with_priority(x_ref: DataRef, o_ref: DataRef, send: SemRef, recv: SemRef) -> None:
    def send_to(device: int | jax.Array, priority: int = 0) -> pltpu.RemoteCopyDescriptor:
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=device)
        copy.start(priority=priority)
        return copy

    send_to(1).wait_send()


def mixed_list(copies: list[pltpu.CopyDescriptor], priority: int) -> None:
    for copy in copies:
        copy.start(priority=priority)
    for copy in copies:
        copy.wait()
