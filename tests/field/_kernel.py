"""A field kernel: one real package's DMA kernel, driven as its own tests drive it.

A driver names the module that holds the kernel's DMA code (the one the mutants change)
and builds the program to check from that module, so that the same driver runs the
original and every mutant of it: ``build(module) -> Program``. Shapes and metadata come
from the package's own tests; ``source`` says which.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType

from tests.corpus._case import Program

PACKAGE_OF_TOP = {"tpu_inference": "tpu-inference", "tokamax": "tokamax", "jax": "jax"}


@dataclasses.dataclass(frozen=True, eq=False)  # one object per kernel: hashed by identity
class FieldKernel:
    """One driven kernel.

    ``name`` is stable and unique (``<package>/<kernel>[/<variant>]``, the pytest id and
    the key in results.json). ``module`` is the dotted name of the module whose source
    holds the kernel's DMA code; ``build`` gets that module (original or mutated) and
    returns the program. ``source`` names the package test (file and case) the shapes
    come from. ``readings`` holds, per checker ("verify", "trace", "simulate"), what a
    person found on reading the kernel against that checker's finding (or verify's
    refusal): it starts with ``true bug:``, ``by design:``, ``false alarm:`` or
    ``unsupported:`` and gives the reason. A finding without a reading, or one read as
    a false alarm, fails the lane. ``slow``: out of CI's slice (and not simulated).
    """

    name: str
    module: str
    build: Callable[[ModuleType], Program]
    source: str
    readings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    slow: bool = False

    @property
    def package(self) -> str:
        return PACKAGE_OF_TOP[self.module.split(".")[0]]

    def program(self, module: ModuleType | None = None) -> Program:
        """The program of the original module (or of ``module``, a mutant of it)."""
        return self.build(module if module is not None else importlib.import_module(self.module))
