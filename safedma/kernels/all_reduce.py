"""Ring all-reduce: every device ends with the sum over a mesh axis, as ``jax.lax.psum``.

``all_reduce(x, axis="x")``, called per device inside ``jax.shard_map``,
returns ``jax.lax.psum(x, "x")``. It is a reduce-scatter followed by an
all-gather: after the reduce-scatter device ``i`` holds chunk ``i`` (rows
``i*m:(i+1)*m``, ``m = rows // n``) of the sum, and the all-gather passes
the chunks around the ring until every device has all of them. Two forms:

* ``fused=True`` (the default): :func:`all_reduce_kernel`, one
  ``pallas_call`` with a reduce-scatter phase (the ring schedule of
  :mod:`safedma.kernels.reduce_scatter`, reused as is) and an all-gather
  phase. One barrier, one launch, and the sum never leaves the kernel
  between the phases.
* ``fused=False``: :func:`~safedma.kernels.reduce_scatter.reduce_scatter`
  then :func:`safedma.kernels.all_gather.all_gather` (``concat_axis=0``),
  two ``pallas_call``s built from the two public kernels as they are.

Both accumulate in float32 (bfloat16 inputs are widened and the sum rounded
once, see the reduce-scatter module), so they agree with each other exactly
and with ``psum`` within float rounding.

Preconditions (checked before tracing, as ``ValueError``): those of the
reduce-scatter: inside ``jax.shard_map`` with ``axis`` in scope; ``x`` 2-D
``(rows, cols)``, float32 or bfloat16; ``rows`` divisible by ``n`` with
``rows // n`` a multiple of 8 (float32) or 16 (bfloat16); ``cols`` a
multiple of 128; ``collective_id`` a non-negative int.

Memory: ``x`` and the output stay in HBM (``pl.ANY``). The fused kernel's
VMEM is the reduce-scatter's (two input chunks, two float32 receive and two
float32 send buffers) plus one output chunk.

Semaphores of the fused kernel: the reduce-scatter's (2 DMA for the local
fetches, 2 + 2 DMA for the double-buffered messages, 1 REGULAR capacity, the
barrier), plus 1 DMA for the local store of the reduced chunk, and for the
all-gather phase 1 DMA for the send side, ``RECV_SLOTS`` (2) DMA for the
receive side and 1 REGULAR capacity: the ring helper of
:mod:`safedma.kernels._ring`, as in :mod:`safedma.kernels.all_gather`. The
all-gather phase must not share the reduce-scatter's receive semaphores: a
neighbour that finishes its reduce-scatter first already sends gather chunks
while this device still waits for its last partial sum, and that wait could
be satisfied by the gather chunk's bytes. Within the phase a device's
progress is gated only by its left neighbour, so it could run several steps
ahead of its right neighbour; the capacity handshake bounds that to two
steps, so a receive semaphore never counts the bytes of two chunks at once.
The semaphore count does not depend on the ring: an earlier version used one
receive semaphore per step (``n - 1``), which compiles for a 256-device ring
on v6e and v5p but not far beyond (2 KiB of semaphore memory, see
:mod:`safedma.kernels.all_gather`).

Message flow of the all-gather phase on device ``i``, after the
reduce-scatter phase has stored chunk ``i`` of the sum into ``o[i]``::

    step s = 0 .. n - 2:  [s >= 2: wait capacity: right has freed recv_sems[s % 2]]
                          send o[i - s] -> right.o[i - s]    (recv_sems[s % 2] there)
                          wait_send; wait_recv recv_sems[s % 2]  (o[i - s - 1] from left)
                          [s + 2 < n - 1: signal capacity on left]

Each chunk region of each device's output is written exactly once, by the
left neighbour, and read (to forward it) only after its ``wait_recv``; the
capacity handshake is there for the receive semaphores, not the data. The copies are symmetric, so the
``wait_recv`` of this device's own send at step ``s`` is the wait for the
chunk the left neighbour sent here at its step ``s`` (same size, same
semaphore). No device leaves the kernel while a neighbour can still write to
it: each waits for all ``n - 1`` chunks it receives.

Barrier: the fused kernel starts with the neighbour barrier of the
reduce-scatter module, for the reason given there (a device must have
entered the kernel before anything is written into it; the same reasoning
shows one round suffices). The composed form passes ``collective_id`` to
both kernels, so the all-gather meets its neighbours on the same barrier
semaphore. There is no barrier-less mode for 2-D meshes: the jax 0.12
interpret-mode ``KeyError`` seen on 2-D meshes with a ``collective_id``
comes from a remote write reaching a device before it entered the kernel
(see the reduce-scatter module), which a kernel that starts with the
barrier never does; the tests run both forms on 1-D meshes and along each
axis of a 2x4 mesh, on both supported jax versions.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels._barrier import neighbour_barrier
from safedma.kernels._call import hbm_call
from safedma.kernels._preconditions import check_reduction
from safedma.kernels._ring import RECV_SLOTS, RingDirection
from safedma.kernels._typed_jax import fori_loop
from safedma.kernels.all_gather import all_gather
from safedma.kernels.reduce_scatter import (
    RingScratch,
    reduce_scatter,
    reduce_scatter_ring,
    reduce_scatter_scratch,
)

__all__ = ["all_gather_ring", "all_reduce", "all_reduce_kernel"]


def all_gather_ring(
    o_hbm: sd.DataRef,
    send_sem: sd.SemRef,
    recv_sems: sd.SemArray,
    capacity: sd.RegularSem,
    *,
    axis: str,
) -> None:
    """Pass the chunks of ``o_hbm`` around the ring until every device has all of them.

    ``o_hbm`` is this device's ``(n*m, cols)`` output in HBM, with chunk
    ``i`` (this device's index) already in place; the other chunks arrive
    from the left neighbour, one per step (the flow of the module
    docstring). ``recv_sems`` holds :data:`~safedma.kernels._ring.RECV_SLOTS`
    DMA semaphores and ``capacity`` is a REGULAR semaphore: the ring's flow
    control, as in :mod:`safedma.kernels.all_gather`. Call it after a
    neighbour barrier, inside a kernel body.
    """
    n = sd.axis_size(axis)
    m = o_hbm.shape[0] // n
    me = sd.my_index(axis)
    steps = n - 1
    ring = RingDirection(
        sd.neighbour(axis, 1), sd.neighbour(axis, -1), send_sem, recv_sems, capacity
    )

    def forward(step: jax.Array, carry: None) -> None:
        chunk = o_hbm.at[pl.ds((me - step + n) % n * m, m)]
        ring.send(chunk, chunk, step).wait()
        ring.received(step, steps)
        return carry

    fori_loop(0, steps, forward, None)


def all_reduce_kernel(
    x_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    x_bufs: sd.DataRef,
    recv_bufs: sd.DataRef,
    send_bufs: sd.DataRef,
    x_sems: sd.SemArray,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    capacity: sd.RegularSem,
    out_buf: sd.DataRef,
    out_sem: sd.SemRef,
    gather_send_sem: sd.SemRef,
    gather_recv_sems: sd.SemArray,
    gather_capacity: sd.RegularSem,
    *,
    axis: str,
) -> None:
    """The fused kernel body: ``o_hbm`` (HBM ``(n*m, cols)``) = the sum of every ``x_hbm``.

    The first nine parameters are the reduce-scatter's (see
    :func:`~safedma.kernels.reduce_scatter.reduce_scatter_kernel`, with
    ``o_hbm`` in place of its VMEM output); ``out_buf`` is a VMEM ``(m,
    cols)`` buffer of the output dtype; the gather phase's ``gather_recv_sems``
    holds ``RECV_SLOTS`` DMA semaphores and ``gather_capacity`` is REGULAR.
    Bind ``axis`` with ``functools.partial``.
    """
    m = out_buf.shape[0]
    mine = o_hbm.at[pl.ds(sd.my_index(axis) * m, m)]

    def store(total: jax.Array) -> None:
        out_buf[...] = total.astype(out_buf.dtype)
        sd.LocalCopy(out_buf, mine, out_sem).start().wait()

    neighbour_barrier(axis)
    scratch = RingScratch(x_bufs, recv_bufs, send_bufs, x_sems, send_sems, recv_sems, capacity)
    reduce_scatter_ring(x_hbm, scratch, axis=axis, finish=store)
    all_gather_ring(o_hbm, gather_send_sem, gather_recv_sems, gather_capacity, axis=axis)


def all_reduce(
    x: jax.Array,
    *,
    axis: str,
    fused: bool = True,
    collective_id: int = 0,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """``jax.lax.psum(x, axis)`` as a ring reduce-scatter plus all-gather.

    Call per device inside ``jax.shard_map``. ``fused=True`` runs one
    kernel, ``fused=False`` the reduce-scatter and all-gather kernels one
    after the other (both with ``collective_id``: they talk to the same
    neighbours, so they may share the barrier semaphore). With one device along
    ``axis`` the sum is ``x`` itself and no kernel runs. Raises
    ``ValueError`` when a precondition of the module docstring fails.
    """
    n = check_reduction(x, axis, collective_id, "all_reduce")
    if n == 1:
        return x
    if not fused:
        chunk = reduce_scatter(x, axis=axis, collective_id=collective_id, interpret=interpret)
        return all_gather(
            chunk, axis=axis, concat_axis=0, collective_id=collective_id, interpret=interpret
        )
    m, cols = x.shape[0] // n, x.shape[1]
    call = hbm_call(
        all_reduce_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[
            *reduce_scatter_scratch(m, cols, x.dtype),
            sd.vmem((m, cols), x.dtype),
            sd.dma_semaphore(),
            sd.dma_semaphore(),
            sd.dma_semaphores(RECV_SLOTS),
            sd.regular_semaphore(),
        ],
        collective_id=collective_id,
        interpret=interpret,
        name="all_reduce",
        axis=axis,
    )
    return call(x)
