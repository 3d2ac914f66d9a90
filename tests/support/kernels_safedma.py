"""The kernels the core tests run, written with safedma.

Each has a hand-written pltpu twin in kernels_pltpu.py with the same name;
test_equivalence.py checks that the two lower to the same Mosaic module.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl

import safedma as sd

CHUNK = 8


def scale_copy(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    """HBM -> VMEM, compute in VMEM, VMEM -> HBM."""
    sd.LocalCopy(x_hbm, buf, sem).start().wait()
    buf[...] = buf[...] * 2.0 + 1.0
    sd.LocalCopy(buf, o_hbm, sem).start().wait()


def reverse_halves(
    x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sems: sd.SemArray
) -> None:
    """Swap the two halves of the rows with sliced copies, one semaphore per half."""
    half = x_hbm.shape[0] // 2
    first = sd.LocalCopy(x_hbm.at[pl.ds(0, half)], buf.at[pl.ds(half, half)], sems.at[0])
    second = sd.LocalCopy(x_hbm.at[pl.ds(half, half)], buf.at[pl.ds(0, half)], sems.at[1])
    h1 = first.start()
    h2 = second.start(priority=1)
    h1.wait()
    h2.wait()
    sd.LocalCopy(buf, o_hbm, sems.at[0]).start().wait()


def double_buffered(
    x_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    bufs: sd.DataRef,
    out_buf: sd.DataRef,
    in_sems: sd.SemArray,
    out_sem: sd.SemRef,
) -> None:
    """Stream x through VMEM in CHUNK-row chunks; chunk i+1 loads while i is computed."""
    steps = x_hbm.shape[0] // CHUNK

    def fetch(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        return sd.LocalCopy(x_hbm.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], in_sems.at[slot])

    fetch(0, 0).start()

    def body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _prefetch() -> None:
            fetch(step + 1, 1 - slot).start()

        fetch(step, slot).started_elsewhere().wait()
        out_buf[...] = bufs[slot] * 3.0
        sd.LocalCopy(out_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem).start().wait()
        return carry

    jax.lax.fori_loop(0, steps, body, None)


def ring_permute(
    x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef
) -> None:
    """Send this device's block to the next device along mesh axis "x"."""
    copy = sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(sd.neighbour("x"))
    copy.start().wait()
