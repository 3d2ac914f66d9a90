"""Unsuppressed errors: the test checks each checker's exact message at each ``# expect:`` marker.

This file has no ignores on purpose: it shows the words a user reads, and
that the corpus mechanism can fail (these lines must produce errors).
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def seed(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, pl.semaphore_read(send_sem), recv_sem, device_id={"x": (me + 1) % 4})  # expect: seed
    copy.start()
    copy.wait()


def local_wait_send(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    c = pltpu.make_async_copy(x_hbm, buf, sem)
    c.start()
    c.wait_send()  # expect: wait_send


def signal_dma_sem(sem: SemRef) -> None:
    pl.semaphore_signal(sem)  # expect: signal
