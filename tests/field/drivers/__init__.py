"""Drivers of the field lane, one module per package area; each defines ``KERNELS``.

A driver module imports nothing from the field packages at import time (the lane
collects without them installed); its ``build`` functions import what they drive.
"""

from __future__ import annotations

import importlib
import pkgutil

from tests.field._kernel import FieldKernel


def all_kernels() -> list[FieldKernel]:
    """Every driven kernel, in module then definition order; names must be unique."""
    kernels: list[FieldKernel] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        kernels.extend(module.KERNELS)
    names = [k.name for k in kernels]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"field kernels named twice: {duplicates}"
    return kernels


def by_name(name: str) -> FieldKernel:
    for kernel in all_kernels():
        if kernel.name == name:
            return kernel
    raise KeyError(f"no field kernel named {name!r}")
