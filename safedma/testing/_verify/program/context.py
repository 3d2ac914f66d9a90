"""What one participant's program sees as it runs: refs, its context, the run around it.

An op of a compiled program is ``op(env, ctx)``; it returns None, or a generator
(:data:`Gen`) when it may block (a wait) or runs a sub-program. Refs are
:class:`RefVal`: a buffer of the protocol model and the transforms applied to it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

from safedma.testing._verify.model.regions import Box, Buffer
from safedma.testing._verify.model.semantics import Blocked, Machine
from safedma.testing._verify.model.termination import Budget

__all__ = ["Ctx", "Gen", "InFlight", "Op", "RefVal", "World"]

Gen = Generator[Blocked, None, Any]
Op = Callable[[list[Any], "Ctx"], "Gen | None"]


class RefVal:
    """A ref in the program: a buffer and the concrete transforms applied so far."""

    __slots__ = ("buffer", "steps")

    def __init__(self, buffer: Buffer, steps: tuple[tuple[str, object], ...] = ()) -> None:
        self.buffer, self.steps = buffer, steps


class InFlight(RefVal):
    """A kernel's output that a copy still writes when the kernel returns it beside the
    copy's semaphore (a DMA future's destination). Only a kernel may take it on (the one
    that waits the copy); an operation of the program around the kernels that reads it
    may run as soon as the starting kernel returned, before any wait (XLA orders by
    data, and the copy is no data dependence), so it reads what the copy is writing."""

    __slots__ = ("copy", "kernel", "write", "sems", "boxes")

    def __init__(
        self,
        buffer: Buffer,
        copy: str,
        kernel: str,
        write: Any,
        sems: frozenset[int],
        boxes: tuple[tuple[Box, str], ...] = (),
    ) -> None:
        super().__init__(buffer)
        self.copy, self.kernel = copy, kernel
        self.write = write  # the copy's pending write (settled once a wait guarantees it)
        self.sems = sems  # the semaphores the starting kernel returned with it
        # every region a copy still writes as the kernel returns it, with the copy's line
        self.boxes = boxes


class World(Protocol):
    """What a participant's program reads of the run it is part of (the walk's engine).

    Why a protocol: the program is read before the walk exists and knows nothing of it;
    the walk's ``Engine`` is the one implementation, and walk code that needs more of
    it than this gets it with ``walk.engine.engine_of``."""

    labels: list[str]  # each participant's name in messages
    axis_sizes: dict[str, int]
    cores: int  # participants per device
    budget: Budget
    machine: Machine


class Ctx:
    """What one participant's program sees: its position, the machine, the current kernel."""

    def __init__(self, p: int, engine: World, axis_index: dict[str, int]) -> None:
        self.p = p
        self.engine = engine
        self.machine: Machine = engine.machine
        self.axis_index = axis_index
        self.grid_point: tuple[int, ...] = ()
        self.grid: tuple[int, ...] = ()
        self.grid_names: tuple[str, ...] = ()
        self.kernel: Any = None
        self.scoped_counts: dict[int, int] = {}
        self.core_sizes: dict[str, int] = {}  # axes of the pl.kernel mesh being run
        # the grid dimension of each program_id axis: jax.vmap adds grid dimensions the
        # kernel's program_id does not count (None: every dimension is the kernel's)
        self.grid_axes: tuple[int, ...] | None = None
