"""The neighbour barrier the collective kernels start with.

A device may only write into a peer's buffers or signal its semaphores once
the peer has entered the kernel. One barrier round tells both peers this
device is here and waits until both said the same.
"""

from __future__ import annotations

import safedma as sd

__all__ = ["meet", "neighbour_barrier"]


def meet(sem: sd.RegularSem | sd.BarrierSem, first: sd.Device, second: sd.Device) -> None:
    """One barrier round on ``sem``: signal ``first`` and ``second``, wait for both signals.

    ``first`` and ``second`` may be the same device (a ring of two): it is
    signalled twice, and signals this device twice.
    """
    sd.signal(sem, 1, device=first)
    sd.signal(sem, 1, device=second)
    sd.wait(sem, 2)


def neighbour_barrier(axis: str) -> None:
    """Wait until both ring neighbours along ``axis`` have entered the kernel.

    Signals the barrier semaphore on the left and then the right neighbour
    and waits for both signals. Needs a ``collective_id`` in the
    ``pallas_call``'s compiler parameters.
    """
    # meet(), spelled out: each neighbour's id is computed right before its signal, as
    # the hand-written pltpu version does, so both lower to the same Mosaic.
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, 1, device=sd.neighbour(axis, -1))
    sd.signal(barrier, 1, device=sd.neighbour(axis, 1))
    sd.wait(barrier, 2)
