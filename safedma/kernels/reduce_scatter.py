"""Ring reduce-scatter: each device ends with its 1/n slice of the sum over a mesh axis.

``reduce_scatter(x, axis="x")``, called per device inside ``jax.shard_map``,
returns what ``jax.lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True)``
returns: device ``i`` of the ``n`` devices along ``axis`` gets rows
``i*m:(i+1)*m`` (``m = rows // n``) of the sum of every device's ``x``. On a
multi-axis mesh the ring runs along ``axis`` only; each line of devices along
it reduces independently.

Algorithm: partial sums travel around the ring, inputs stay put. The partial
sum of chunk ``c`` starts on device ``c + 1`` as its own rows of chunk ``c``,
moves one device to the right per step, and each device adds its rows of
chunk ``c`` to it on the way; after ``n - 1`` hops it arrives complete on
device ``c``. At step ``s`` device ``i`` works on chunk ``(i - s - 1) % n``.
The accumulation is in VMEM, in float32 (bfloat16 inputs are widened when
read and the result rounded once, at the end; the partial sums travel as
float32, so a bfloat16 reduce-scatter sends twice the bytes of its input).

Preconditions (checked before tracing, as ``ValueError``):

* call it inside ``jax.shard_map`` with ``axis`` a mesh axis in scope;
* ``x`` is 2-D ``(rows, cols)``, float32 or bfloat16;
* ``rows`` is divisible by ``n``, and ``m = rows // n`` is a multiple of the
  VMEM tile rows (8 for float32, 16 for bfloat16); ``cols`` is a multiple
  of 128;
* ``collective_id`` is a non-negative int.

Memory: ``x`` stays in HBM (``pl.ANY``); the output ``(m, cols)`` is a VMEM
block. VMEM also holds two input chunks, two receive and two send buffers
(float32): ``4*m*cols*4 + 3*m*cols*itemsize`` bytes in all, which must fit
the scoped VMEM limit of the chip (``compile_for_tpu`` reports an overflow).

Semaphores:

* ``x_sems``: 2 DMA, the local fetches of this device's chunks into
  ``x_bufs[slot]`` (HBM -> VMEM, double-buffered);
* ``send_sems`` / ``recv_sems``: 2 DMA each, one per communication slot;
  message ``t`` (sent at step ``t``) goes from ``send_bufs[t % 2]`` to the
  right neighbour's ``recv_bufs[t % 2]``;
* ``capacity``: 1 REGULAR, the credit-based flow control of
  :mod:`safedma.kernels._ring` (the all-gather's): message ``t >= 2`` is
  sent only after the right neighbour signalled that the slot of message
  ``t - 2`` is free again;
* the barrier semaphore (``collective_id``): at the start, each device
  signals both neighbours and waits for both, so nobody signals or writes
  into a device that has not entered the kernel.

Message flow on device ``i`` (left ``i - 1``, right ``i + 1``, modulo ``n``)::

    barrier:     signal barrier on left and right; wait barrier 2
    step 0:      fetch x chunk i - 1; send_bufs[0] = it;
                 send message 0 -> right.recv_bufs[0]
    step s = 1 .. n - 1 (slot = s % 2, the previous message is in 1 - slot):
                 wait the fetch of x chunk i - s - 1; prefetch the next chunk
                 wait_recv message s - 1  (from left, in recv_bufs[1 - slot])
                 total = recv_bufs[1 - slot] + x chunk
                 signal capacity on left  (if message s + 1 will use that slot)
                 if s < n - 1: wait_send message s - 2 (frees send_bufs[slot]);
                      send_bufs[slot] = total; wait capacity (if s >= 2);
                      send message s -> right.recv_bufs[slot]
                 else: output = total  (chunk i, complete)
    end:         wait_send the last (up to two) messages

Every device sends ``n - 1`` messages and receives ``n - 1``; the right
neighbour signals this device's ``capacity`` ``max(n - 3, 0)`` times and this
device waits it as often, so every semaphore is back to zero at exit. Each wait in the
loop is for a copy started in an earlier step, so it goes through
``RemoteCopy(...).started_elsewhere()``; the copies are symmetric (every
device sends the same description to its right neighbour), so the
``wait_recv`` of this device's own message ``t`` is the wait for the message
``t`` its left neighbour sent here. One barrier suffices even when the same
``collective_id`` is reused by the next call: a device can only finish after
both neighbours have passed their barrier wait (it needs the left's messages,
and its own chunk's partial sum, which the right neighbour started, at its
step 0, after its barrier), so an early signal from the next call always
counts towards the next call's barrier.

Why the barrier stays on 2-D meshes (jax 0.12 interpret mode): with a
``collective_id`` the interpreter drops the global barrier it otherwise
inserts before every kernel, so a remote write or signal that reaches a
device before that device has allocated its scratch fails with a
``KeyError`` on the buffer. That is the interpreter modelling the real race,
not a 2-D limitation: it fails the same way on 1-D meshes, and a kernel whose
first cross-device operation is the neighbour barrier (as here) runs on 1-D
and 2-D meshes alike on both jax versions. So this kernel has no barrier-less
mode; replacing the barrier by a REGULAR-semaphore handshake would only be
correct in interpret mode (on a TPU a REGULAR scratch semaphore of a kernel
a device has not entered yet is not there to signal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.typing import DTypeLike

import safedma as sd
from safedma.kernels._barrier import neighbour_barrier
from safedma.kernels._call import hbm_call
from safedma.kernels._preconditions import check_reduction
from safedma.kernels._ring import Credits
from safedma.kernels._typed_jax import fori_loop

__all__ = [
    "Finish",
    "RingScratch",
    "neighbour_barrier",
    "reduce_scatter",
    "reduce_scatter_kernel",
    "reduce_scatter_ring",
    "reduce_scatter_scratch",
]

Finish: TypeAlias = Callable[[jax.Array], None]
"""What to do with this device's complete chunk of the sum (float32, ``(m, cols)``)."""

_ACC = jnp.float32
_VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


class RingScratch(NamedTuple):
    """The ring's buffers and semaphores, in :func:`reduce_scatter_scratch`'s order."""

    x_bufs: sd.DataRef
    recv_bufs: sd.DataRef
    send_bufs: sd.DataRef
    x_sems: sd.SemArray
    send_sems: sd.SemArray
    recv_sems: sd.SemArray
    capacity: sd.RegularSem


def reduce_scatter_ring(
    x_hbm: sd.DataRef, scratch: RingScratch, *, axis: str, finish: Finish
) -> None:
    """The ring schedule of the module docstring, from the free-slot signal to the drain.

    Call it after :func:`neighbour_barrier`, inside a kernel body; ``finish``
    receives this device's complete chunk (float32) in the last step. The
    fused all-reduce reuses it for its reduce-scatter phase.
    """
    x_bufs, recv_bufs, send_bufs, x_sems, send_sems, recv_sems, capacity = scratch
    n = sd.axis_size(axis)
    m = x_bufs.shape[1]
    me = sd.my_index(axis)

    def fetch(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        chunk = (me - step - 1 + n) % n
        return sd.LocalCopy(x_hbm.at[pl.ds(chunk * m, m)], x_bufs.at[slot], x_sems.at[slot])

    def message(slot: jax.Array | int) -> sd.RemoteCopy[sd.Given, sd.Given]:
        return (
            sd.RemoteCopy(send_bufs.at[slot], recv_bufs.at[slot], recv_sems.at[slot])
            .with_send_sem(send_sems.at[slot])
            .to(sd.neighbour(axis, 1))
        )

    messages = n - 1  # message t is sent at step t, into slot t % 2 downstream
    credits = Credits(capacity, sd.neighbour(axis, -1))

    fetch(0, 0).start()
    fetch(1, 1).start()  # n >= 2, so step 1 exists
    first = fetch(0, 0).started_elsewhere().wait()  # x_bufs[0], landed
    send_bufs[0] = first[...].astype(_ACC)
    credits.acquire(0)
    message(0).start()

    def step_body(step: jax.Array, carry: None) -> None:
        slot = step % 2
        prev = 1 - slot
        mine = fetch(step, slot).started_elsewhere().wait()  # x_bufs[slot], landed

        @pl.when(step + 1 < n)
        def _prefetch_next() -> None:
            fetch(step + 1, prev).start()

        partial = message(prev).started_elsewhere().wait_recv()  # recv_bufs[prev], landed
        total = partial[...] + mine[...].astype(_ACC)

        credits.release(step - 1, messages)  # message step - 1 is consumed

        @pl.when(step + 1 < n)
        def _pass_on() -> None:
            @pl.when(step >= 2)
            def _free_send_slot() -> None:
                message(slot).started_elsewhere().wait_send()

            send_bufs[slot] = total
            credits.acquire(step)
            message(slot).start()

        @pl.when(step + 1 == n)
        def _complete() -> None:
            finish(total)

        return carry

    fori_loop(1, n, step_body, None)

    # The loop waited the send side of messages 0 .. n - 4; drain the rest.
    for sent in range(max(n - 3, 0), n - 1):
        message(sent % 2).started_elsewhere().wait_send()


def reduce_scatter_kernel(
    x_hbm: sd.DataRef,
    o_ref: sd.DataRef,
    x_bufs: sd.DataRef,
    recv_bufs: sd.DataRef,
    send_bufs: sd.DataRef,
    x_sems: sd.SemArray,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    capacity: sd.RegularSem,
    *,
    axis: str,
) -> None:
    """The kernel body: ``o_ref`` (VMEM ``(m, cols)``) = this device's chunk of the sum.

    ``x_hbm`` is this device's ``(n*m, cols)`` input in HBM; the buffers and
    semaphores are :func:`reduce_scatter_scratch`'s. Bind ``axis`` with
    ``functools.partial``.
    """

    def store(total: jax.Array) -> None:
        o_ref[...] = total.astype(o_ref.dtype)

    neighbour_barrier(axis)
    scratch = RingScratch(x_bufs, recv_bufs, send_bufs, x_sems, send_sems, recv_sems, capacity)
    reduce_scatter_ring(x_hbm, scratch, axis=axis, finish=store)


def reduce_scatter_scratch(chunk_rows: int, cols: int, dtype: DTypeLike) -> list[object]:
    """``scratch_shapes`` for :func:`reduce_scatter_ring`, in its parameter order."""
    chunk = (2, chunk_rows, cols)
    return [
        sd.vmem(chunk, dtype),
        sd.vmem(chunk, _ACC),
        sd.vmem(chunk, _ACC),
        sd.dma_semaphores(2),
        sd.dma_semaphores(2),
        sd.dma_semaphores(2),
        sd.regular_semaphore(),
    ]


def reduce_scatter(
    x: jax.Array,
    *,
    axis: str,
    collective_id: int = 0,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """``jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)`` as a ring kernel.

    Call per device inside ``jax.shard_map``. ``collective_id`` names the
    barrier semaphore; kernels that may run at the same time with different
    communication patterns need different ids. With one device along
    ``axis`` the sum is ``x`` itself and no kernel runs. Raises
    ``ValueError`` when a precondition of the module docstring fails.
    """
    n = check_reduction(x, axis, collective_id, "reduce_scatter")
    if n == 1:
        return x
    m, cols = x.shape[0] // n, x.shape[1]
    call = hbm_call(
        reduce_scatter_kernel,
        jax.ShapeDtypeStruct((m, cols), x.dtype),
        out_specs=_VMEM,
        scratch_shapes=reduce_scatter_scratch(m, cols, x.dtype),
        collective_id=collective_id,
        interpret=interpret,
        name="reduce_scatter",
        axis=axis,
    )
    return call(x)
