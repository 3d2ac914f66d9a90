"""A copy or signal aimed at a device id outside the mesh, seen inside jax's interpreter.

jax's TPU interpreter does not check a target device id: an id one past the mesh fails
later with a bare ``KeyError`` or ``IndexError`` from its own tables, and ``-1`` silently
reaches the last device. simulate's probes raise :class:`OffMeshTarget` instead, before
the copy or signal runs; :mod:`._diagnosis` turns it into the
:class:`~safedma.testing.DeviceOutsideMeshError` that names the line, the id and the fix.
"""

from __future__ import annotations

__all__ = ["OffMeshTarget", "check_target"]


class OffMeshTarget(Exception):
    """Raised in a device thread for a target outside the ``devices`` of the run."""

    def __init__(
        self, operation: str, sender: int, target: int, devices: int, location: str | None
    ) -> None:
        super().__init__(f"{operation} from device {sender} to device id {target} of {devices}")
        self.operation = operation
        self.sender = sender
        self.target = target
        self.devices = devices
        self.location = location


def check_target(
    operation: str, sender: int, target: int, devices: int, location: str | None
) -> None:
    """Raise :class:`OffMeshTarget` unless ``0 <= target < devices``."""
    if not 0 <= target < devices:
        raise OffMeshTarget(operation, sender, target, devices, location)
