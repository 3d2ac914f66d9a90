"""All-gather around a ring: every device ends with every device's block, in order.

``all_gather(x, axis="x", concat_axis=a)`` called inside ``jax.shard_map``
returns on every device the blocks of all ``n`` devices along ``axis``,
concatenated along dimension ``a`` of the block in device order: exactly
``jax.lax.all_gather(x, axis, axis=a, tiled=True)``.
``all_gather_bidirectional`` returns the same array but moves half of every
block each way around the ring, so both directions of each link carry data.

Preconditions (checked before tracing, as ``ValueError``):

* called inside ``jax.shard_map`` whose mesh has ``axis``;
* ``x`` has at least two dimensions and a 32-, 16- or 8-bit integer or
  floating dtype; ``-x.ndim <= concat_axis < x.ndim``;
* every window the kernel copies can be addressed by the TPU DMA engine in
  HBM: a window along the last dimension is a multiple of 128 elements, one
  along the second-to-last a multiple of the dtype's sublane packing (1 for
  32-bit, 2 for 16-bit, 4 for 8-bit dtypes); leading dimensions are free.
  The windows are the block along ``concat_axis`` and, for the
  bidirectional kernel, half the block along ``split_axis``, whose size must
  be even. (Measured with ``safedma.testing.compile_for_tpu`` on v4, v5e,
  v6e and TPU7x; the simulator does not check it.)
* ``collective_id`` is ``None`` or a non-negative int.

Memory: ``x`` and the output stay in HBM (``pl.BlockSpec(memory_space=pl.ANY)``);
no VMEM is used. The output is the receive buffer: it has one slot per
device, ``o[..., k*b:(k+1)*b, ...]`` along ``concat_axis`` for the block of
device ``k`` (``b`` the block's size there).

Semaphores (``R = RECV_SLOTS = 2``): one DMA semaphore for the local copy
of the own block; per ring direction (the bidirectional kernel has two)
one DMA semaphore for the send side, ``R`` DMA receive semaphores used in
turn (step ``s`` on ``s % R``) and one REGULAR "capacity" semaphore; with
``collective_id`` also the barrier semaphore.

Message flow of ``all_gather`` on device ``i`` (indices mod ``n``, ``n - 1``
steps)::

    start  local copy  x -> slot i                      (waited at the very end)
    [barrier: signal i - 1 and i + 1, wait for 2]
    step s:  [s >= R: wait capacity: i + 1 has freed recv_sems[s % R]]
             send (s = 0: x, else slot i-s) -> slot i-s on i + 1, recv_sems[s % R]
             wait the send, then the receive of slot i-1-s from i - 1
             [s + R < n - 1: signal capacity on i - 1: recv_sems[s % R] is free]

``all_gather_bidirectional`` runs two such rings at once, one step each per
iteration: the first half of each block (along ``split_axis``) travels right
exactly as above, the second half travels left (step ``s`` sends the second
half of slot ``i + s`` to ``i - 1``, and capacity signals go to ``i + 1``),
each direction on its own semaphores.

Why it is race-free: the output has a slot for every block, and each slot
(each half, in the bidirectional kernel) on each device is written exactly
once, so no copy ever overwrites data its reader still needs, and no data
buffer needs double-buffering. Slot ``i - s`` is sent at step ``s`` only
after its receive at step ``s - 1`` was waited. The own slot is written by
the local copy while the ring runs (step 0 sends from ``x``, not from the
slot), and no other copy touches it. What is reused is the receive
semaphores, under the credit-based flow control of
:mod:`safedma.kernels._ring` (shared with the reduce-scatter and the fused
all-reduce): a receive semaphore is reused only after the receiver has
waited its previous copy and said so, which bounds a device's run-ahead to
``R`` steps. Every capacity signal is matched by a wait (``n - 1 - R`` of
each per device and direction), so all semaphores end at zero.

Why not one receive semaphore per step (``n - 1``, as in the JAX guide's
example, with no handshake)? Not for lack of semaphore memory at 256 chips:
compiled with ``safedma.testing.compile_for_tpu``, that design builds for a
256-device ring on ``v6e:16x16`` and ``v5p:8x8x4``. The TPU's semaphore
memory (``sflag``) is 2 KiB per kernel on v6e and v5p, 4 bytes a semaphore
shared with the compiler's own: an array of 430 scratch DMA semaphores still
compiles there, one of 450 does not (``RESOURCE_EXHAUSTED``, "Ran out of
memory in memory space sflag"; measured with libtpu 0.0.50). So ``n - 1``
semaphores cap the ring somewhere between 430 and 450 devices, while this design's count does not
grow with ``n`` and needs no second design for long rings.

Entry synchronisation: with ``collective_id=None`` (the default) Mosaic's
default device barrier before the kernel makes sure every peer has entered
it before anything is written into its output or semaphores (TPU
interpret mode models it as a global barrier). With an int
``collective_id`` the kernel instead meets only its two ring neighbours on
the barrier semaphore of that id. A single round is enough here: a
neighbour can only finish this call after it has received every device's
block, which this device sends only after its own barrier, so no signal
from a neighbour's next call can arrive early.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import jax
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels._barrier import meet
from safedma.kernels._call import hbm_call
from safedma.kernels._preconditions import (
    LANES,
    check_axis,
    check_block,
    check_collective_id,
    check_int,
)
from safedma.kernels._ring import RECV_SLOTS, RingDirection
from safedma.kernels._typed_jax import fori_loop

__all__ = [
    "RECV_SLOTS",
    "all_gather",
    "all_gather_bidirectional",
    "all_gather_bidirectional_kernel",
    "all_gather_kernel",
]


_Span: TypeAlias = slice | pl.Slice
"""What ``pl.ds`` returns (typed ``slice | Slice`` by jax 0.10, ``Slice`` by 0.12)."""


def _window(ref: sd.DataRef, windows: Mapping[int, _Span]) -> sd.DataRef:
    """``ref`` restricted to ``windows`` (dimension -> slice); other dimensions whole."""
    return ref.at[tuple(windows.get(d, slice(None)) for d in range(len(ref.shape)))]


def all_gather_kernel(
    x_ref: sd.DataRef,
    o_ref: sd.DataRef,
    local_sem: sd.SemRef,
    send_sem: sd.SemRef,
    recv_sems: sd.SemArray,
    capacity: sd.RegularSem,
    *,
    axis: str,
    concat_axis: int,
    barrier: bool,
) -> None:
    """The ring kernel body: ``o_ref`` gathers every device's ``x_ref`` along ``concat_axis``.

    ``recv_sems`` holds :data:`RECV_SLOTS` DMA semaphores; ``capacity`` is a
    REGULAR semaphore; ``concat_axis`` is non-negative; ``barrier=True``
    needs a ``collective_id``. Bind the keyword arguments with
    ``functools.partial``.
    """
    n = sd.axis_size(axis)
    me = sd.my_index(axis)
    size = x_ref.shape[concat_axis]

    def slot(owner: jax.Array) -> sd.DataRef:
        return _window(o_ref, {concat_axis: pl.ds(owner * size, size)})

    own = sd.LocalCopy(x_ref, slot(me), local_sem).start()
    if n > 1:
        steps = n - 1
        ring = RingDirection(
            sd.neighbour(axis, 1), sd.neighbour(axis, -1), send_sem, recv_sems, capacity
        )
        if barrier:
            meet(sd.barrier_semaphore(), ring.upstream, ring.downstream)

        # Each wait() covers our send and the same-sized copy from the left
        # neighbour, which lands in slot owner - 1 on the same semaphore.
        ring.send(x_ref, slot(me), 0).wait()
        ring.received(0, steps)

        def step_body(step: jax.Array, carry: None) -> None:
            owner = (me - step + n) % n  # received in step - 1
            ring.send(slot(owner), slot(owner), step).wait()
            ring.received(step, steps)
            return carry

        fori_loop(1, steps, step_body, None)
    own.wait()


def all_gather_bidirectional_kernel(
    x_ref: sd.DataRef,
    o_ref: sd.DataRef,
    local_sem: sd.SemRef,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    capacity: sd.RegularSemArray,
    *,
    axis: str,
    concat_axis: int,
    split_axis: int,
    barrier: bool,
) -> None:
    """The bidirectional kernel body: first halves travel right, second halves left.

    Index 0 of each semaphore array is the rightward direction, 1 the
    leftward: ``send_sems`` and ``capacity`` hold two semaphores,
    ``recv_sems`` ``2 * RECV_SLOTS`` (rightward first). Both axes are
    non-negative; ``barrier=True`` needs a ``collective_id``. Bind the
    keyword arguments with ``functools.partial``.
    """
    n = sd.axis_size(axis)
    me = sd.my_index(axis)
    size = x_ref.shape[concat_axis]
    half = x_ref.shape[split_axis] // 2

    def part(which: int) -> dict[int, _Span]:
        return {split_axis: pl.ds(which * half, half)}

    def piece(owner: jax.Array, which: int) -> sd.DataRef:
        """Half ``which`` (0: first, 1: second) of device ``owner``'s slot in the output."""
        if split_axis == concat_axis:
            return _window(o_ref, {concat_axis: pl.ds(owner * size + which * half, half)})
        return _window(o_ref, {concat_axis: pl.ds(owner * size, size), **part(which)})

    own = sd.LocalCopy(
        x_ref, _window(o_ref, {concat_axis: pl.ds(me * size, size)}), local_sem
    ).start()
    if n > 1:
        steps = n - 1
        right, left = sd.neighbour(axis, 1), sd.neighbour(axis, -1)
        rightward = RingDirection(
            right, left, send_sems.at[0], recv_sems.at[pl.ds(0, RECV_SLOTS)], capacity.at[0]
        )
        leftward = RingDirection(
            left,
            right,
            send_sems.at[1],
            recv_sems.at[pl.ds(RECV_SLOTS, RECV_SLOTS)],
            capacity.at[1],
        )
        if barrier:
            meet(sd.barrier_semaphore(), left, right)

        def step(
            src_right: sd.DataRef,
            src_left: sd.DataRef,
            owner_right: jax.Array,
            owner_left: jax.Array,
            index: int | jax.Array,
        ) -> None:
            # As in the ring, each wait() also covers the same-sized copy
            # coming the other way into this device, on the same semaphore.
            to_right = rightward.send(src_right, piece(owner_right, 0), index)
            to_left = leftward.send(src_left, piece(owner_left, 1), index)
            to_right.wait()
            to_left.wait()
            rightward.received(index, steps)
            leftward.received(index, steps)

        step(_window(x_ref, part(0)), _window(x_ref, part(1)), me, me, 0)

        def step_body(index: jax.Array, carry: None) -> None:
            from_left = (me - index + n) % n  # first halves, received in step index - 1
            from_right = (me + index) % n  # second halves, received in step index - 1
            step(piece(from_left, 0), piece(from_right, 1), from_left, from_right, index)
            return carry

        fori_loop(1, steps, step_body, None)
    own.wait()


# ------------------------------------------------------------------ wrappers


def _check_dim(value: object, ndim: int, name: str, kernel: str) -> int:
    dim = check_int(value, name, kernel)
    if not -ndim <= dim < ndim:
        raise ValueError(f"{kernel}: {name}={dim} is out of range for a {ndim}-D block")
    return dim % ndim


def _check_window(x: jax.Array, dim: int, extent: int, what: str, kernel: str) -> None:
    """``extent`` elements along ``dim`` must be a window the TPU DMA engine can address."""
    ndim = x.ndim
    dtype = np.dtype(x.dtype)
    if dim == ndim - 1 and extent % LANES:
        raise ValueError(
            f"{kernel}: {what} spans {extent} elements of the last dimension; on TPU a "
            f"window there must be a multiple of {LANES} (the lanes of a tile). Gather "
            "along another dimension, or pad the block."
        )
    packing = 4 // dtype.itemsize
    if dim == ndim - 2 and extent % packing:
        raise ValueError(
            f"{kernel}: {what} spans {extent} rows of the second-to-last dimension; on TPU "
            f"a window there must be a multiple of {packing} for {dtype.name} ({packing} "
            "rows share a 32-bit word). Gather along another dimension, or pad the block."
        )


def _prepare(
    x: jax.Array, axis: str, concat_axis: int, collective_id: int | None, kernel: str
) -> tuple[int, int, jax.ShapeDtypeStruct]:
    """Checks shared by both all-gathers: (axis size, concat axis, output shape)."""
    n = check_axis(axis, kernel)
    check_block(x, kernel)
    if x.ndim < 2:
        raise ValueError(
            f"{kernel}: the block must have at least two dimensions (TPU HBM arrays are "
            f"tiled in their last two); got shape {tuple(x.shape)}. Reshape it, e.g. to "
            "(1, size) or (size // 128, 128)."
        )
    concat = _check_dim(concat_axis, x.ndim, "concat_axis", kernel)
    _check_window(x, concat, x.shape[concat], "the block along concat_axis", kernel)
    check_collective_id(collective_id, kernel, optional=True)
    shape = list(x.shape)
    shape[concat] *= n
    return n, concat, jax.ShapeDtypeStruct(tuple(shape), x.dtype)


def all_gather(
    x: jax.Array,
    *,
    axis: str,
    concat_axis: int = 0,
    collective_id: int | None = None,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """Every device's block along ``axis``, concatenated along ``concat_axis``, by a ring.

    The result is ``jax.lax.all_gather(x, axis, axis=concat_axis, tiled=True)``.
    Call it inside ``jax.shard_map``. ``collective_id`` switches on the
    kernel's own neighbour barrier (see the module docstring). Raises
    ``ValueError`` when a precondition fails.
    """
    n, concat, out = _prepare(x, axis, concat_axis, collective_id, "all_gather")
    barrier = n > 1 and collective_id is not None
    call = hbm_call(
        all_gather_kernel,
        out,
        scratch_shapes=[
            sd.dma_semaphore(),
            sd.dma_semaphore(),
            sd.dma_semaphores(RECV_SLOTS),
            sd.regular_semaphore(),
        ],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="all_gather",
        axis=axis,
        concat_axis=concat,
        barrier=barrier,
    )
    return call(x)


def all_gather_bidirectional(
    x: jax.Array,
    *,
    axis: str,
    concat_axis: int = 0,
    split_axis: int = 0,
    collective_id: int | None = None,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """:func:`all_gather`, with half of each block (along ``split_axis``) going each way.

    Same result as :func:`all_gather`; ``x.shape[split_axis]`` must be even
    and its half a valid TPU window (see the module docstring). Raises
    ``ValueError`` when a precondition fails.
    """
    kernel = "all_gather_bidirectional"
    n, concat, out = _prepare(x, axis, concat_axis, collective_id, kernel)
    split = _check_dim(split_axis, x.ndim, "split_axis", kernel)
    if x.shape[split] % 2:
        raise ValueError(
            f"{kernel}: split_axis={split_axis} has odd size {x.shape[split]}; the block is "
            "split in two halves along it"
        )
    _check_window(x, split, x.shape[split] // 2, "half the block along split_axis", kernel)
    barrier = n > 1 and collective_id is not None
    call = hbm_call(
        all_gather_bidirectional_kernel,
        out,
        scratch_shapes=[
            sd.dma_semaphore(),
            sd.dma_semaphores(2),
            sd.dma_semaphores(2 * RECV_SLOTS),
            sd.regular_semaphores(2),
        ],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="all_gather_bidirectional",
        axis=axis,
        concat_axis=concat,
        split_axis=split,
        barrier=barrier,
    )
    return call(x)
