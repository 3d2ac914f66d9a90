"""Benchmark 4, on a TPU: copy bandwidth, remote-copy latency and bandwidth, collectives.

With a TPU (``jax.devices()[0].platform == "tpu"``; run with
``JAX_PLATFORMS=tpu``, since ./dev defaults to the CPU):

* HBM -> VMEM and VMEM -> HBM copy bandwidth, sizes 4 KiB to 64 MiB, on one
  chip, safedma kernel and its pltpu twin (benchmarks/tpu_kernels*.py);
* remote copy to the next chip of a ring of all chips: latency (time per
  copy at the smallest size) and bandwidth, safedma and twin;
* the registry's collective kernels (ppermute, all-gather, reduce-scatter,
  all-reduce) against their pltpu twins and ``jax.lax``, as bytes of
  per-device input per second;
* on one chip, safedma's pipeline, page gather, HBM->HBM copy and read
  streaming against the raw, BlockSpec and XLA programs doing the same work
  on the same bytes (benchmarks/tpu_compare.py), as a fraction of the chip's
  nominal HBM bandwidth, with time ratios safedma / each.

Remote copies and collectives need at least 2 chips; on one chip they are
listed as "needs at least 2 TPU chips", not timed.

Every timing is the median wall time of ``reps`` calls after a compile and
``warmup`` untimed calls, each call waited with ``block_until_ready``; the
kernels repeat their copies inside one call so that the launch cost is
amortised (the repetition count is recorded).

Without a TPU nothing is timed: the benchmark says "no TPU present: timing
skipped", builds every one of those programs compile-only for a TPU
topology (``compile_for_tpu``) and reports code size or the compiler's
error, and runs the bandwidth kernels in strict interpret mode on the CPU to
check their results. Nothing measured on a CPU is reported as TPU
performance.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks import tpu_compare
from benchmarks import tpu_kernels as sdk
from benchmarks import tpu_kernels_pltpu as twin
from benchmarks._common import Spread, heading, table
from benchmarks.kernels import registry

KiB, MiB = 2**10, 2**20
SIZES = tuple(4 * KiB * 4**i for i in range(8))  # 4 KiB .. 64 MiB
QUICK_SIZES = (4 * KiB, 1 * MiB, 64 * MiB)
COLLECTIVE_SIZES = (64 * KiB, 1 * MiB, 4 * MiB)
COPY_TARGET_BYTES, MAX_COPIES = 256 * MiB, 16384
REMOTE_TARGET_BYTES, MAX_REMOTE = 64 * MiB, 4096
NO_TPU = "no TPU present: timing skipped"


def tpu_present() -> bool:
    return str(jax.devices()[0].platform) == "tpu"


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def _copy_repeats(size: int) -> int:
    chunks = max(1, size // sdk.MAX_CHUNK_BYTES)
    return max(1, min(COPY_TARGET_BYTES // size, MAX_COPIES // chunks))


def _remote_repeats(size: int) -> int:
    return max(1, min(REMOTE_TARGET_BYTES // size, MAX_REMOTE))


@dataclasses.dataclass(frozen=True)
class Program:
    """One thing to time: a per-device function and its per-device arguments."""

    benchmark: str
    variant: str
    size: int
    fn: Callable[..., Any]
    args: tuple[jax.ShapeDtypeStruct, ...]
    multi_device: bool
    repeats: int = 1


def _spec(rows: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows, 128), jnp.float32)


def copy_programs(sizes: Sequence[int]) -> list[Program]:
    programs = []
    for size in sizes:
        r = _copy_repeats(size)
        for variant, mod in (("safedma", sdk), ("pltpu", twin)):
            programs.append(
                Program(
                    "HBM->VMEM",
                    variant,
                    size,
                    functools.partial(mod.hbm_to_vmem, repeats=r),
                    (_spec(sdk.rows_of(size)),),
                    False,
                    r,
                )
            )
            programs.append(
                Program(
                    "VMEM->HBM",
                    variant,
                    size,
                    functools.partial(mod.vmem_to_hbm, size_bytes=size, repeats=r),
                    (_spec(sdk.chunk_rows(size)),),
                    False,
                    r,
                )
            )
    return programs


def remote_programs(sizes: Sequence[int]) -> list[Program]:
    programs = []
    for size in sizes:
        r = _remote_repeats(size)
        for variant, mod in (("safedma", sdk), ("pltpu", twin)):
            programs.append(
                Program(
                    "remote copy",
                    variant,
                    size,
                    functools.partial(mod.remote_copy, repeats=r),
                    (_spec(sdk.rows_of(size)),),
                    True,
                    r,
                )
            )
    return programs


def collective_programs(n: int, sizes: Sequence[int]) -> tuple[list[Program], list[str]]:
    """The registry's collectives, scaled to ~``size`` bytes of input per device."""
    built, missing = registry()
    programs = []
    for b in built:
        case = b.case
        if case.kind is None or case.lax is None:
            continue
        base = case.args(n)
        base_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in base)
        for size in sizes:
            factor = max(1, size // base_bytes)
            args = tuple(
                jax.ShapeDtypeStruct((a.shape[0] * factor, *a.shape[1:]), a.dtype) for a in base
            )
            real = base_bytes * factor
            for variant, fn in (("safedma", b.safedma), ("pltpu", b.twin), ("jax.lax", case.lax())):
                programs.append(
                    Program(f"{case.kind} ({case.name})", variant, real, fn, args, True)
                )
    return programs, [f"{m.name}: {m.reason}" for m in missing]


# ---------------------------------------------------------------- with a TPU


def _program_for(p: Program, mesh: Any) -> tuple[Callable[..., Any], list[jax.Array]]:
    if not p.multi_device:
        device = jax.devices()[0]
        args = [jax.device_put(jnp.ones(a.shape, a.dtype), device) for a in p.args]
        return jax.jit(p.fn), args
    spec = PartitionSpec("x")
    n = int(mesh.devices.size)
    sharding = NamedSharding(mesh, spec)
    args = [
        jax.device_put(jnp.ones((a.shape[0] * n, *a.shape[1:]), a.dtype), sharding) for a in p.args
    ]
    return jax.jit(
        jax.shard_map(p.fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    ), args


def _time(p: Program, mesh: Any, reps: int, warmup: int) -> Spread:
    program, args = _program_for(p, mesh)
    jax.block_until_ready(program(*args))  # compile and first run
    for _ in range(warmup):
        jax.block_until_ready(program(*args))
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        jax.block_until_ready(program(*args))
        times.append(time.perf_counter() - started)
    return Spread.of(times)


def _timed(programs: list[Program], reps: int, warmup: int) -> list[dict[str, Any]]:
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    out = []
    for p in programs:
        row: dict[str, Any] = {
            "benchmark": p.benchmark,
            "variant": p.variant,
            "size": p.size,
            "repeats": p.repeats,
        }
        if p.multi_device and len(devices) < 2:
            row["skipped"] = "needs at least 2 TPU chips"
        else:
            try:
                s = _time(p, mesh, reps, warmup)
            except Exception as err:  # a size that does not fit is a result, not a crash
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            else:
                row["seconds"] = s.as_dict()
                moved = p.size * p.repeats
                row["bytes_per_s"] = moved / s.median
                row["seconds_per_repeat"] = s.median / p.repeats
        out.append(row)
        print(
            f"  {p.benchmark} {p.variant} {_size(p.size)}: "
            + (
                f"{row['bytes_per_s'] / 1e9:.2f} GB/s"
                if "bytes_per_s" in row
                else row.get("skipped", row.get("error", ""))
            ),
            flush=True,
        )
    return out


def _timing_table(rows: list[dict[str, Any]]) -> str:
    cells = []
    for r in rows:
        if "seconds" in r:
            s = r["seconds"]
            cells.append(
                [
                    r["benchmark"],
                    r["variant"],
                    _size(r["size"]),
                    r["repeats"],
                    f"{s['median'] * 1e6:.1f} us (IQR {s['q1'] * 1e6:.1f}-{s['q3'] * 1e6:.1f})",
                    f"{r['seconds_per_repeat'] * 1e6:.2f} us",
                    f"{r['bytes_per_s'] / 1e9:.2f} GB/s",
                ]
            )
        else:
            cells.append(
                [
                    r["benchmark"],
                    r["variant"],
                    _size(r["size"]),
                    r["repeats"],
                    r.get("skipped") or r.get("error"),
                    "-",
                    "-",
                ]
            )
    return table(
        ["benchmark", "variant", "size", "repeats", "median per call", "per repeat", "bandwidth"],
        cells,
    )


# ---------------------------------------------------------------- without a TPU


def _compile_only(programs: list[Program], topology: str) -> list[dict[str, Any]]:
    from safedma.testing import compile_for_tpu, tpu_mesh

    n = int(tpu_mesh(topology).devices.size)
    out = []
    for p in programs:
        row: dict[str, Any] = {
            "benchmark": p.benchmark,
            "variant": p.variant,
            "size": p.size,
            "repeats": p.repeats,
            "topology": topology,
        }
        args = [jax.ShapeDtypeStruct((a.shape[0] * n, *a.shape[1:]), a.dtype) for a in p.args]
        try:
            report = compile_for_tpu(p.fn, *args, topology=topology)
        except Exception as err:
            row["compile_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        else:
            row["generated_code_size_in_bytes"] = report.generated_code_size_in_bytes
        out.append(row)
    return out


def _interpret_checks() -> list[dict[str, Any]]:
    """Run the bandwidth kernels in strict interpret mode on CPU and check their outputs."""
    from safedma.testing import NotEnoughDevicesError, simulate, simulated_mesh

    checks: list[dict[str, Any]] = []
    size = 2 * sdk.MAX_CHUNK_BYTES  # two chunks: the double-buffered path
    x = sdk.example(size)
    rows = sdk.chunk_rows(size)
    for variant, mod in (("safedma", sdk), ("pltpu", twin)):
        got = simulate(functools.partial(mod.hbm_to_vmem, repeats=3), x)
        last = (2 * 3 - 1) % 2  # chunk index of the last of the 6 copies
        checks.append(
            {
                "kernel": "HBM->VMEM",
                "variant": variant,
                "size": size,
                "ok": bool(np.array_equal(got, x[last * rows : (last + 1) * rows])),
            }
        )
        for s in (size, 64 * KiB):
            r = sdk.chunk_rows(s)
            got = simulate(functools.partial(mod.vmem_to_hbm, size_bytes=s, repeats=2), x[:r])
            want = np.tile(np.asarray(x[:r]), (s // sdk.ROW_BYTES // r, 1))
            checks.append(
                {
                    "kernel": "VMEM->HBM",
                    "variant": variant,
                    "size": s,
                    "ok": bool(np.array_equal(got, want)),
                }
            )
        try:
            mesh = simulated_mesh(4, "x")
        except NotEnoughDevicesError as err:
            checks.append({"kernel": "remote copy", "variant": variant, "skipped": str(err)})
            continue
        block = sdk.example(64 * KiB)
        xs = jnp.concatenate([block + 1e6 * d for d in range(4)])
        got = simulate(functools.partial(mod.remote_copy, repeats=3), xs, mesh=mesh)
        left = jnp.roll(xs, block.shape[0], axis=0)  # device d receives the block of d - 1
        want_remote = jnp.concatenate(
            [
                jnp.tile(left[d * block.shape[0] : (d + 1) * block.shape[0]], (3, 1))
                for d in range(4)
            ]
        )
        checks.append(
            {
                "kernel": "remote copy",
                "variant": variant,
                "size": 64 * KiB,
                "ok": bool(np.array_equal(got, want_remote)),
            }
        )
    return checks


def run(
    *, reps: int = 20, warmup: int = 3, quick: bool = False, topology: str = "v6e:2x2"
) -> dict[str, Any]:
    """Run benchmark 4; print its table (or the compile-only report); return the JSON record."""
    heading("4. TPU timings: copy bandwidth, remote copy, collectives vs jax.lax")
    sizes = QUICK_SIZES if quick else SIZES
    coll_sizes = COLLECTIVE_SIZES[:1] if quick else COLLECTIVE_SIZES
    present = tpu_present()
    n = len(jax.devices()) if present else None
    from safedma.testing import tpu_mesh

    ring = n if n is not None else int(tpu_mesh(topology).devices.size)
    collectives, missing = collective_programs(ring, coll_sizes)
    programs = copy_programs(sizes) + remote_programs(sizes) + collectives
    if present:
        print(
            f"TPU present: {n} x {jax.devices()[0].device_kind}; {reps} timed calls after "
            f"{warmup} warm-up calls, median",
            flush=True,
        )
        rows = _timed(programs, reps, warmup)
        print()
        print(_timing_table(rows))
        heading("4b. One chip: safedma against raw pltpu, BlockSpec and XLA on the same bytes")
        print(
            f"each comparison's variants interleaved, {reps} repetitions after {warmup} "
            "warm-up calls; time ratio safedma / variant per repetition (above 1: safedma "
            "slower)",
            flush=True,
        )
        compared = tpu_compare.run_timed(reps, warmup, quick)
        return {
            "tpu_present": True,
            "device_kind": jax.devices()[0].device_kind,
            "devices": n,
            "reps": reps,
            "warmup": warmup,
            "results": rows,
            "comparisons": compared,
            "not_built": missing,
            "ok": compared["ok"],
        }
    print(
        f"{NO_TPU} (jax.devices()[0].platform is {jax.devices()[0].platform!r}). "
        f"The {len(programs)} programs are built compile-only for {topology} instead; "
        "no time is reported.",
        flush=True,
    )
    rows = _compile_only(programs, topology)
    grouped: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        cell = (
            f"{r['generated_code_size_in_bytes']} B"
            if "generated_code_size_in_bytes" in r
            else f"does not compile: {r['compile_error'][:80]}"
        )
        grouped.setdefault((r["benchmark"], r["size"]), {"repeats": r["repeats"]})[r["variant"]] = (
            cell
        )
    print()
    print(
        table(
            ["benchmark", "size/device", "repeats", "safedma", "pltpu twin", "jax.lax"],
            [
                [
                    b,
                    _size(size),
                    g["repeats"],
                    g.get("safedma", "-"),
                    g.get("pltpu", "-"),
                    g.get("jax.lax", "-"),
                ]
                for (b, size), g in grouped.items()
            ],
        )
    )
    print(f"(generated code size of the compile-only build for {topology}, per program)")
    built = sum("generated_code_size_in_bytes" in r for r in rows)
    print(f"\n{built} of {len(rows)} programs compile for {topology}; timing skipped (no TPU)")
    compared = tpu_compare.compile_only(topology)
    print()
    print(
        table(
            ["4b. comparison (compile-only)", "size/device", "variant", f"code {topology}"],
            [
                [
                    r["comparison"],
                    _size(r["size"]),
                    r["variant"],
                    f"{r['generated_code_size_in_bytes']} B"
                    if "generated_code_size_in_bytes" in r
                    else f"does not compile: {r['compile_error'][:80]}",
                ]
                for r in compared
            ],
        )
    )
    checks = _interpret_checks()
    print()
    print(
        table(
            [
                "interpret-mode check (CPU, correctness only, not timed)",
                "variant",
                "size",
                "result",
            ],
            [
                [
                    c["kernel"],
                    c["variant"],
                    _size(c["size"]) if "size" in c else "-",
                    "ok" if c.get("ok") else c.get("skipped", "WRONG OUTPUT"),
                ]
                for c in checks
            ],
        )
    )
    for m in missing:
        print(f"not built: {m}")
    return {
        "tpu_present": False,
        "message": NO_TPU,
        "topology": topology,
        "compile_only": rows,
        "comparisons_compile_only": compared,
        "interpret_checks": checks,
        "not_built": missing,
        "ok": all(c.get("ok", True) for c in checks),
    }
