"""Raw-pltpu kernels of the protocol cases: each DMA mistake of MISUSE.md's R5-R10 and its fix.

The safedma versions, the pallas_call set-ups and the expected verdicts are
in protocol_kernels.py. Every kernel has the same operands: ``x_ref`` and
``o_ref`` are one device's ``BLOCK`` in HBM (``(16, 128)`` float32, two
``CHUNK``-row chunks of 4 KiB), followed by its scratch.

A line a verify error should point at (the user's own line) carries a
``# verify: <case>`` marker; the tests read the markers from this file, so
editing it cannot silently detach a test from its line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

CHUNK = 8
AXIS = "x"


def _ring(shift: int) -> dict[str, Any]:
    me = lax.axis_index(AXIS)
    n = lax.axis_size(AXIS)
    return {AXIS: (me + shift + n) % n}


def _first(x_ref: Any) -> Any:
    return x_ref.at[pl.ds(0, CHUNK)]


def _second(x_ref: Any) -> Any:
    return x_ref.at[pl.ds(CHUNK, CHUNK)]


def _write_out(res: Any, o_ref: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(res, o_ref, sem)
    c.start()
    c.wait()


def _send_right(src: Any, dst: Any, send: Any, recv: Any) -> None:
    """Copy ``src`` into the right neighbour's ``dst`` and wait both ends."""
    c = pltpu.make_async_remote_copy(src, dst, send, recv, device_id=_ring(1))  # verify: r6 r10
    c.start()  # verify: r6 r10
    c.wait()


def _read_chunks(
    wait_first: Callable[[], object], wait_second: Callable[[], object], bufs: Any, res: Any
) -> None:
    """Wait chunk 0 and read it, then chunk 1: the reads a wrong wait leaves unguarded."""
    wait_first()  # verify: r7 r9 early_wait
    res[pl.ds(0, CHUNK)] = bufs[0] * 2.0  # verify: r7 r9 early_wait
    wait_second()
    res[pl.ds(CHUNK, CHUNK)] = bufs[1] * 2.0


# ------------------------------------------------------------------ R5: semaphore index


def r5_static(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """``sems`` holds two DMA semaphores; the bug's copy uses a third."""
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[2 if bug else 1])  # verify: r5_static
    c.start()  # verify: r5_static
    c.wait()  # verify: r5_static


def r5_per_device(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """The bug takes one semaphore per device index: out of range on devices 2 and 3."""
    me = lax.axis_index(AXIS)
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[me if bug else me % 2])  # verify: r5_per_device
    c.start()  # verify: r5_per_device
    c.wait()  # verify: r5_per_device


# ------------------------------------------------------------------ R6: unwritten data


def r6_unwritten_staging(
    x_ref: Any, o_ref: Any, stage: Any, send: Any, recv: Any, local: Any, *, bug: bool
) -> None:
    """Sends the VMEM staging buffer to the right neighbour; in the bug nothing wrote it."""
    if not bug:
        fill = pltpu.make_async_copy(x_ref, stage, local)
        fill.start()
        fill.wait()
    _send_right(stage, o_ref, send, recv)


# ------------------------------------------------------------------ R7: wrong slot


def r7_wrong_slot(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, sems: Any, out_sem: Any, *, bug: bool
) -> None:
    """The bug waits chunk 0 on slot 1: the counts balance, chunk 0 is read unguarded."""
    pltpu.make_async_copy(_first(x_ref), bufs.at[0], sems.at[0]).start()
    pltpu.make_async_copy(_second(x_ref), bufs.at[1], sems.at[1]).start()
    other = 1 if bug else 0
    first = pltpu.make_async_copy(_first(x_ref), bufs.at[0], sems.at[other])
    second = pltpu.make_async_copy(_second(x_ref), bufs.at[1], sems.at[1 - other])
    _read_chunks(first.wait, second.wait, bufs, res)
    _write_out(res, o_ref, out_sem)


# ------------------------------------------------------------------ R8: signal after exit


def r8_signal_after_exit(
    x_ref: Any, o_ref: Any, sem: Any, ready: Any, late: Any, *, bug: bool
) -> None:
    """Device 0 signals device 1's ``late`` once device 1 said it is done: in the bug
    nobody waits it."""
    _write_out(x_ref, o_ref, sem)
    me = lax.axis_index(AXIS)

    @pl.when(me == 1)
    def _done() -> None:
        pl.semaphore_signal(ready, 1, device_id={AXIS: 0})
        if not bug:
            pl.semaphore_wait(late, 1)

    @pl.when(me == 0)
    def _late() -> None:
        pl.semaphore_wait(ready, 1)
        pl.semaphore_signal(late, 1, device_id={AXIS: 1})  # verify: r8


# ------------------------------------------------------------------ R9: shared semaphore


def r9_shared_sem(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """Two same-sized copies on one semaphore; the bug's first wait may count the second's
    bytes, the fix waits both at once before either chunk is read."""
    a = pltpu.make_async_copy(_first(x_ref), bufs.at[0], sem)
    b = pltpu.make_async_copy(_second(x_ref), bufs.at[1], sem)
    a.start()
    b.start()
    if bug:
        _read_chunks(a.wait, b.wait, bufs, res)
    else:
        _read_chunks(pltpu.make_async_copy(bufs, bufs, sem).wait, lambda: None, bufs, res)
    _write_out(res, o_ref, out_sem)


def early_wait(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, send: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """``sem`` counts a local fetch and the left neighbour's incoming copy (MoE style).

    The bug's local wait returns as soon as 4 KiB arrived: the neighbour's bytes
    satisfy it as well as the local copy's. The fix waits the total first.
    """
    local = pltpu.make_async_copy(_first(x_ref), bufs.at[0], sem)
    local.start()
    remote = pltpu.make_async_remote_copy(_second(x_ref), bufs.at[1], send, sem, device_id=_ring(1))
    remote.start()

    def both() -> None:
        pltpu.make_async_copy(bufs, bufs, sem).wait()
        remote.wait_send()

    if bug:
        _read_chunks(local.wait, remote.wait, bufs, res)
    else:
        _read_chunks(both, lambda: None, bufs, res)
    _write_out(res, o_ref, out_sem)


# ------------------------------------------------------------------ R10: barrier reuse


def _barrier_round(sem: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=_ring(1))  # verify: r10
    pl.semaphore_signal(sem, 1, device_id=_ring(-1))  # verify: r10
    pl.semaphore_wait(sem, 2)  # verify: r10


def r10_one_round(x_ref: Any, o_ref: Any, send: Any, recv: Any, second: Any, *, bug: bool) -> None:
    """A ring permute behind one barrier round in the bug: a neighbour's next call can pass
    it for us. The fix (jax PR #27963) adds a second round on a REGULAR semaphore."""
    _barrier_round(pltpu.get_barrier_semaphore())
    if not bug:
        _barrier_round(second)
    _send_right(x_ref, o_ref, send, recv)


# ------------------------------------------------------------------ per-slot leak


def per_slot_leak(x_ref: Any, o_ref: Any, bufs: Any, sems: Any, out_sem: Any, *, bug: bool) -> None:
    """The bug waits slot 0 only; the fetch on slot 1 is never waited."""
    pltpu.make_async_copy(_first(x_ref), bufs.at[0], sems.at[0]).start()
    pltpu.make_async_copy(_second(x_ref), bufs.at[1], sems.at[1]).start()  # verify: leak
    pltpu.make_async_copy(_first(x_ref), bufs.at[0], sems.at[0]).wait()
    if not bug:
        pltpu.make_async_copy(_second(x_ref), bufs.at[1], sems.at[1]).wait()
    _write_out(x_ref, o_ref, out_sem)


# ------------------------------------------------------------------ false alarms


def cond_each_branch(x_ref: Any, o_ref: Any, sem: Any, *, bug: bool) -> None:
    """The copy is waited once on every path, in whichever branch the device takes; the
    bug's odd branch forgets the wait."""
    c = pltpu.make_async_copy(x_ref, o_ref, sem)
    c.start()  # verify: cond_each_branch
    me = lax.axis_index(AXIS)

    def even() -> None:
        c.wait()

    def odd() -> None:
        if not bug:
            c.wait()

    lax.cond(me % 2 == 0, even, odd)


def when_not_when(x_ref: Any, o_ref: Any, sem: Any, *, bug: bool) -> None:
    """The bug's second condition overlaps the first on device 2: it waits twice and hangs."""
    c = pltpu.make_async_copy(x_ref, o_ref, sem)
    c.start()
    me = lax.axis_index(AXIS)
    even = me % 2 == 0

    @pl.when(even)
    def _even() -> None:
        c.wait()  # verify: when_not_when

    @pl.when(me >= 1 if bug else jnp.logical_not(even))
    def _odd() -> None:
        c.wait()  # verify: when_not_when


def writeback(x_ref: Any, o_ref: Any, bufs: Any, sems: Any, *, bug: bool) -> None:
    """``x_ref`` in VMEM; step i writes chunk i back through slot i % 2.

    Step i waits step i - 1's write-back (a descriptor rebuilt for a copy
    started one iteration earlier); the last step waits its own handle, which
    the bug forgets.
    """
    steps = x_ref.shape[0] // CHUNK

    def write_back(step: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            bufs.at[slot], o_ref.at[pl.ds(step * CHUNK, CHUNK)], sems.at[slot]
        )

    def body(step: Any, carry: None) -> None:
        slot = step % 2

        @pl.when(step > 0)
        def _previous() -> None:
            write_back(step - 1, 1 - slot).wait()

        bufs[slot] = x_ref[pl.ds(step * CHUNK, CHUNK)] * 2.0
        own = write_back(step, slot)
        own.start()  # verify: writeback
        if not bug:

            @pl.when(step == steps - 1)
            def _last() -> None:
                own.wait()

        return carry

    lax.fori_loop(0, steps, body, None)


def local_ring(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    """A clean ring permute, the kernel the R10 tests compare against."""
    _send_right(x_ref, o_ref, send, recv)


# ------------------------------------------------------------------ credit flow control


CREDIT_MESSAGES = 6


def credit_ring(
    x_ref: Any,
    o_ref: Any,
    bufs: Any,
    res: Any,
    send_sems: Any,
    recv_sems: Any,
    credits: Any,
    out_sem: Any,
    *,
    bug: bool,
) -> None:
    """Each device sends CREDIT_MESSAGES chunks to its right neighbour through two receive
    slots; a slot is reused only after the receiver read it and returned a credit.

    The receiver returns one credit per message it read (two up front); the sender
    waits one credit per message. Message t + 2 then starts after the receiver read
    message t, because the credit that lets it go is issued after that read: of any
    t + 3 credits the sender consumed, one was issued after it (the bug skips the
    credit wait for messages 2 and on).
    """
    rows = x_ref.shape[0] // CREDIT_MESSAGES

    def message(t: int) -> Any:
        slot = t % 2
        return pltpu.make_async_remote_copy(
            x_ref.at[pl.ds(t * rows, rows)],
            bufs.at[slot],
            send_sems.at[slot],
            recv_sems.at[slot],
            device_id=_ring(1),
        )

    pl.semaphore_signal(credits, 2, device_id=_ring(-1))
    for t in range(CREDIT_MESSAGES):
        if not bug or t < 2:
            pl.semaphore_wait(credits, 1)
        if t >= 2:
            message(t - 2).wait_send()
        message(t).start()  # verify: credit_ring
        message(t).wait_recv()
        res[pl.ds(t * rows, rows)] = bufs[t % 2]  # verify: credit_ring
        if t + 2 < CREDIT_MESSAGES:
            pl.semaphore_signal(credits, 1, device_id=_ring(-1))
    for t in range(max(CREDIT_MESSAGES - 2, 0), CREDIT_MESSAGES):
        message(t).wait_send()
    _write_out(res, o_ref, out_sem)


# ------------------------------------------------------------------ property tests


def chunked_ring(
    x_ref: Any,
    o_ref: Any,
    buf: Any,
    send_sems: Any,
    recv_sems: Any,
    out_sem: Any,
    *,
    shift: int,
    chunks: int,
    slots: int,
    drop: int | None = None,
    shifted: int | None = None,
) -> None:
    """Send ``x`` in ``chunks`` row chunks to the device ``shift`` along the ring into
    ``buf``, chunk c on semaphore slot ``c % slots``; wait every chunk, then copy ``buf``
    out. Seeded bugs: ``drop`` leaves chunk ``drop``'s waits out; ``shifted`` waits chunk
    ``shifted``'s receive on the next slot."""
    rows = x_ref.shape[0] // chunks
    copies = []
    for c in range(chunks):
        slot = c % slots
        copy = pltpu.make_async_remote_copy(
            x_ref.at[pl.ds(c * rows, rows)],
            buf.at[pl.ds(c * rows, rows)],
            send_sems.at[slot],
            recv_sems.at[slot],
            device_id=_ring(shift),
        )
        copy.start()
        copies.append(copy)
    for c, copy in enumerate(copies):
        if c == drop:
            continue
        copy.wait_send()
        if c == shifted:
            wrong = (c + 1) % slots
            pltpu.make_async_copy(
                buf.at[pl.ds(c * rows, rows)], buf.at[pl.ds(c * rows, rows)], recv_sems.at[wrong]
            ).wait()
        else:
            copy.wait_recv()
    _write_out(buf, o_ref, out_sem)


def chunked_ring_program(shift: int, chunks: int, slots: int, **bug: int) -> Any:
    """A per-device function running :func:`chunked_ring` (HBM operands, a VMEM receive
    buffer, ``slots`` send and receive DMA semaphores, one for the copy-out); ``bug`` seeds
    ``drop`` or ``shifted``."""
    kernel = functools.partial(chunked_ring, shift=shift, chunks=chunks, slots=slots, **bug)
    functools.update_wrapper(kernel, chunked_ring)
    hbm = pl.BlockSpec(memory_space=pl.ANY)

    def per_device(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[
                pltpu.VMEM(x.shape, x.dtype),
                pltpu.SemaphoreType.DMA((slots,)),
                pltpu.SemaphoreType.DMA((slots,)),
                pltpu.SemaphoreType.DMA(()),
            ],
        )(x)

    return per_device
