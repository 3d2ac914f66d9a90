"""What a clean run of verify returns: counts over every device and kernel call.

Either path (the lockstep proof or the per-device walk) ends in :func:`make_report`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.program.compiler import location

__all__ = ["VerifyReport", "make_report"]


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` proved: counts over every device and kernel call.

    ``max_bytes_in_flight`` maps "kernel: semaphore" to the most bytes (or
    signals) pending on any one device at once; ``in_flight_units`` says which of
    the two each counts ("bytes" for a DMA semaphore, "signals" for a REGULAR or
    barrier one).
    """

    devices: int
    kernels: tuple[str, ...]
    invocations: int
    dmas: int
    remote_dmas: int
    waits: int
    signals: int
    max_bytes_in_flight: Mapping[str, int]
    in_flight_units: Mapping[str, str] = dataclasses.field(default_factory=dict[str, str])

    def __str__(self) -> str:
        lines = [
            f"verified: {len(self.kernels)} kernel(s) {', '.join(self.kernels)} on "
            f"{self.devices} device(s), {self.invocations} invocation(s)",
            f"  {self.dmas} DMAs ({self.remote_dmas} remote), {self.waits} waits, "
            f"{self.signals} signals",
        ]
        if self.max_bytes_in_flight:
            lines.append("  most in flight per semaphore:")
            for name, amount in sorted(self.max_bytes_in_flight.items()):
                unit = self.in_flight_units.get(name)
                lines.append(f"    {name}: {amount}" + (f" {unit}" if unit else ""))
        return "\n".join(lines)


def make_report(
    devices: int, body: Any, invocations: int, counts: Any, peaks: list[tuple[str, int, str]]
) -> VerifyReport:
    """The report of either path: ``counts`` has dmas, remote_dmas, waits and signals;
    ``peaks`` the most in flight of each semaphore of each call (the most per name), with
    the semaphore's kind ("DMA" counts bytes, the others signals)."""
    most: dict[str, int] = {}
    units: dict[str, str] = {}
    for name, peak, kind in peaks:
        most[name] = max(most.get(name, 0), peak)
        units[name] = "bytes" if kind == "DMA" else "signals"
    return VerifyReport(
        devices=devices,
        kernels=_kernel_labels(_kernel_names(body)),
        invocations=invocations,
        dmas=int(counts.dmas),
        remote_dmas=int(counts.remote_dmas),
        waits=int(counts.waits),
        signals=int(counts.signals),
        max_bytes_in_flight=most,
        in_flight_units=units,
    )


def _kernel_names(jaxpr: Any) -> list[tuple[str, str]]:
    """(name, user line) of every kernel call in the program."""
    out: list[tuple[str, str]] = []
    for eqn in _jax.all_eqns(jaxpr):
        if eqn.primitive.name == "pallas_call":
            out.append((str(_jax.kernel_params(eqn)["name"] or "kernel"), location(eqn)))
        if eqn.primitive.name == "mpmd_map":
            out.append((str(eqn.params.get("name") or "pl.kernel"), location(eqn)))
    return out


def _kernel_labels(found: list[tuple[str, str]]) -> tuple[str, ...]:
    """Distinct kernels by name; a name shared by kernels at different lines (every
    ``emit_pipeline`` body is called ``wrapped``) gets each line, so the report counts
    every kernel the program calls."""
    lines: dict[str, set[str]] = {}
    for name, where in found:
        lines.setdefault(name, set()).add(where)
    return tuple(
        sorted(
            label
            for name, wheres in lines.items()
            for label in ([name] if len(wheres) == 1 else [f"{name} ({w})" for w in wheres])
        )
    )
