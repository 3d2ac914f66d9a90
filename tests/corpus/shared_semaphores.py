"""Aggregate waits on a shared semaphore: several copies on one DMA semaphore, waited one
by one (each wait may count another copy's bytes) or once by their total.

* R9, two same-sized local copies on one semaphore, each waited before its chunk is
  read; the fix waits both at once (written for this suite);
* the early wait of MoE all-to-alls: one semaphore counts a local fetch and the left
  neighbour's incoming copy, so the local wait can return on the neighbour's bytes (the
  protocol of vLLM tpu-inference's and tokamax's fused MoE).
"""

from __future__ import annotations

from typing import Any

from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import (
    ALL,
    AXIS,
    RACE,
    Pair,
    block,
    caught,
    chunks,
    dma,
    first,
    neighbour,
    read_chunks,
    second,
    write_out,
)
from tests.corpus._case import Case

D = sd.DataRef
S = sd.SemRef

# ---------------------------------------------------------------- R9: shared semaphore


def r9_shared_sem_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """Two same-sized copies on one semaphore; the bug's first wait may count the second's
    bytes, the fix waits both at once before either chunk is read."""
    a = pltpu.make_async_copy(first(x_ref), bufs.at[0], sem)
    b = pltpu.make_async_copy(second(x_ref), bufs.at[1], sem)
    a.start()
    b.start()
    if bug:
        read_chunks(a.wait, b.wait, bufs, res)
    else:
        read_chunks(pltpu.make_async_copy(bufs, bufs, sem).wait, lambda: None, bufs, res)
    write_out(res, o_ref, out_sem)


def r9_shared_sem_safedma(
    x_ref: D, o_ref: D, bufs: D, res: D, sem: S, out_sem: S, *, bug: bool
) -> None:
    a = sd.LocalCopy(first(x_ref), bufs.at[0], sem).start()
    b = sd.LocalCopy(second(x_ref), bufs.at[1], sem).start()
    if bug:  # two same-sized copies on one semaphore: a's wait may count b's bytes
        read_chunks(a.wait, b.wait, bufs, res)
    else:
        read_chunks(lambda: sd.wait_all_into(bufs, sem), lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


# ---------------------------------------------------------------- the early wait


def early_wait_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, send: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """``sem`` counts a local fetch and the left neighbour's incoming copy (MoE style).

    The bug's local wait returns as soon as 4 KiB arrived: the neighbour's bytes
    satisfy it as well as the local copy's. The fix waits the total first.
    """
    local = pltpu.make_async_copy(first(x_ref), bufs.at[0], sem)
    local.start()
    remote = pltpu.make_async_remote_copy(
        second(x_ref), bufs.at[1], send, sem, device_id=neighbour(1)
    )
    remote.start()

    def both() -> None:
        pltpu.make_async_copy(bufs, bufs, sem).wait()
        remote.wait_send()

    if bug:
        read_chunks(local.wait, remote.wait, bufs, res)
    else:
        read_chunks(both, lambda: None, bufs, res)
    write_out(res, o_ref, out_sem)


def early_wait_safedma(
    x_ref: D, o_ref: D, bufs: D, res: D, send: S, sem: S, out_sem: S, *, bug: bool
) -> None:
    local = sd.LocalCopy(first(x_ref), bufs.at[0], sem).start()
    remote = (
        sd.RemoteCopy(second(x_ref), bufs.at[1], sem)
        .with_send_sem(send)
        .to(sd.neighbour(AXIS))
        .start()
    )

    def both() -> None:  # the local fetch and the neighbour's copy: all 8 KiB
        sd.wait_all_into(bufs, sem)
        remote.wait_send()

    if bug:  # sem counts both copies: the local wait returns on the neighbour's bytes
        read_chunks(local.wait, remote.wait, bufs, res)
    else:
        read_chunks(both, lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


_SHARED_FIX = r"(?i)wait_all_into|separate|own semaphore|total|all"

PAIRS = (
    Pair(
        "r9_shared_sem",
        "R9",
        "silent",
        lambda: [chunks(), block(), *dma(2)],
        r9_shared_sem_safedma,
        r9_shared_sem_pltpu,
        caught(RACE, r"(?i)race|not ordered|before", ALL, ("bufs", "sem"), _SHARED_FIX),
    ),
    # Depends on the schedule under simulate: it orders a wait after the signals it
    # consumes in arrival order, so the bug is seen only when the neighbour's copy lands
    # before the local one (device threads race for that).
    Pair(
        "early_wait",
        "R9",
        "silent",
        lambda: [chunks(), block(), *dma(3)],
        early_wait_safedma,
        early_wait_pltpu,
        caught(RACE, r"(?i)race|not ordered|before", ALL, ("bufs", "sem"), _SHARED_FIX),
        provenance="vLLM tpu-inference and tokamax fused MoE (a local fetch and a neighbour's copy on one semaphore)",
        simulate_bug=None,
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("shared_semaphores")]
