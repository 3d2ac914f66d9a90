"""Pass: a double-buffered stream, prefetching step i+1 while step i is computed.

The wait for a copy started in the previous loop iteration goes through
``LocalCopy(...).started_elsewhere().wait()``. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, SemArray, SemRef

from _typed_jax import fori_loop, zeros

CHUNK = 8


def stream_kernel(
    x_hbm: DataRef,
    o_hbm: DataRef,
    bufs: DataRef,
    out_buf: DataRef,
    in_sems: SemArray,
    out_sem: SemRef,
) -> None:
    steps = x_hbm.shape[0] // CHUNK

    def fetch(step: jax.Array | int, slot: jax.Array | int) -> safedma.LocalCopy:
        return safedma.LocalCopy(
            x_hbm.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], in_sems.at[slot]
        )

    first = fetch(0, 0).start()
    assert_type(first, safedma.LocalHandle)

    def body(step: jax.Array, total: jax.Array) -> jax.Array:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _prefetch() -> None:
            fetch(step + 1, 1 - slot).start()

        pending = fetch(step, slot).started_elsewhere()
        assert_type(pending, safedma.LocalHandle)
        pending.wait()

        tile = bufs[slot]
        out_buf[...] = tile * 3.0
        safedma.LocalCopy(out_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem).start().wait()
        return total + tile.sum()

    zero = zeros((), jnp.float32)
    total = fori_loop(0, steps, body, zero)
    assert_type(total, jax.Array)
    del total
