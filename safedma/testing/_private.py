"""The only place in safedma.testing that touches private JAX APIs.

Reading a Mosaic kernel back out of a ``tpu_custom_call`` needs an MLIR
context that knows JAX's dialects (to parse the exported StableHLO) and the
Mosaic TPU dialect (to parse the kernel bytecode).  JAX has no public way to
build one, so we borrow ``jax._src.interpreters.mlir`` and ``jax._src.lib.tpu``
here, check that they still have what we need, and fail with a message that
names the JAX version when they moved.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import cast

import jax
from jax.extend.mlir import ir

__all__ = [
    "TESTED_JAX_VERSIONS",
    "PrivateJaxApiError",
    "mosaic_ir_context",
]

#: JAX releases this module was written against and tested with.
TESTED_JAX_VERSIONS: tuple[str, ...] = ("0.10.2", "0.12.0.1")


class PrivateJaxApiError(RuntimeError):
    """A private JAX API that safedma.testing relies on is missing.

    Raised instead of an ``ImportError``/``AttributeError`` deep in a test so
    that the failure says which JAX internals moved and which versions are
    known to work.
    """


def _moved(what: str, detail: object) -> PrivateJaxApiError:
    return PrivateJaxApiError(
        f"safedma.testing needs the private JAX API {what}, which jax "
        f"{jax.__version__} does not provide ({detail}). It is known to work "
        f"with jax {', '.join(TESTED_JAX_VERSIONS)}; update "
        "safedma/testing/_private.py for this JAX release."
    )


def _private_module(name: str) -> ModuleType:
    # Some of these (jax._src.lib.tpu) are module attributes bound by the
    # parent's __init__, not importable submodules; accept either.
    parent_name, _, attr = name.rpartition(".")
    try:
        parent = importlib.import_module(parent_name)
    except ImportError as err:
        raise _moved(name, err) from err
    value = getattr(parent, attr, None)
    if isinstance(value, ModuleType):
        return value
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise _moved(name, err) from err


def _private_callable(module: ModuleType, attr: str) -> Callable[..., object]:
    value = getattr(module, attr, None)
    if not callable(value):
        raise _moved(f"{module.__name__}.{attr}", "attribute missing")
    return cast("Callable[..., object]", value)


@contextlib.contextmanager
def mosaic_ir_context() -> Iterator[ir.Context]:
    """Enter an MLIR context that parses exported StableHLO and Mosaic bytecode.

    It has JAX's dialects (for the StableHLO), the Mosaic TPU dialect (the
    kernel bytecode uses its types) and accepts unregistered ops (serialised
    Mosaic ops are ``stable_mosaic.*``, which no dialect registers).  Since
    jax 0.12 ``make_ir_context`` hands out a cached per-thread context that JAX
    reuses for its own lowering, so we take the uncached ``_create_ir_context``
    where it exists; otherwise (jax 0.10, where ``make_ir_context`` is
    uncached, or a release that renamed it) we put the unregistered-dialects
    flag back on exit in case the context is shared.  Registering the TPU
    dialect is idempotent and what JAX's own Pallas lowering does.
    """
    jmlir = _private_module("jax._src.interpreters.mlir")
    jtpu = _private_module("jax._src.lib.tpu")
    if hasattr(jmlir, "_create_ir_context"):
        factory = _private_callable(jmlir, "_create_ir_context")
    else:
        factory = _private_callable(jmlir, "make_ir_context")
    register_tpu = _private_callable(jtpu, "register_dialect")
    ctx = factory()
    if not isinstance(ctx, ir.Context):
        raise _moved(
            f"{jmlir.__name__}.{factory.__name__}",
            f"returned {type(ctx).__name__}, not an MLIR Context",
        )
    register_tpu(ctx)
    allowed = ctx.allow_unregistered_dialects
    ctx.allow_unregistered_dialects = True
    try:
        with ctx:
            yield ctx
    finally:
        ctx.allow_unregistered_dialects = allowed
