"""How much a DMA wait needs its semaphore to hold, per backend, from the wait's own descriptor.

A DMA semaphore counts what landed in different units on each backend:

* on a TPU chip, units of 32 bytes, the last (lane) dimension padded to a
  multiple of 128 elements, no other padding (measured on a v5e for local
  copies HBM<->VMEM, HBM->HBM and HBM<->SMEM, itemsizes 1, 2 and 4):
  ``prod(shape[:-1]) * roundup(shape[-1], 128) * itemsize / 32``;
* in jax's TPU interpreter (``interpret=pltpu.InterpretParams(...)``), bytes;
* in jax's generic interpreter (``interpret=True``), elements.

The spin before a wait waits for the count to reach this amount, so on the
chip it must never exceed what the copy really adds, or a correct wait would
be reported as a hang. Shapes outside the measured families get a lower bound
instead: the unpadded size in 32-byte units (padding only adds), and 1 for a
remote copy (its units were not measured; a count of 0 still shows a hang).
"""

from __future__ import annotations

import enum
import math

__all__ = ["Backend", "amount", "exact_on_chip", "unit_name"]

_LANES = 128
_CHIP_UNIT_BYTES = 32


class Backend(enum.Enum):
    """Where the kernel runs, which decides what a semaphore count means."""

    CHIP = "chip"
    TPU_INTERPRET = "tpu_interpret"
    HLO_INTERPRET = "hlo_interpret"

    @property
    def interpreted(self) -> bool:
        return self is not Backend.CHIP


def exact_on_chip(shape: tuple[int, ...], itemsize: int, remote: bool) -> bool:
    """Whether the chip formula was measured for copies of this shape and itemsize."""
    if remote or not shape:
        return False
    if itemsize == 4:
        return True
    return itemsize in (1, 2) and shape[-1] % _LANES == 0


def amount(shape: tuple[int, ...], itemsize: int, backend: Backend, remote: bool) -> int:
    """What a wait on a copy of ``shape`` needs the semaphore to hold on ``backend``."""
    elements = math.prod(shape)
    if backend is Backend.HLO_INTERPRET:
        return elements
    if backend is Backend.TPU_INTERPRET:
        return elements * itemsize
    if elements == 0:
        return 0
    if remote:
        return 1
    if exact_on_chip(shape, itemsize, remote):
        lanes = -(-shape[-1] // _LANES) * _LANES
        return math.prod(shape[:-1]) * lanes * itemsize // _CHIP_UNIT_BYTES
    return max(1, elements * itemsize // _CHIP_UNIT_BYTES)


def unit_name(backend: Backend) -> str:
    """The unit of a DMA semaphore count on ``backend``, for messages."""
    if backend is Backend.TPU_INTERPRET:
        return "bytes"
    if backend is Backend.HLO_INTERPRET:
        return "elements"
    return "DMA units of 32 bytes"
