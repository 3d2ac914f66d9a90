"""REGULAR and BARRIER semaphore operations, typed.

DMA semaphores are signalled by copies and waited through copy handles;
REGULAR semaphores carry handshakes between kernels' steps and devices
(``signal`` / ``wait``); the BARRIER semaphore synchronises the devices of a
collective. Passing one kind where another belongs is a type error, and a
trace-time :class:`~safedma._errors.SemaphoreKindError` for unchecked code.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import cast

import jax
import jax.numpy as jnp

from safedma import _compat
from safedma._checks import check_semaphore
from safedma._compat import SemaphoreKind
from safedma._scope import current_config
from safedma._devices import Device
from safedma._errors import (
    DeviceIdError,
    InvalidAmountError,
    MissingCollectiveIdError,
    UnsupportedByJaxError,
)
from safedma._refs import BarrierSem, Index, RegularSem, SemRef

__all__ = ["signal", "wait", "read", "barrier_semaphore"]

_SIGNALLABLE = (SemaphoreKind.REGULAR, SemaphoreKind.BARRIER)


def check_amount(value: object, name: str) -> None:
    """A semaphore amount (an increment, a wait value, a count) is an integer scalar."""
    if isinstance(value, bool) or not isinstance(value, (int, jax.Array)):
        raise InvalidAmountError(
            f"{name} must be an int or an integer jax array, got {type(value).__name__} {value!r}."
        )
    if isinstance(value, jax.Array) and (
        value.shape != () or not jnp.issubdtype(value.dtype, jnp.integer)
    ):
        raise InvalidAmountError(
            f"{name} must be an integer scalar, got shape {value.shape} dtype {value.dtype}."
        )


def signal(sem: RegularSem | BarrierSem, inc: Index = 1, *, device: Device | None = None) -> None:
    """Add ``inc`` to ``sem`` on this device, or on ``device`` when given.

    A remote signal names its target with a :class:`~safedma.Device`; without
    one, the signal is local.
    """
    check_semaphore(sem, "signal() semaphore", _SIGNALLABLE, what_for="semaphore signal")
    check_amount(inc, "signal() increment")
    # Checked at run time too, for callers without a type checker.
    if device is not None and not isinstance(cast(object, device), Device):
        raise DeviceIdError(
            f"signal(device=...) takes a safedma.Device, got {type(device).__name__} "
            f"{device!r}. Build one with safedma.device(x=i) or safedma.neighbour('x')."
        )
    _compat.semaphore_signal(sem, inc, None if device is None else device.pltpu_device_id)


def wait(sem: RegularSem | BarrierSem, value: Index = 1) -> None:
    """Block until ``sem`` holds at least ``value``, then subtract ``value``.

    DMA semaphores are waited through the copy's handle instead.
    """
    check_semaphore(sem, "wait() semaphore", _SIGNALLABLE, what_for="semaphore wait")
    check_amount(value, "wait() value")
    _compat.semaphore_wait(sem, value)


def read(sem: RegularSem | SemRef | BarrierSem) -> jax.Array:
    """The current count of ``sem``, as a value (never usable as a semaphore)."""
    check_semaphore(
        sem,
        "read() semaphore",
        (SemaphoreKind.REGULAR, SemaphoreKind.DMA, SemaphoreKind.BARRIER),
        what_for="read()",
    )
    return _compat.semaphore_read(sem)


def barrier_semaphore(tag: Hashable | None = None) -> BarrierSem:
    """The kernel's barrier semaphore, shared by the devices of one collective.

    jax must know which barrier: from the kernel's ``collective_id``, from
    ``tag`` (jax 0.12+: kernels with the same tag share one barrier, and jax
    assigns its id), or from jax's auto-assigned ids (jax 0.12+, config
    ``jax_pallas_auto_assign_collective_ids``). Under
    :func:`safedma.pallas_call` a kernel with none of these fails here, at
    trace time.
    """
    if not isinstance(tag, Hashable):
        raise TypeError(
            f"safedma.barrier_semaphore(): tag must be hashable (a str or an int, say), got "
            f"{type(tag).__name__} {tag!r}. Kernels with equal tags share one barrier."
        )
    if tag is not None and not _compat.barrier_tags_supported():
        raise UnsupportedByJaxError(
            f"barrier_semaphore(tag={tag!r}) needs a jax whose get_barrier_semaphore takes "
            f"a tag (0.11 or later; jax {_compat.jax_version()} is installed, and its "
            "get_barrier_semaphore takes no tag). Drop the tag and pass "
            "compiler_params=pltpu.CompilerParams(collective_id=...) instead."
        )
    config = current_config()
    if (
        config is not None
        and config.collective_id is None
        and tag is None
        and not _compat.auto_collective_ids()
    ):
        later = (
            ", name the barrier with barrier_semaphore(tag=...), or let jax assign ids "
            "(jax.config.update('jax_pallas_auto_assign_collective_ids', 'yes'))"
            if _compat.barrier_tags_supported()
            else ""
        )
        raise MissingCollectiveIdError(
            "barrier_semaphore() is used, but the kernel has no collective_id: pass "
            "compiler_params=pltpu.CompilerParams(collective_id=0) (any int, unique among "
            "the collectives running at once) to the call that runs the kernel (safedma.pallas_call "
            f"or pl.pallas_call; safedma.core_kernel, pl.kernel or pl.core_map){later}."
        )
    return cast(BarrierSem, _compat.barrier_semaphore(tag))
