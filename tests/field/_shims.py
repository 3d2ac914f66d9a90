"""Stand-ins for the heavy imports of the field lane's packages, kernel code untouched.

The kernels themselves import only jax and numpy; what stands between them and
``import`` is package plumbing: ``tpu_inference/__init__.py`` starts vllm and torch,
``tokamax/__init__.py`` pulls autotuning, absl and pydantic. Two mechanisms:

* a top-level package in :data:`STAND_IN` (vllm, torch, absl, ...) is served by a
  stand-in module whose every attribute is another stand-in (callable, subscriptable,
  usable as a base class or decorator), so a module that only *names* them at import
  time loads;
* a package in :data:`SKIP_INIT` is made importable without running its
  ``__init__.py``: its submodules load from its folder as usual.

A kernel that really *uses* a stand-in fails when driven, and its driver says so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

STAND_IN = (
    "vllm", "torch", "torchax", "tpu_sync", "absl", "immutabledict", "pydantic",
    "pydantic_core", "flax", "qwix", "tunix", "jaxtyping", "typeguard", "einshape",
    "tqdm", "humanize", "psutil", "google.cloud", "transformers", "ray", "msgspec",
    "zmq", "orbax", "optax", "chex", "tensorflow", "triton", "safetensors", "sympy",
)  # fmt: skip
"""Top-level names served by stand-ins (only where the real package is not installed)."""

SKIP_INIT = (
    "tpu_inference",
    "tokamax",
)
"""Packages imported without their ``__init__.py`` (it only re-exports or sets up)."""


class StandIn(types.ModuleType):
    """A module, class, function and value at once: whatever a module-level use asks."""

    __path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = StandIn(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator: leave the function as it is
        return StandIn(f"{self.__name__}()")

    def __getitem__(self, key: Any) -> Any:
        return self

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:  # a type annotation ``X | None``
        return self

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


def _stands_in_for(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in STAND_IN)


class _Loader(importlib.abc.Loader):
    def __init__(self, folders: Sequence[str] | None = None) -> None:
        self.folders = folders

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.folders is None:
            return StandIn(spec.name)
        module = types.ModuleType(spec.name)
        module.__path__ = list(self.folders)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in SKIP_INIT:
            folders = _package_folders(fullname)
            if folders:
                return importlib.machinery.ModuleSpec(fullname, _Loader(folders), is_package=True)
            return None
        if _stands_in_for(fullname) and not _really_installed(fullname):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def _really_installed(fullname: str) -> bool:
    top = fullname.split(".")[0]
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is not None and find(top, None) is not None:
            return True
    return False


def _package_folders(name: str) -> list[str]:
    from pathlib import Path

    found = []
    for entry in sys.path:
        folder = Path(entry or ".") / name
        if (folder / "__init__.py").is_file():
            found.append(str(folder))
    return found


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
