"""Pass: shapes found in production DMA kernels (SparseCore push streams, tokamax's RoPE).

* a SparseCore push stream without a semaphore: on jax 0.12 a local copy from VMEM to HBM, VMEM_SHARED or SMEM is a push stream that
the hardware tracks without a semaphore; jax asks for ``sem=None``. ``LocalCopy`` takes
``None`` there (checked at trace time: T6 anywhere else). Rows double-buffered through
VMEM: gathered in on a DMA semaphore, pushed out with ``None``, each buffer's push waited
through ``started_elsewhere()`` before the buffer is gathered into again;
* the DMA part of a per-token row gather as a ``BufferedRef`` subclass (tokamax's RoPE):
  its ``copy_in`` takes a tuple of refs, the table and the SMEM positions, and starts one
  row copy per token in an unrolled ``pl.loop`` into the window slot; its ``wait_in``
  waits the slot by size. (The subclass itself is jax's partly unannotated class; the
  helpers it calls are typed.)

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, SemArray, SemRef

BLOCK = 8


def push_rows(x_hbm: DataRef, o_hbm: DataRef, bufs: DataRef, sems: SemArray) -> None:
    def pushed(b: jax.Array | int, slot: jax.Array | int) -> safedma.LocalCopy:
        return safedma.LocalCopy(bufs.at[slot], o_hbm.at[pl.ds(b * BLOCK, BLOCK)], None)

    @pl.loop(0, 8)
    def _(b: jax.Array) -> None:
        slot = b % 2

        @pl.when(b >= 2)
        def _() -> None:
            pushed(b - 2, slot).started_elsewhere().wait()

        safedma.LocalCopy(x_hbm.at[pl.ds(b * BLOCK, BLOCK)], bufs.at[slot], sems.at[slot]).start().wait()
        pushed(b, slot).start()

    for b in (6, 7):
        done: DataRef = pushed(b, b % 2).started_elsewhere().wait()
        del done


TILE, WIDTH = 8, 128


def copy_in_rows(
    src: tuple[DataRef, DataRef], window: DataRef, sem: SemRef, step: jax.Array | int
) -> None:
    table, positions = src

    @pl.loop(0, TILE, unroll=True)
    def _(i: jax.Array) -> None:
        row = table.at[positions[step * TILE + i], pl.ds(0, WIDTH)]
        safedma.LocalCopy(row, window.at[i, :], sem).start()


def wait_in_rows(window: DataRef, sem: SemRef) -> None:
    safedma.wait_bytes(sem, window)
