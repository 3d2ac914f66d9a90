"""ppermute: every device sends its block ``shift`` steps around a named mesh axis.

``ppermute(x, axis="x", shift=k)`` called inside ``jax.shard_map`` returns on
device ``i`` the block of device ``(i - k) mod n`` along ``axis`` (``n`` its
size), exactly ``jax.lax.ppermute(x, axis, [(j, (j + k) % n) for j in
range(n)])``. Any integer ``shift`` works: negative shifts go backwards and
shifts of ``n`` or more wrap. On a mesh with other axes each device stays in
its own row of them. When ``shift % n == 0`` the block stays on the device
and the kernel is one local DMA.

Preconditions (checked before tracing, as ``ValueError``):

* called inside ``jax.shard_map`` whose mesh has ``axis``;
* ``x`` has at least one dimension and a 32-, 16- or 8-bit integer or
  floating dtype (what the TPU DMA engines move); any shape otherwise, since
  the block moves whole;
* ``collective_id`` is ``None`` or a non-negative int.

Memory: ``x`` and the output stay in HBM (``pl.BlockSpec(memory_space=pl.ANY)``);
no VMEM is used.

Semaphores: one DMA semaphore for the send side, one for the receive side
(also the local copy's when ``shift % n == 0``), and one REGULAR semaphore
for the second barrier round (allocated always, so the kernel has one
signature; used only with ``collective_id``), plus the barrier semaphore
with ``collective_id``.

Message flow on device ``i``, with target ``t = i + shift`` and source
``s = i - shift`` (mod ``n``)::

    [barrier: signal t and s on the barrier semaphore, wait for 2;
              then the same on a REGULAR semaphore]
    start   x_i -> o on t              (send_sem here, recv_sem on t)
    wait    send_sem: x_i has been read
    wait    recv_sem: x_s from s has landed in o

Every device sends exactly one copy and receives exactly one (the shift is a
permutation), so each semaphore returns to zero.

Entry synchronisation: a device may only write into a peer's output once the
peer has entered the kernel. With ``collective_id=None`` (the default) the
kernel has no barrier of its own and Mosaic's default device barrier before
the kernel provides that; TPU interpret mode models it as a global barrier.
With an int ``collective_id`` the kernel instead synchronises only with its
two peers, on the barrier semaphore of that id, which is cheaper on a large
mesh. Calls whose devices meet other peers (``shift`` not equal to ``±shift``
of the other call, mod ``n``) need different ids even back to back in one
program: devices are not in step between calls, and a device already in the
next call would release the barrier of a device still in this one. The second round on a REGULAR semaphore is the
double barrier of the JAX distributed Pallas guide: without it a source that
has already finished could signal the barrier again from its *next* call and
release this device before the target has entered this call.
"""

from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels._barrier import meet
from safedma.kernels._call import hbm_call
from safedma.kernels._preconditions import (
    check_axis,
    check_block,
    check_collective_id,
    check_int,
)

__all__ = ["ppermute", "ppermute_kernel"]


def ppermute_kernel(
    x_ref: sd.DataRef,
    o_ref: sd.DataRef,
    send_sem: sd.SemRef,
    recv_sem: sd.SemRef,
    second_round: sd.RegularSem,
    *,
    axis: str,
    shift: int,
    barrier: bool,
) -> None:
    """The kernel body: ``o_ref`` on device ``i + shift`` receives ``x_ref`` of device ``i``.

    ``second_round`` is the REGULAR semaphore of the barrier's second round
    (unused without the barrier). ``barrier=True`` needs a ``collective_id``
    in the compiler parameters. Bind the keyword arguments with
    ``functools.partial``.
    """
    if shift % sd.axis_size(axis) == 0:
        sd.LocalCopy(x_ref, o_ref, recv_sem).start().wait()
        return
    target = sd.neighbour(axis, shift)
    source = sd.neighbour(axis, -shift)
    if barrier:
        meet(sd.barrier_semaphore(), target, source)
        meet(second_round, target, source)
    copy = sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(target)
    copy.start().wait()  # wait_send for our block, wait_recv for the source's


def ppermute(
    x: jax.Array,
    *,
    axis: str,
    shift: int = 1,
    collective_id: int | None = None,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """The block of the device ``shift`` steps back along ``axis`` (``jax.lax.ppermute``).

    Call it inside ``jax.shard_map``. ``collective_id`` switches on the
    kernel's own neighbour barrier (see the module docstring). Raises
    ``ValueError`` when a precondition fails.
    """
    size = check_axis(axis, "ppermute")
    check_block(x, "ppermute")
    check_int(shift, "shift", "ppermute")
    check_collective_id(collective_id, "ppermute", optional=True)
    moves = shift % size != 0
    barrier = moves and collective_id is not None
    call = hbm_call(
        ppermute_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore(), sd.regular_semaphore()],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="ppermute",
        axis=axis,
        shift=shift,
        barrier=barrier,
    )
    return call(x)
