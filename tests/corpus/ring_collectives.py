"""Ring collectives and remote copies: blocks sent around a ring, receive slots reused
under flow control, chunks spread over semaphore slots.

* credit flow control on a REGULAR semaphore (the protocol of safedma's reduce-scatter
  and all-reduce, reduced to a ring of six messages over two receive slots): a slot is
  reused only after the receiver read it and returned a credit; the bug skips the credit
  wait from message 2 on (R1; a correct kernel verify once rejected);
* :func:`chunked_ring_program`: a block sent in chunks to the device ``shift`` along the
  ring, chunk c on semaphore slot ``c % slots``, with seeded drops and shifted waits
  (the property tests' family; written for this suite);
* :func:`local_ring`: a clean ring permute;
* a ring permute to a LOGICAL device id, and a static logical id outside the mesh;
* wrong device ids: a ring permute whose wraparound names device 1 instead of 0 (two
  copies land on device 1, none on device 0), a pairwise exchange in which odd devices
  send to themselves; each message names the line that computed the id (written for
  this suite);
* jax ops/tpu all_gather: clean on 2 devices, a race on 4 (it relies on in-order
  delivery between neighbours).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import (
    ALL,
    AXIS,
    BLOCK,
    CHUNK,
    F32,
    Pair,
    caught,
    sanitized,
    dma,
    neighbour,
    send_right,
    write_out,
)
from tests.corpus._calls import on_ring
from tests.corpus._case import OK, Case, Ok, Program, Raises, ring

D = sd.DataRef
S = sd.SemRef

CREDIT_MESSAGES = 6


def credit_ring_pltpu(
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
            device_id=neighbour(1),
        )

    pl.semaphore_signal(credits, 2, device_id=neighbour(-1))
    for t in range(CREDIT_MESSAGES):
        if not bug or t < 2:
            pl.semaphore_wait(credits, 1)
        if t >= 2:
            message(t - 2).wait_send()
        message(t).start()  # fix: credit_ring
        message(t).wait_recv()
        res[pl.ds(t * rows, rows)] = bufs[t % 2]  # fix: credit_ring
        if t + 2 < CREDIT_MESSAGES:
            pl.semaphore_signal(credits, 1, device_id=neighbour(-1))
    for t in range(max(CREDIT_MESSAGES - 2, 0), CREDIT_MESSAGES):
        message(t).wait_send()
    write_out(res, o_ref, out_sem)


def credit_ring_safedma(
    x_ref: D,
    o_ref: D,
    bufs: D,
    res: D,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    credits: sd.RegularSem,
    out_sem: S,
    *,
    bug: bool,
) -> None:
    messages = CREDIT_MESSAGES
    rows = x_ref.shape[0] // messages

    def message(t: int) -> sd.RemoteCopy[sd.Given, sd.Given]:
        slot = t % 2
        return (
            sd.RemoteCopy(x_ref.at[pl.ds(t * rows, rows)], bufs.at[slot], recv_sems.at[slot])
            .with_send_sem(send_sems.at[slot])
            .to(sd.neighbour(AXIS))
        )

    sd.signal(credits, 2, device=sd.neighbour(AXIS, -1))
    for t in range(messages):
        if not bug or t < 2:  # the bug skips the credit wait from message 2 on
            sd.wait(credits, 1)
        if t >= 2:
            message(t - 2).started_elsewhere().wait_send()
        message(t).start().wait_recv()  # fix: credit_ring
        res[pl.ds(t * rows, rows)] = bufs[t % 2]  # fix: credit_ring
        if t + 2 < messages:
            sd.signal(credits, 1, device=sd.neighbour(AXIS, -1))
    for t in range(max(messages - 2, 0), messages):
        message(t).started_elsewhere().wait_send()
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


# ---------------------------------------------------------------- chunked rings


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
            device_id=neighbour(shift),
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
    write_out(buf, o_ref, out_sem)


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


def local_ring(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    """A clean ring permute."""
    send_right(x_ref, o_ref, send, recv)


# Flow control by credits on a REGULAR semaphore (safedma's reduce-scatter and
# all-reduce use it): reusing a receive slot is safe because the credit that allows
# it is issued after the slot was read.
PAIRS = (
    Pair(
        "credit_ring",
        "R1",
        "false_alarm",
        lambda: [
            pltpu.VMEM((2, CHUNK, BLOCK[1]), F32),
            pltpu.VMEM((6 * CHUNK, BLOCK[1]), F32),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.REGULAR,
            *dma(),
        ],
        credit_ring_safedma,
        credit_ring_pltpu,
        caught(
            r"Race|Leftover|AfterExit",
            r"(?i)race|not ordered|not back to zero",
            ALL,
            ("bufs", "credits"),
            r"(?i)wait|signal",
        ),
        provenance="safedma.kernels reduce_scatter and all_reduce (credit flow control), reduced",
        rows=6 * CHUNK,
        simulate_bug="RaceDetectedError",
        slow_simulate=True,
        # The credits the last round signals are never waited: left on the REGULAR
        # semaphore at exit (the race itself is not visible to it).
        sanitize_bug=sanitized("LeftoverSemaphoreError", ALL, ("credits",), line=False),
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("ring_collectives")]


# ---------------------------------------------------------------- LOGICAL device ids


def logical_send(x: D, o: D, send: S, recv: S) -> None:
    target = (sd.my_index("x") + 1) % 4
    copy = sd.RemoteCopy(x, o, recv).with_send_sem(send).to(sd.logical_device(target))
    copy.start().wait()


def logical_send_raw(x: Any, o: Any, send: Any, recv: Any) -> None:
    target = (jax.lax.axis_index("x") + 1) % 4
    c = pltpu.make_async_remote_copy(
        x, o, send, recv, device_id=target, device_id_type=pl.DeviceIdType.LOGICAL
    )
    c.start()
    c.wait_send()
    c.wait_recv()


def logical_send_outside_the_mesh(x: D, o: D, send: S, recv: S) -> None:
    sd.RemoteCopy(x, o, recv).with_send_sem(send).to(
        sd.logical_device(4)
    ).start().wait()  # fix: logical_device_outside_the_mesh


_TWO_DMA = [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())]

CASES += [
    Case(
        "ring_permute_to_a_logical_device",
        "ring_collectives",
        "jax Pallas distributed guide (LOGICAL device ids), written for this suite",
        lambda: on_ring(logical_send, [sd.dma_semaphore(), sd.dma_semaphore()]),
        {"mosaic": OK},
        twin=lambda: on_ring(logical_send_raw, _TWO_DMA, checked=False),
    ),
    Case(
        "logical_device_outside_the_mesh",
        "ring_collectives",
        "written for this suite",
        lambda: on_ring(logical_send_outside_the_mesh, [sd.dma_semaphore(), sd.dma_semaphore()]),
        {"trace": Raises("^DeviceIdError$", says=("outside",), line=False)},
    ),
]


# ---------------------------------------------------------------- jax's all-gather


def jax_all_gather_module() -> Any:
    from jax.experimental.pallas.ops.tpu import all_gather

    return all_gather


def jax_all_gather(n: int, *, real_mesh: bool = False) -> Program:
    """jax's all-gather as a program with its own shard_map over ``n`` devices.

    Device-free: an abstract mesh and a ShapeDtypeStruct. Real: a simulated mesh and the
    input split over it, exactly as simulate takes it (the mesh's axes are Explicit in
    jax 0.12, so the input must be split).
    """
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from safedma.testing import abstract_mesh, simulated_mesh
    from tests.corpus._seeding import unjitted

    module = jax_all_gather_module()
    shape = (n * 16, 128)
    mesh: Any
    x: Any
    if real_mesh:
        mesh = simulated_mesh(n, "x")
        x = jax.device_put(
            jnp.arange(shape[0] * shape[1], dtype=jnp.float32).reshape(shape),
            NamedSharding(mesh, P("x")),
        )
    else:
        mesh = abstract_mesh((n,), ("x",))
        x = jax.ShapeDtypeStruct(shape, jnp.float32)

    def program(x: jax.Array) -> jax.Array:
        out: jax.Array = unjitted(module.all_gather)(x, mesh=mesh, axis_name="x")
        return out

    return Program(program, (x,))


def _every_device_gathers(report: Any, program: Program) -> None:
    assert report.devices == 2 and report.remote_dmas > 0, report


CASES += [
    Case(
        "jax_all_gather_on_2",
        "ring_collectives",
        "jax ops/tpu all_gather",
        lambda: jax_all_gather(2),
        {"verify": Ok(check=_every_device_gathers)},
    ),
    # On 4 devices jax's all-gather is a race under the TPU semantics verify models (a
    # wait of N bytes guarantees only the copies whose bytes it cannot do without): a
    # device may start its step-1 send as soon as its own step-0 copies are done, so two
    # same-sized copies from it are in flight on its right neighbour's recv_sem[1]; the
    # neighbour's step-0 wait can be satisfied by the step-1 bytes, and it then forwards
    # the slot whose step-0 copy may not have landed. The kernel relies on copies between
    # two neighbours landing in order; safedma's ring kernels bound the run-ahead with a
    # capacity handshake instead.
    Case(
        "jax_all_gather_on_4",
        "ring_collectives",
        "jax ops/tpu all_gather",
        lambda: jax_all_gather(4),
        {
            "verify": Raises(
                "RaceDetectedError", says=("all_gather.py:",), kind="SimulationError", line=False
            )
        },
    ),
]


# ---------------------------------------------------------------- wrong device ids


def _peer(me: jax.Array, n: jax.Array, mistake: str) -> jax.Array:
    """The device this one sends its block to: its right neighbour (``wraparound``: the
    last device's wraps to 1, not 0), or its partner in a pairwise exchange
    (``self_send``: odd devices name themselves, not ``me - 1``)."""
    if mistake == "wraparound":
        return jnp.where(me == n - 1, 1, me + 1)  # fix: wrong_device_id_wraparound
    if mistake == "self_send":
        return jnp.where(me % 2 == 0, me + 1, me)  # fix: wrong_device_id_self_send
    if mistake == "pairs":
        return jnp.where(me % 2 == 0, me + 1, me - 1)
    return lax.rem(me + 1, n)


def send_to_peer_pltpu(
    x_ref: Any, o_ref: Any, buf: Any, send: Any, recv: Any, out_sem: Any, *, mistake: str
) -> None:
    """Send this device's block into its peer's ``buf``, wait both sides, copy ``buf``
    out: every device sends one block and receives one when the ids are right."""
    me = lax.axis_index("x")
    n = lax.axis_size("x")
    peer = _peer(me, n, mistake)
    copy = pltpu.make_async_remote_copy(x_ref, buf, send, recv, device_id={"x": peer})
    copy.start()
    copy.wait()
    write_out(buf, o_ref, out_sem)


def send_to_peer_safedma(
    x_ref: D, o_ref: D, buf: D, send: S, recv: S, out_sem: S, *, mistake: str
) -> None:
    peer = _peer(sd.my_index("x"), sd.axis_size("x"), mistake)
    sd.RemoteCopy(x_ref, buf, recv).with_send_sem(send).to(sd.device(x=peer)).start().wait()
    sd.LocalCopy(buf, o_ref, out_sem).start().wait()


def _send_to_peer(kernel: Any, *, safedma: bool, mistake: str) -> Program:
    from tests.corpus._blocks import BLOCK, RING, kernel_call

    body = functools.partial(kernel, mistake=mistake)
    functools.update_wrapper(body, kernel)
    per_device = kernel_call(
        body,
        lambda: [pltpu.VMEM(BLOCK, F32), *dma(3)],
        name=f"send_to_peer_{mistake}",
        safedma=safedma,
    )
    spec = jax.ShapeDtypeStruct((BLOCK[0] * RING, BLOCK[1]), F32)
    return Program(per_device, (spec,), ring(RING, "x"))


# verify's error is where the bytes land (a race on the buf of a device two copies
# reach, a wait no copy feeds); the line it names is _peer's, where the id is computed.
_WRONG_ID = {
    "wraparound": Raises(
        "RaceDetectedError|UnsatisfiableWaitError|LeftoverSemaphoreError",
        says=("its device id is computed at",),
        kind="SimulationError",
    ),
    "self_send": Raises(
        "RaceDetectedError|UnsatisfiableWaitError|LeftoverSemaphoreError",
        says=("its device id is computed at",),
        kind="SimulationError",
    ),
}

CASES += [
    Case(
        f"wrong_device_id_{mistake}-bug-{flavour}",
        "ring_collectives",
        "written for this suite",
        functools.partial(
            _send_to_peer,
            send_to_peer_safedma if flavour == "safedma" else send_to_peer_pltpu,
            safedma=flavour == "safedma",
            mistake=mistake,
        ),
        {"verify": verdict},
        fix=f"wrong_device_id_{mistake}",
        tags=frozenset({"wrong_device_id", flavour, "bug"}),
    )
    for mistake, verdict in _WRONG_ID.items()
    for flavour in ("pltpu", "safedma")
]
CASES += [
    Case(
        f"peer_{fixed}-fix-{flavour}",
        "ring_collectives",
        "written for this suite",
        functools.partial(
            _send_to_peer,
            send_to_peer_safedma if flavour == "safedma" else send_to_peer_pltpu,
            safedma=flavour == "safedma",
            mistake=fixed,
        ),
        {"verify": Ok(report={"devices": 4, "remote_dmas": 4})},
        tags=frozenset({"wrong_device_id", flavour, "fix"}),
    )
    for fixed in ("ring", "pairs")
    for flavour in ("pltpu", "safedma")
]
