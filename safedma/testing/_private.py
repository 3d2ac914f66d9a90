"""Finding private JAX names, and failing clearly when a JAX release moved them.

safedma.testing needs a few JAX internals that have no public spelling (the
MLIR context of :mod:`safedma.testing._mosaic`, the interpret-mode probes of
:mod:`safedma.testing._interpret_probes`).  They are looked up through these
helpers, so a JAX release that moved one fails with a
:class:`PrivateJaxApiError` naming what moved and the versions known to work,
instead of an ``AttributeError`` deep in a test.  This module names no private
JAX API itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from safedma._errors import PrivateJaxApiError
from safedma._private_jax import TESTED_JAX_VERSIONS, missing_private_name

__all__ = [
    "TESTED_JAX_VERSIONS",
    "PrivateJaxApiError",
    "moved",
    "private_callable",
    "private_module",
]


def moved(what: str, detail: object) -> PrivateJaxApiError:
    """The error for a private JAX name ``what`` that this JAX does not provide."""
    return missing_private_name(what, detail, "safedma.testing")


def private_module(name: str) -> ModuleType:
    """Import the private JAX module ``name``, or raise :class:`PrivateJaxApiError`."""
    # Some of these (jax._src.lib.tpu) are module attributes bound by the
    # parent's __init__, not importable submodules; accept either.
    parent_name, _, attr = name.rpartition(".")
    try:
        parent = importlib.import_module(parent_name)
    except ImportError as err:
        raise moved(name, err) from err
    value = getattr(parent, attr, None)
    if isinstance(value, ModuleType):
        return value
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise moved(name, err) from err


def private_callable(module: ModuleType, attr: str) -> Callable[..., object]:
    """``module.attr`` if it is callable, or raise :class:`PrivateJaxApiError`."""
    value: object = getattr(module, attr, None)
    if not callable(value):
        raise moved(f"{module.__name__}.{attr}", "attribute missing")
    return value


# The name the tests (and older callers) use.
_private_module = private_module
