"""A kernel helper module of the kind production kernels import (a zero-fill that
starts one copy per row block inside a ``fori_loop``, under ``@jax.named_scope``).

verify's messages must name the kernel line that called it: the helper's own line
is the same for every caller.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


@jax.named_scope("fill_rows")
def fill_rows(dst: Any, src: Any, sem: Any, blocks: int) -> None:
    """Start one copy of ``src`` into each ``src``-sized block of ``dst``; not waited."""
    rows = src.shape[0]

    def body(i: Any, carry: int) -> int:
        pltpu.make_async_copy(src, dst.at[pl.ds(i * rows, rows)], sem).start()
        return carry

    jax.lax.fori_loop(0, blocks, body, 0)


def drain_rows(dst: Any, src: Any, sem: Any, blocks: int) -> None:
    """Wait what :func:`fill_rows` started (one wait per block)."""
    rows = src.shape[0]
    for i in range(blocks):
        pltpu.make_async_copy(src, dst.at[pl.ds(i * rows, rows)], sem).wait()
