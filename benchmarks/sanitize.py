"""Benchmark 6, on a TPU: what the DMA sanitizer costs, sanitize on against off.

``python -m benchmarks --only sanitize`` (on a TPU host with ``JAX_PLATFORMS=tpu,cpu``:
the sanitized kernels report through a host callback, which needs the CPU platform).

For each reference kernel that fits one chip (the bandwidth kernels of
benchmarks/tpu_kernels.py, ``safedma.kernels.pipeline``, ``gather_pages``), three
builds of the same call, each jitted on its own and timed in turn, round after round
(median of ``reps`` rounds after warm-up):

* ``off``: ``SAFEDMA_SANITIZE`` unset: the kernel as shipped;
* ``on``: ``SAFEDMA_SANITIZE=1``: the instrumented kernel and the host check of its
  flags after every call, what a user gets;
* ``on, kernel only``: the instrumented kernel, its flags not checked on the host
  (splits the kernel's cost from the callback's).

The goal: ``on`` at most 10 % slower than ``off`` on the bandwidth kernels.

Without a TPU nothing is timed: the benchmark says so, builds ``off`` and ``on``
compile-only for a v5e (code size of each), and runs the ``on`` builds in TPU
interpret mode on the CPU to check their results (correctness only).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from benchmarks import tpu_kernels as sdk
from benchmarks._common import Spread, heading, table

MiB = 2**20
NO_TPU = "no TPU present: timing skipped"
GOAL = 0.10
VARIANTS = ("off", "on", "on, kernel only")
TOPOLOGY = "v5e:2x2"


def tpu_present() -> bool:
    return str(jax.devices()[0].platform) == "tpu"


def _cpu_platform() -> bool:
    names = {p.strip() for p in str(jax.config.jax_platforms or "").split(",") if p.strip()}
    return not names or "cpu" in names


@contextlib.contextmanager
def _switch(variant: str) -> Iterator[None]:
    """Trace inside this block as ``variant`` builds it."""
    from safedma._sanitize._report import unchecked_on_host

    saved = os.environ.get("SAFEDMA_SANITIZE")
    os.environ["SAFEDMA_SANITIZE"] = "0" if variant == "off" else "1"
    try:
        with unchecked_on_host() if variant == "on, kernel only" else contextlib.nullcontext():
            yield
    finally:
        if saved is None:
            del os.environ["SAFEDMA_SANITIZE"]
        else:
            os.environ["SAFEDMA_SANITIZE"] = saved


def _pipeline(x: jax.Array) -> jax.Array:
    from safedma.kernels import pipeline

    return pipeline(x, lambda c: c * 2.0 + 1.0, chunk_rows=512)


def _gather(pages: jax.Array, indices: jax.Array) -> jax.Array:
    from safedma.kernels import gather_pages

    return gather_pages(pages, indices)


def cases(quick: bool) -> list[dict[str, Any]]:
    """(name, bandwidth kernel?, fn, example args, bytes moved per call)."""
    sizes = (64 * MiB,) if quick else (1 * MiB, 64 * MiB)
    found: list[dict[str, Any]] = []
    for size in sizes:
        repeats = max(1, 256 * MiB // size)
        x = sdk.example(size)
        found.append(
            {
                "name": f"HBM->VMEM {size // MiB} MiB x{repeats}",
                "bandwidth": True,
                "fn": functools.partial(sdk.hbm_to_vmem, repeats=repeats),
                "args": (x,),
                "bytes": size * repeats,
            }
        )
        chunk = x[: sdk.chunk_rows(size)]
        found.append(
            {
                "name": f"VMEM->HBM {size // MiB} MiB x{repeats}",
                "bandwidth": True,
                "fn": functools.partial(sdk.vmem_to_hbm, size_bytes=size, repeats=repeats),
                "args": (chunk,),
                "bytes": size * repeats,
            }
        )
    rows = 16 * MiB // (128 * 4)
    found.append(
        {
            "name": "pipeline 16 MiB",
            "bandwidth": False,
            "fn": _pipeline,
            "args": (jnp.arange(rows * 128, dtype=jnp.float32).reshape(rows, 128),),
            "bytes": 2 * 16 * MiB,
        }
    )
    pages = jnp.arange(64 * 64 * 128, dtype=jnp.float32).reshape(64, 64, 128)
    indices = jnp.asarray(np.random.default_rng(0).integers(0, 64, 32), jnp.int32)
    found.append(
        {
            "name": "gather_pages 32 of 64 pages (32 KiB)",
            "bandwidth": False,
            "fn": _gather,
            "args": (pages, indices),
            "bytes": 2 * 32 * 64 * 128 * 4,
        }
    )
    return found


def _built(case: dict[str, Any], variant: str) -> Callable[..., Any]:
    """A jit of its own per variant, traced (and compiled) now, as ``variant`` builds it."""
    fn = case["fn"]
    program = jax.jit(lambda *args: fn(*args))
    with _switch(variant):
        jax.block_until_ready(program(*case["args"]))
    return program


def _time_case(
    case: dict[str, Any], variants: tuple[str, ...], reps: int, warmup: int
) -> dict[str, Any]:
    device = jax.devices()[0]
    args = [jax.device_put(a, device) for a in case["args"]]
    programs = {v: _built(case, v) for v in variants}
    for _ in range(warmup):
        for v in variants:
            jax.block_until_ready(programs[v](*args))
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(reps):  # round robin: drift affects every variant alike
        for v in variants:
            started = time.perf_counter()
            jax.block_until_ready(programs[v](*args))
            times[v].append(time.perf_counter() - started)
    row: dict[str, Any] = {"kernel": case["name"], "bandwidth": case["bandwidth"]}
    off = Spread.of(times["off"]).median
    for v in variants:
        spread = Spread.of(times[v])
        row[v] = {"seconds": spread.as_dict(), "bytes_per_s": case["bytes"] / spread.median}
        if v != "off":
            row[v]["overhead"] = spread.median / off - 1
    return row


def _compile_only(case: dict[str, Any]) -> dict[str, Any]:
    from safedma.testing import compile_for_tpu

    row: dict[str, Any] = {"kernel": case["name"], "topology": TOPOLOGY}
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in case["args"]]
    for variant in ("off", "on"):
        try:
            with _switch(variant):
                report = compile_for_tpu(
                    case["fn"],
                    *specs,
                    topology=TOPOLOGY,
                    in_specs=PartitionSpec(),
                    out_specs=PartitionSpec(),
                )
        except Exception as err:
            row[variant] = (
                f"does not compile: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
            )
        else:
            row[variant] = report.generated_code_size_in_bytes
    return row


def _interpret_check(case: dict[str, Any]) -> dict[str, Any]:
    """The ``on`` build in TPU interpret mode on the CPU: right result, nothing reported."""
    import safedma as sd
    from jax.experimental.pallas import tpu as pltpu

    fn, small = _small(case)
    with _switch("off"), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        want = np.asarray(fn(*small))
    try:
        with _switch("on"), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
            with sd.sanitizer_errors():
                got = np.asarray(jax.block_until_ready(fn(*small)))
    except Exception as err:
        return {"kernel": case["name"], "ok": False, "error": f"{type(err).__name__}: {err}"[:300]}
    return {"kernel": case["name"], "ok": bool(np.array_equal(got, want))}


def _small(case: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The case cut down for interpret mode (a few chunks): its function and arguments."""
    name = case["name"]
    if name.startswith("HBM->VMEM"):
        return functools.partial(sdk.hbm_to_vmem, repeats=3), (
            sdk.example(2 * sdk.MAX_CHUNK_BYTES),
        )
    if name.startswith("VMEM->HBM"):
        size = 64 * 1024
        fn = functools.partial(sdk.vmem_to_hbm, size_bytes=size, repeats=2)
        return fn, (sdk.example(size)[: sdk.chunk_rows(size)],)
    if name.startswith("pipeline"):
        return case["fn"], (jnp.arange(2048 * 128, dtype=jnp.float32).reshape(2048, 128),)
    return case["fn"], case["args"]


def run(*, reps: int = 20, warmup: int = 3, quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; print its table (or what was checked without a TPU); its record."""
    heading("6. The DMA sanitizer on a TPU: sanitize on vs off")
    found = cases(quick)
    if tpu_present():
        variants = VARIANTS if _cpu_platform() else ("off", "on, kernel only")
        print(
            f"TPU present: {jax.devices()[0].device_kind}; {reps} rounds after {warmup} "
            "warm-up rounds, median per variant"
            + ("" if _cpu_platform() else "; 'on' left out: set JAX_PLATFORMS=tpu,cpu"),
            flush=True,
        )
        rows = [_time_case(c, variants, reps, warmup) for c in found]
        cells = []
        for r in rows:
            cell = [r["kernel"], f"{r['off']['bytes_per_s'] / 1e9:.1f} GB/s"]
            for v in variants[1:]:
                cell.append(
                    f"{r[v]['bytes_per_s'] / 1e9:.1f} GB/s ({100 * r[v]['overhead']:+.1f} %)"
                )
            cells.append(cell)
        print()
        print(table(["kernel", *variants], cells))
        key = "on" if "on" in variants else "on, kernel only"
        worst = max((r[key]["overhead"] for r in rows if r["bandwidth"]), default=0.0)
        met = worst <= GOAL
        print(
            f"\nworst '{key}' overhead on the bandwidth kernels: {100 * worst:+.1f} % "
            f"(goal at most {100 * GOAL:.0f} %): {'met' if met else 'MISSED'}"
        )
        return {
            "tpu_present": True,
            "device_kind": jax.devices()[0].device_kind,
            "reps": reps,
            "warmup": warmup,
            "results": rows,
            "worst_bandwidth_overhead": worst,
            "goal_met": met,
        }
    print(
        f"{NO_TPU} (jax.devices()[0].platform is {jax.devices()[0].platform!r}). The "
        f"{len(found)} kernels are built compile-only for {TOPOLOGY}, sanitize off and on, "
        "and the sanitized ones run in TPU interpret mode on the CPU; no time is reported.",
        flush=True,
    )
    built = [_compile_only(c) for c in found]
    print()
    print(
        table(
            ["kernel", f"code size off ({TOPOLOGY})", "code size on"],
            [[r["kernel"], r["off"], r["on"]] for r in built],
        )
    )
    checks = [_interpret_check(c) for c in found]
    print()
    print(
        table(
            ["interpret-mode check of the sanitized build (CPU, not timed)", "result"],
            [[c["kernel"], "ok" if c["ok"] else f"FAILED {c.get('error', '')}"] for c in checks],
        )
    )
    ok = all(c["ok"] for c in checks) and all(isinstance(r["on"], int) for r in built)
    return {"tpu_present": False, "compile_only": built, "interpret_checks": checks, "ok": ok}
