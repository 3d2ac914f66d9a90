"""The on-chip DMA sanitizer: kernels that report their DMA mistakes instead of hanging.

``sd.pallas_call(..., sanitize=True)`` (or ``@sd.checked(sanitize=True)`` on the
body, or ``SAFEDMA_SANITIZE=1`` for every safedma entry point) instruments the
kernel from its jaxpr: a wait that would hang spins a bounded time and becomes
a ``DeadlockError``, a semaphore left non-zero a ``LeftoverSemaphoreError``, a
dynamic copy window or semaphore index out of bounds an ``OutOfBoundsDmaError``
/ ``SemaphoreIndexError`` before the copy is issued, a device id outside the mesh
a ``DeviceOutsideMeshError`` before the copy or signal. The kernel records its
first mistake in an SMEM output the sanitizer adds to the call; the host
decodes it after the call. Off (the default), nothing changes: the same Mosaic.

Modules, one job each: ``_options`` (on or off, the spin bound), ``_units``
(what a wait needs per backend), ``_flags`` (the SMEM words and their writes),
``_sites`` (what each check knows at trace time), ``_device_ids`` (a remote
operation's device id as coordinates to check), ``_instrument`` (the jaxpr
re-emitted with the checks), ``_call`` (the call with its flags output),
``_report`` (flags to errors, eagerly and under jit), ``_jax`` (every jax
internal used), ``_errors`` (what the sanitizer raises itself).
"""

from __future__ import annotations

from safedma._sanitize._options import Sanitize, SanitizeOptions, resolve

__all__ = [
    "Sanitize",
    "SanitizeOptions",
    "for_body",
    "for_call",
]


def for_call(given: Sanitize, body: object) -> SanitizeOptions | None:
    """The options a ``sd.pallas_call`` runs with: its ``sanitize=``, else what
    ``@sd.checked(sanitize=...)`` put on the body, else the environment."""
    if given is not None:
        return resolve(given)
    from safedma._sanitize._call import requested_by_body  # noqa: PLC0415

    marked = requested_by_body(body)
    if marked is not None:
        return resolve(marked)
    return resolve(None)


def for_body(sanitize: Sanitize) -> SanitizeOptions | bool | None:
    """What ``@sd.checked(sanitize=...)`` marks its body with (None: nothing)."""
    if sanitize is None:
        return None
    options = resolve(sanitize)
    return False if options is None else options
