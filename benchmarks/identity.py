"""Benchmark 1, run-time identity: what the TPU runs is the same with or without safedma.

For every kernel of the registry (benchmarks/kernels.py), on any machine:

* the Mosaic module of the safedma version against its pltpu twin
  (``safedma.testing.mosaic_text``, cross-lowered for TPU on a ring of 4
  devices, and of 16 for collectives): identical or not, and the ratio of
  their sizes;
* the generated TPU code size from compile-only builds
  (``safedma.testing.compile_for_tpu``) on each covered topology, as the
  ratio safedma / twin.

Anything but identical modules and a ratio of exactly 1 is a failure, shown
as a unified diff (of the Mosaic modules, or of the lowered programs when
the Mosaic is the same and the code size still differs).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks._common import heading, table
from benchmarks.kernels import Built, PerDevice, registry
from safedma.testing import abstract_mesh, compile_for_tpu, mosaic_text, tpu_mesh

TOPOLOGIES = ("v5e:2x2", "v6e:2x2", "v5p:2x2x1", "v4:2x2x1", "tpu7x:2x2x1")
COLLECTIVE_TOPOLOGIES = ("v6e:4x4",)
QUICK_TOPOLOGIES = ("v6e:2x2",)
_MAX_DIFF = 80


@dataclasses.dataclass
class CaseResult:
    name: str
    source: str
    mosaic: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    code_size: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    diffs: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.errors
            and not self.diffs
            and all(m["identical"] for m in self.mosaic.values())
            and all(c["ratio"] == 1 for c in self.code_size.values())
        )


def _diff(a: str, b: str, label_a: str, label_b: str) -> str:
    lines = list(
        difflib.unified_diff(a.splitlines(), b.splitlines(), label_a, label_b, lineterm="")
    )
    if len(lines) > _MAX_DIFF:
        lines = lines[:_MAX_DIFF] + [f"... ({len(lines) - _MAX_DIFF} more diff lines)"]
    return "\n".join(lines)


def _shard_mapped(fn: PerDevice, axis: str, mesh: Any) -> PerDevice:
    spec = PartitionSpec(axis)
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)


def _mosaic(built: Built, n: int) -> tuple[str, str]:
    case = built.case
    mesh = abstract_mesh((n,), (case.axis,))
    sharding = NamedSharding(mesh, PartitionSpec(case.axis))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in case.global_args(n)]
    ours = mosaic_text(_shard_mapped(built.safedma, case.axis, mesh), *args)
    theirs = mosaic_text(_shard_mapped(built.twin, case.axis, mesh), *args)
    return ours, theirs


_LOC = re.compile(r"\s*loc\(.*\)$|^#loc.*$", re.MULTILINE)


def _lowered_program(fn: PerDevice, built: Built, topology: str, n: int) -> str:
    """The lowered program compile_for_tpu compiles, without source locations."""
    case = built.case
    mesh = tpu_mesh(topology, axis_names=(case.axis,))
    sharding = NamedSharding(mesh, PartitionSpec(case.axis))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in case.global_args(n)]
    program = jax.jit(_shard_mapped(fn, case.axis, mesh))
    return _LOC.sub("", program.trace(*args).lower().as_text())


def _devices(topology: str) -> int:
    return int(tpu_mesh(topology).devices.size)


def run_case(built: Built, topologies: Sequence[str]) -> CaseResult:
    case = built.case
    result = CaseResult(case.name, case.source)
    rings = sorted({_devices(t) for t in topologies} | {4})
    texts: dict[int, tuple[str, str]] = {}
    for n in rings:
        try:
            ours, theirs = texts[n] = _mosaic(built, n)
        except Exception as err:  # a kernel that cannot lower is a failure, not a crash
            result.errors.append(f"Mosaic lowering on {n} devices: {type(err).__name__}: {err}")
            continue
        same = ours == theirs
        result.mosaic[n] = {
            "identical": same,
            "safedma_bytes": len(ours),
            "twin_bytes": len(theirs),
            "ratio": len(ours) / len(theirs),
        }
        if not same:
            result.diffs.append(
                f"Mosaic on {n} devices (- safedma, + pltpu twin):\n"
                + _diff(ours, theirs, "safedma", "pltpu twin")
            )
    for topology in topologies:
        n = _devices(topology)
        try:
            ours_r = compile_for_tpu(
                built.safedma, *case.global_args(n), topology=topology, axis_names=(case.axis,)
            )
            theirs_r = compile_for_tpu(
                built.twin, *case.global_args(n), topology=topology, axis_names=(case.axis,)
            )
        except Exception as err:
            result.errors.append(f"compile for {topology}: {type(err).__name__}: {err}")
            continue
        a, b = ours_r.generated_code_size_in_bytes, theirs_r.generated_code_size_in_bytes
        result.code_size[topology] = {
            "safedma_bytes": a,
            "twin_bytes": b,
            "ratio": a / b if b else float("nan"),
        }
        if a != b and n in texts and texts[n][0] == texts[n][1]:
            ours_p = _lowered_program(built.safedma, built, topology, n)
            theirs_p = _lowered_program(built.twin, built, topology, n)
            result.diffs.append(
                f"code size on {topology}: {a} vs {b} bytes with identical Mosaic; lowered "
                "programs (- safedma, + pltpu twin):\n"
                + (_diff(ours_p, theirs_p, "safedma", "pltpu twin") or "(no difference)")
            )
        elif a != b:
            result.diffs.append(
                f"code size on {topology}: {a} vs {b} bytes (Mosaic differs, see above)"
            )
    return result


def _topology_list(quick: bool, topologies: Sequence[str] | None) -> list[str]:
    if topologies:
        return list(topologies)
    return list(QUICK_TOPOLOGIES if quick else TOPOLOGIES)


def run(
    *, quick: bool = False, topologies: Sequence[str] | None = None, kernels: set[str] | None = None
) -> dict[str, Any]:
    """Run benchmark 1; print its table and any diff; return the JSON record."""
    heading("1. Run-time identity: safedma vs raw pltpu (Mosaic module, TPU code size)")
    built, missing = registry(kernels)
    plain = _topology_list(quick, topologies)
    wide = [] if quick or topologies else list(COLLECTIVE_TOPOLOGIES)
    results = [run_case(b, plain + (wide if b.case.collective else [])) for b in built]
    columns = plain + wide
    rows = []
    for r in results:
        mosaic = ", ".join(
            f"{n} dev {'same' if m['identical'] else 'DIFFERENT'} ({m['safedma_bytes']} B)"
            for n, m in sorted(r.mosaic.items())
        )
        cells = []
        for t in columns:
            c = r.code_size.get(t)
            cells.append("-" if c is None else f"{c['ratio']:.3f} ({c['safedma_bytes']} B)")
        rows.append([r.name, mosaic or "error", *cells, "ok" if r.ok else "FAIL"])
    print(table(["kernel", "Mosaic (text size)", *[f"code {t}" for t in columns], "result"], rows))
    for r in results:
        for item in r.errors + r.diffs:
            print(f"\nFAIL {r.name}: {item}")
    for m in missing:
        print(f"\nnot built: {m.name} ({m.source}): {m.reason}")
    failed = [r.name for r in results if not r.ok]
    print(
        f"\n{len(results) - len(failed)} of {len(results)} kernels identical "
        f"(Mosaic identical and code-size ratio exactly 1 on {', '.join(columns)})"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + (f"; {len(missing)} registered kernel(s) not built here" if missing else "")
    )
    return {
        "topologies": columns,
        "ok": not failed,
        "kernels": [dataclasses.asdict(r) | {"ok": r.ok} for r in results],
        "not_built": [dataclasses.asdict(m) for m in missing],
    }
