"""The megacore split of a ``pallas_call``'s "parallel" grid dimensions (TPU v4, v5p).

On a chip whose two TensorCores form one JAX device (jax's ``TpuInfo.is_megacore``:
``num_cores > 1``; only v4 and v5p support it), Mosaic runs the grid's "parallel"
dimensions on both cores. The split modelled here is jax's TPU interpret mode's
(``interpret_pallas_call.py``): the "parallel" dimensions must lead the grid; the
points of that parallel subgrid, in row-major order, are cut into contiguous
parts of ``ceil(P / cores)`` points, core k taking part k (the last core gets
fewer, or none), and each core runs every point of the remaining dimensions under
its parallel points, in grid order. Each core has its own VMEM, SMEM (scratch and
the scalar-prefetch copies), semaphores and pipeline (its own first copy-in and
last copy-out); HBM operands and the outputs are shared. docs/verify-model.md, rule 11,
gives the sources.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from jax.sharding import AbstractMesh

from safedma.testing._mosaic import TPU_GENERATIONS
from safedma.testing._verify.errors import VerificationUnsupportedError, VerifiedRaceError
from safedma.testing._verify.walk.blocks import grid_point_at, grid_points

__all__ = [
    "Chip",
    "CorePart",
    "check_disjoint_outputs",
    "chip_of",
    "copy_out_hint",
    "core_parts",
    "describe_parts",
    "single_core_note",
    "split_dims",
    "split_note",
]

Point = tuple[int, ...]
Box = tuple[tuple[int, int], ...]

_GENERATION_OF_KIND = {kind: name for name, (kind, _) in TPU_GENERATIONS.items()}


class Chip:
    """The TPU generation a mesh names: its label and the TensorCores of one device
    that a pallas_call's "parallel" grid dimensions are split over (1: no split)."""

    def __init__(self, kind: str, cores: int) -> None:
        self.kind = kind
        self.name = _GENERATION_OF_KIND.get(kind, kind)
        self.cores = cores

    def __repr__(self) -> str:
        return f"Chip({self.name!r}, cores={self.cores})"


def _device_of(mesh: Any) -> Any:
    if isinstance(mesh, AbstractMesh):
        return mesh.abstract_device  # None unless it names its TPU (abstract_mesh(tpu=))
    devices = getattr(mesh, "devices", None)  # a Mesh of (compile-only) devices
    flat = getattr(devices, "flat", None)
    return next(iter(flat), None) if flat is not None else None


def chip_of(meshes: Sequence[Any]) -> Chip | None:
    """The TPU the first of ``meshes`` that names one describes; None when none does
    (host CPU devices, an ``abstract_mesh`` without ``tpu=``)."""
    for mesh in meshes:
        device = _device_of(mesh) if mesh is not None else None
        kind = str(getattr(device, "device_kind", "") or "")
        if not kind.startswith("TPU"):
            continue
        cores = int(getattr(device, "num_cores", 1) or 1)
        return Chip(kind, cores if cores > 1 else 1)
    return None


def split_dims(semantics: tuple[str, ...], name: str, where: str) -> tuple[int, ...]:
    """The grid dimensions a megacore splits: the leading "parallel" ones. A
    "parallel" dimension after an "arbitrary" one is not modelled: jax's interpret
    mode rejects it, and no Pallas document says how Mosaic splits it."""
    lead = 0
    while lead < len(semantics) and semantics[lead] == "parallel":
        lead += 1
    stray = [d for d in range(lead, len(semantics)) if semantics[d] == "parallel"]
    if stray:
        raise VerificationUnsupportedError(
            f"kernel {name} at {where} marks grid dimension(s) {tuple(stray)} 'parallel' "
            f"after an 'arbitrary' one (dimension_semantics={semantics}). verify models "
            "the megacore split of leading 'parallel' dimensions only (jax's TPU "
            "interpret mode requires them to lead the grid); move the parallel "
            "dimensions first, or verify with a mesh naming a one-core TPU (tpu='v5e')"
        )
    return tuple(range(lead))


class CorePart:
    """One core's grid points: the row-major positions ``[lo, hi)`` of the grid, made
    one at a time when iterated (a list of a huge grid's points took seconds and GBs
    before verify's time budget could stop the run)."""

    def __init__(self, grid: tuple[int, ...], lo: int, hi: int) -> None:
        self.grid, self.lo, self.hi = grid, lo, max(lo, hi)

    def __len__(self) -> int:
        return self.hi - self.lo

    def __iter__(self) -> Iterator[Point]:
        return grid_points(self.grid, self.lo, self.hi)

    @property
    def first(self) -> Point:
        return grid_point_at(self.grid, self.lo)

    @property
    def last(self) -> Point:
        return grid_point_at(self.grid, self.hi - 1)

    def __repr__(self) -> str:
        return f"CorePart({self.grid}, {self.lo}, {self.hi})"


def core_parts(grid: tuple[int, ...], lead: int, cores: int) -> list[CorePart]:
    """Each core's grid points, in the order it runs them: the parallel subgrid (the
    first ``lead`` dimensions, row-major) in contiguous parts of ``ceil(P / cores)``
    points, each followed by every point of the other dimensions."""
    parallel = math.prod(grid[:lead])
    inner = math.prod(grid[lead:])
    chunk = -(-parallel // cores) if parallel else 0
    return [
        CorePart(
            grid,
            min(k * chunk, parallel) * inner,
            min((k + 1) * chunk, parallel) * inner,
        )
        for k in range(cores)
    ]


def describe_parts(parts: list[CorePart]) -> str:
    """``core 0 runs grid steps (0, 0) to (0, 2), core 1 runs (1, 0) to (1, 2)``."""
    spans: list[str] = []
    for k, part in enumerate(parts):
        if not part:
            spans.append(f"core {k} runs no step")
        elif len(part) == 1:
            spans.append(f"core {k} runs grid step {part.first}")
        else:
            spans.append(f"core {k} runs grid steps {part.first} to {part.last}")
    return ", ".join(spans)


def copy_out_hint(chip: Chip, dims: tuple[int, ...], parts: list[CorePart]) -> str:
    """What the split adds to "the pipeline copies out" an unwritten output block."""
    return (
        f" On a {chip.name} Mosaic splits the 'parallel' grid dimension(s) {dims} between "
        f"the TensorCores ({describe_parts(parts)}); each core's pipeline copies the "
        "block out after its own last step, so a block written only at the grid's last "
        "step, or accumulated across a parallel dimension, is garbage on the other "
        "core: write it in every core's part, or mark the dimension 'arbitrary'."
    )


def split_note(chip: Chip, name: str, where: str, dims: tuple[int, ...], parts: str) -> str:
    """What a megacore chip does with kernel ``name``: appended to a deadlock."""
    return (
        f"\nNote: on a {chip.name} ({chip.cores} TensorCores per device) Mosaic splits "
        f"the 'parallel' grid dimension(s) {dims} of {name} at {where} between the "
        f"cores: {parts}. Each core has its own scratch, semaphores, scalar-prefetch "
        "values and pipeline, so a copy chain (a prefetch of the next step, an 'init' "
        "flag) must start at each core's first step, and a prefetch must not cross "
        "into the other core's part. Fix: start the chain where the indices of the "
        "non-parallel dimensions are all 0 (or per core from the parallel index), or "
        "mark the dimension 'arbitrary'."
    )


def single_core_note(chip: Chip, name: str, where: str, dims: tuple[int, ...]) -> str:
    return (
        f"\nNote: {name} at {where} marks grid dimension(s) {dims} 'parallel'; a "
        f"{chip.name} has one TensorCore per device and runs every grid step in order "
        "on it, so this deadlock is real there. A kernel written for a megacore split "
        "(each core starting its own copy chain) deadlocks on one core: start the chain "
        "at every step where the other indices restart, or verify with tpu='v5p' if it "
        "only runs on megacore chips."
    )


def check_disjoint_outputs(
    labels: list[str],
    participants: list[int],
    boxes: list[dict[int, list[tuple[Box | None, Point]]]],
    names: dict[int, str],
    chip: Chip,
    kernel: str,
    where: str,
    dims: tuple[int, ...],
) -> None:
    """Two cores copying out overlapping blocks of one output write shared HBM with
    nothing ordering them: the result is whichever copy lands last (a race).
    ``names``: the outputs the program reads, by operand index (one it drops may hold
    either core's block)."""
    for a in range(len(boxes)):
        for b in range(a + 1, len(boxes)):
            for j, mine in boxes[a].items():
                if j not in names:
                    continue  # an output the program never reads
                for box_a, step_a in mine:
                    for box_b, step_b in boxes[b].get(j, []):
                        if not _overlap(box_a, box_b):
                            continue
                        shown = _fmt(_meet(box_a, box_b))
                        raise VerifiedRaceError(
                            f"data race on {labels[participants[a]].rsplit(' core', 1)[0]}'s "
                            f"output {names[j]}{shown}: the pipeline of {labels[participants[a]]} "
                            f"copies its block out at grid step {step_a} and the pipeline of "
                            f"{labels[participants[b]]} at grid step {step_b}, in kernel "
                            f"{kernel} at {where}. On a {chip.name} Mosaic splits the "
                            f"'parallel' grid dimension(s) {dims} between the TensorCores, "
                            "which write HBM concurrently, so the output holds whichever "
                            "copy lands last (a block accumulated across a parallel "
                            "dimension is written by each core with its own partial "
                            "result). Fix: make the output's index map give each core its "
                            "own blocks (depend on the parallel grid index), or mark the "
                            "dimension 'arbitrary'."
                        )


def _overlap(a: Box | None, b: Box | None) -> bool:
    if a is None or b is None:
        return True
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def _meet(a: Box | None, b: Box | None) -> Box | None:
    if a is None or b is None:
        return b if a is None else a
    return tuple((max(lo1, lo2), min(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b))


def _fmt(box: Box | None) -> str:
    if box is None:
        return ""
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"
