"""Private jax modules, imported on first use, failing with a message when a name moved.

jax announces the removal of internals that safedma reads because they have no public
spelling (a semaphore's dtype, the trace being recorded, ``DeviceIdType``). A seam binds
each private module through :class:`PrivateModule`: nothing is imported or read when the
seam is imported, so a jax release that dropped a name cannot break ``import safedma`` or
a module that never uses it, and the first use of a missing name raises
:class:`~safedma.PrivateJaxApiError` naming it, instead of an ``AttributeError`` deep in
a check. This module names no jax internal itself; the seams pass the names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType
from typing import Any

from safedma._errors import PrivateJaxApiError

__all__ = [
    "TESTED_JAX_VERSIONS",
    "PrivateModule",
    "installed_jax",
    "missing_private_name",
    "optional_name",
]

#: The jax releases the suite runs on (the private names were written against these).
TESTED_JAX_VERSIONS: tuple[str, ...] = ("0.10.2", "0.11.2", "0.12.0.1")


def installed_jax() -> str:
    """The installed jax's version, read without importing jax."""
    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def missing_private_name(name: str, detail: object, user: str = "safedma") -> PrivateJaxApiError:
    """The error for a private jax name ``name`` that the installed jax does not provide."""
    return PrivateJaxApiError(
        f"{user} needs the private jax name {name}, which jax {installed_jax()} does not "
        f"provide ({detail}). safedma is tested with jax {', '.join(TESTED_JAX_VERSIONS)}: "
        "install one of those (pip install 'jax>=0.10.2,<0.13'), or report this jax "
        "release at https://github.com/safedma/safedma/issues so that safedma can follow it."
    )


class PrivateModule:
    """A private jax module, imported on its first attribute read; each name it gives is
    kept, so later reads cost a plain attribute look-up. ``user`` is who the error names
    as needing it (``safedma.testing`` for the testing helpers' seams)."""

    def __init__(self, name: str, user: str = "safedma") -> None:
        self._name = name
        self._user = user
        self._module: ModuleType | None = None

    def loaded(self) -> ModuleType:
        """The module itself, imported now: for a seam that patches it (an attribute set
        on this proxy would not reach jax)."""
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ImportError as err:
                raise missing_private_name(self._name, err, self._user) from err
        return self._module

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy, pickle and the like probe these: not jax's
            raise AttributeError(attr)
        try:
            value: object = getattr(self.loaded(), attr)
        except AttributeError:
            raise missing_private_name(f"{self._name}.{attr}", "name missing", self._user) from None
        setattr(self, attr, value)  # the next read does not come here
        return value


def optional_name(module: object, name: str) -> Any:
    """``module.name``, or None where the installed jax lacks it by design (a name one
    supported jax has and another has not); a module that cannot be imported still
    raises :class:`~safedma.PrivateJaxApiError`."""
    if isinstance(module, PrivateModule):
        module = module.loaded()
    return getattr(module, name, None)
