"""Pass: one device sends, another only receives; the receiver waits with
``incoming().wait_recv()`` and the sender with ``wait_send()``.

Also ``started_elsewhere()`` on a remote copy started in the previous loop
iteration. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, SemRef

from _typed_jax import fori_loop


def broadcast_from_zero(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    me = safedma.my_index("x")
    assert_type(me, jax.Array)
    n = safedma.axis_size("x")
    assert_type(n, int)

    @pl.when(me == 0)
    def _send() -> None:
        for target in range(1, n):
            copy = (
                safedma.RemoteCopy(x_ref, o_ref, recv_sem)
                .with_send_sem(send_sem)
                .to(safedma.device(x=target))
            )
            copy.start().wait_send()
        # Device 0 receives nothing: its receive semaphore is free for its own copy.
        safedma.LocalCopy(x_ref, o_ref, recv_sem).start().wait()

    @pl.when(me != 0)
    def _receive() -> None:
        incoming = (
            safedma.RemoteCopy(x_ref, o_ref, recv_sem)
            .with_send_sem(send_sem)
            .to(safedma.device(x=0))
            .incoming()
        )
        assert_type(incoming, safedma.IncomingHandle)
        incoming.wait_recv()


def pipelined_rows(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    """Send rows to the right neighbour one by one, keeping two copies in flight.

    Each iteration starts row i and waits for row i - 1, started by the previous
    iteration: that wait goes through started_elsewhere().
    """
    right = safedma.neighbour("x")
    rows = x_ref.shape[0]

    def row(i: jax.Array | int) -> safedma.RemoteCopy[safedma.Given, safedma.Given]:
        copy = safedma.RemoteCopy(x_ref.at[i], o_ref.at[i], recv_sem)
        return copy.with_send_sem(send_sem).to(right)

    row(0).start()

    def body(i: jax.Array, carry: None) -> None:
        row(i).start()
        previous = row(i - 1).started_elsewhere()
        assert_type(previous, safedma.RemoteHandle)
        previous.wait()
        return carry

    fori_loop(1, rows, body, None)
    row(rows - 1).started_elsewhere().wait()
