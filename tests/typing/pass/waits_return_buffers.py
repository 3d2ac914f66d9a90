"""Pass: a wait gives back what it protected, typed as a DataRef.

``wait()`` on a local handle and ``wait_recv()`` return the destination (now
readable), ``wait_send()`` the source (now free to overwrite), and a remote
``wait()`` the destination. Every handle is a ``safedma.Handle``. Must pass
``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
from typing_extensions import assert_type

import safedma
from safedma import DataRef, SemRef


def local(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> jax.Array:
    handle = safedma.LocalCopy(x_hbm, buf, sem).start()
    base: safedma.Handle = handle
    del base
    landed = handle.wait()
    assert_type(landed, DataRef)
    return landed[...]


def remote(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    copy = safedma.RemoteCopy(x, o, recv).with_send_sem(send).to(safedma.neighbour("x"))
    handle = copy.start()
    assert_type(handle.wait_send(), DataRef)
    received = handle.wait_recv()
    assert_type(received, DataRef)
    received[...] = received[...] + 1.0
    assert_type(copy.started_elsewhere().wait(), DataRef)
    assert_type(copy.incoming().wait_recv(), DataRef)


def aggregate(buf: DataRef, sem: SemRef) -> jax.Array:
    return safedma.wait_all_into(buf, sem)[...]
