"""One direction of a ring with credit-based flow control, shared by the ring kernels.

A device's progress around a ring is gated only by its upstream neighbour, so
without flow control it could run many steps ahead of its downstream
neighbour, and two of its copies in flight on one receive semaphore would mix
their byte counts (a wait could return before its own copy landed). The ring
kernels (all-gather, reduce-scatter, the fused all-reduce's phases) bound the
run-ahead the same way: :data:`RECV_SLOTS` receive slots used in turn
(message ``t`` on slot ``t % RECV_SLOTS``), and a REGULAR "capacity"
semaphore on which the receiver hands a slot back once it has waited the
message in it. Message ``t >= RECV_SLOTS`` is sent only after the receiver
freed the slot of message ``t - RECV_SLOTS``; a slot is freed only when a
later message will reuse it, so every signal is waited and the semaphore
ends at zero. The semaphore count does not grow with the ring.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.experimental import pallas as pl

import safedma as sd

__all__ = ["RECV_SLOTS", "Credits", "RingDirection"]

RECV_SLOTS = 2
"""Receive slots per ring direction: how many messages may be in flight to the next device."""


@dataclasses.dataclass(frozen=True)
class Credits:
    """The flow control of one ring direction, on this device's ``capacity`` semaphore.

    ``capacity`` counts the receive slots the downstream device has freed for
    this device's messages; ``upstream`` is the device whose messages this
    device receives (and to which it hands slots back).
    """

    capacity: sd.RegularSem
    upstream: sd.Device

    def acquire(self, message: int | jax.Array) -> None:
        """Before sending ``message``: wait until its slot is free downstream."""

        @pl.when(message >= RECV_SLOTS)
        def _wait_for_a_free_receive_slot() -> None:
            sd.wait(self.capacity, 1)

    def release(self, message: int | jax.Array, messages: int) -> None:
        """After waiting incoming ``message``: hand its slot back, if a later message reuses it."""

        @pl.when(message + RECV_SLOTS < messages)
        def _free_the_receive_slot() -> None:
            sd.signal(self.capacity, 1, device=self.upstream)


@dataclasses.dataclass(frozen=True, init=False)
class RingDirection:
    """One direction of a ring whose step ``s`` sends one same-sized copy downstream.

    The copies are symmetric (every device sends the same description to its
    downstream neighbour), so a handle's ``wait()`` covers both this device's
    send and the same-sized copy arriving from upstream on the same slot.
    """

    downstream: sd.Device
    send_sem: sd.SemRef
    recv_sems: sd.SemArray
    credits: Credits

    def __init__(
        self,
        downstream: sd.Device,
        upstream: sd.Device,
        send_sem: sd.SemRef,
        recv_sems: sd.SemArray,
        capacity: sd.RegularSem,
    ) -> None:
        object.__setattr__(self, "downstream", downstream)
        object.__setattr__(self, "send_sem", send_sem)
        object.__setattr__(self, "recv_sems", recv_sems)
        object.__setattr__(self, "credits", Credits(capacity, upstream))

    @property
    def upstream(self) -> sd.Device:
        return self.credits.upstream

    def send(self, src: sd.DataRef, dst: sd.DataRef, step: int | jax.Array) -> sd.RemoteHandle:
        """Start this step's copy, once the downstream device can take it."""
        self.credits.acquire(step)
        copy = sd.RemoteCopy(src, dst, self.recv_sems.at[step % RECV_SLOTS])
        return copy.with_send_sem(self.send_sem).to(self.downstream).start()

    def received(self, step: int | jax.Array, steps: int) -> None:
        """This step's incoming copy was waited: free its receive slot upstream."""
        self.credits.release(step, steps)
