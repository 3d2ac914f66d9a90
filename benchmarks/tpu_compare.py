"""Benchmark 4b, on one TPU chip: safedma's kernels against the raw, BlockSpec and XLA programs
that do the same work on the same bytes.

* ``pipeline``: ``safedma.kernels.pipeline(x, x*2+1)`` against its pltpu twin,
  a BlockSpec-grid Pallas kernel (Pallas's own double buffering) and XLA's
  ``x * 2 + 1``: each reads and writes the whole array once.
* ``gather_pages``: ``safedma.kernels.gather_pages`` against its twin and
  ``jnp.take(pages, indices, axis=0)``: k pages read, k pages written.
* ``HBM->HBM``: one DMA of the whole array (benchmarks/tpu_kernels.py) against
  its twin and XLA's ``jnp.copy``.
* ``HBM->VMEM reads``: the read-streaming kernel (``hbm_to_vmem``, 4 MiB chunks,
  two in flight) against its twin and XLA's read-only reduction
  ``jnp.sum(x, axis=0)`` over the same array, and XLA's ``x + 1`` (which also
  writes as many bytes as it reads) for scale.

Each comparison times its variants interleaved: repetition i calls every
variant once, in turn, so drift hits all alike; each call is waited with
``block_until_ready``; ``reps`` repetitions after a compile and ``warmup``
calls. Reported per variant: median time per call, bytes moved (read +
written) per second, that as a fraction of the chip's nominal HBM bandwidth,
and the per-repetition time ratio safedma / variant (median, IQR, min-max;
above 1: safedma slower). Before timing, the variants' outputs are compared
(they must be equal, except the reduction's).
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
from jax.experimental import pallas as pl

from benchmarks import tpu_kernels as sdk
from benchmarks import tpu_kernels_pltpu as twin
from benchmarks._common import Spread, ratio_text, table

MiB = 2**20
#: Nominal HBM bandwidth per chip, bytes per second, by device kind.
NOMINAL_HBM = {"TPU v5 lite": 819e9, "TPU v6 lite": 1640e9, "TPU v5": 2765e9, "TPU v4": 1228e9}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One piece of work done several ways; ``variants[0]`` is safedma's."""

    name: str
    size: int  # bytes of the main array (the label)
    read: int  # bytes each call reads from HBM
    written: int  # bytes each call writes to HBM
    specs: tuple[jax.ShapeDtypeStruct, ...]
    inputs: Callable[[], tuple[np.ndarray, ...]]
    variants: tuple[Variant, ...]
    same_outputs: Sequence[str] = ()  # variants whose output must equal safedma's
    note: str = ""


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"


def _affine(chunk: jax.Array) -> jax.Array:
    return chunk * 2 + 1


def _blockspec_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2 + 1


def blockspec_affine(x: jax.Array, *, block_rows: int) -> jax.Array:
    """``x * 2 + 1`` by a Pallas grid over row blocks, Pallas pipelining the DMAs."""
    spec = pl.BlockSpec((block_rows, x.shape[1]), lambda i: (i, 0))
    result: jax.Array = pl.pallas_call(
        _blockspec_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // block_rows,),
        in_specs=[spec],
        out_specs=spec,
        name="blockspec_affine",
    )(x)
    return result


def _random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def pipeline_comparison(size: int, cols: int = 512, chunk_rows: int = 512) -> Comparison:
    from safedma.kernels import pipeline
    from tests.support.twins import pipeline as pipeline_twin

    rows = size // (cols * 4)
    spec = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    return Comparison(
        "pipeline x*2+1",
        size,
        size,
        size,
        (spec,),
        lambda: (_random((rows, cols), 1),),
        (
            Variant("safedma", functools.partial(pipeline, fn=_affine, chunk_rows=chunk_rows)),
            Variant(
                "pltpu twin",
                functools.partial(pipeline_twin.pipeline, fn=_affine, chunk_rows=chunk_rows),
            ),
            Variant("BlockSpec grid", functools.partial(blockspec_affine, block_rows=chunk_rows)),
            Variant("XLA", _affine),
        ),
        ("pltpu twin", "BlockSpec grid", "XLA"),
        f"({rows}, {cols}) float32 in {chunk_rows}-row chunks",
    )


def gather_comparison(num_pages: int, page_rows: int, k: int) -> Comparison:
    from safedma.kernels import gather_pages
    from tests.support.twins import gather as gather_twin

    page = page_rows * 128 * 4
    pages = jax.ShapeDtypeStruct((num_pages, page_rows, 128), jnp.float32)
    idx = jax.ShapeDtypeStruct((k,), jnp.int32)

    def inputs() -> tuple[np.ndarray, ...]:
        indices = np.random.default_rng(2).integers(0, num_pages, k).astype(np.int32)
        return _random((num_pages, page_rows, 128), 3), indices

    return Comparison(
        "gather_pages",
        k * page,
        k * page,
        k * page,
        (pages, idx),
        inputs,
        (
            Variant("safedma", gather_pages),
            Variant("pltpu twin", gather_twin.gather_pages),
            Variant("XLA take", lambda p, i: jnp.take(p, i, axis=0)),
        ),
        ("pltpu twin", "XLA take"),
        f"{k} of {num_pages} pages of {_size(page)}",
    )


def hbm_copy_comparison(size: int) -> Comparison:
    rows = size // sdk.ROW_BYTES
    return Comparison(
        "HBM->HBM copy",
        size,
        size,
        size,
        (jax.ShapeDtypeStruct((rows, 128), jnp.float32),),
        lambda: (_random((rows, 128), 4),),
        (
            Variant("safedma", sdk.hbm_to_hbm),
            Variant("pltpu twin", twin.hbm_to_hbm),
            Variant("XLA copy", jnp.copy),
        ),
        ("pltpu twin", "XLA copy"),
        "one DMA against XLA's jnp.copy (a new buffer)",
    )


def _xla_sum(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=0)


def _xla_plus_one(x: jax.Array) -> jax.Array:
    return x + 1


def read_comparison(size: int) -> Comparison:
    rows = size // sdk.ROW_BYTES
    return Comparison(
        "HBM->VMEM reads",
        size,
        size,
        0,
        (jax.ShapeDtypeStruct((rows, 128), jnp.float32),),
        lambda: (_random((rows, 128), 5),),
        (
            Variant("safedma", functools.partial(sdk.hbm_to_vmem, repeats=1)),
            Variant("pltpu twin", functools.partial(twin.hbm_to_vmem, repeats=1)),
            Variant("XLA sum(axis=0)", _xla_sum),
            Variant("XLA x + 1 (reads and writes)", _xla_plus_one),
        ),
        ("pltpu twin",),
        "4 MiB chunks, two in flight; XLA x + 1 writes as much as it reads "
        "(its bandwidth counts both)",
    )


def comparisons(quick: bool) -> list[Comparison]:
    """What is timed; ``quick``: one size of each."""
    out = [pipeline_comparison(64 * MiB)]
    if not quick:
        out.insert(0, pipeline_comparison(4 * MiB))
    out.append(gather_comparison(2048, 16, 512))  # 8 KiB pages, 4 MiB gathered
    if not quick:
        out.append(gather_comparison(512, 128, 128))  # 64 KiB pages, 8 MiB gathered
    if not quick:
        out.append(hbm_copy_comparison(16 * MiB))
    out.append(hbm_copy_comparison(256 * MiB))
    out.append(read_comparison(256 * MiB))
    return out


# ------------------------------------------------------------------ with a TPU


def _moved(c: Comparison, v: Variant) -> int:
    if v.name.startswith("XLA x + 1"):
        return 2 * c.read  # it writes what it reads
    return c.read + c.written


def time_comparison(c: Comparison, reps: int, warmup: int) -> dict[str, Any]:
    device = jax.devices()[0]
    args = [jax.device_put(a, device) for a in c.inputs()]
    programs = [jax.jit(v.fn) for v in c.variants]
    outputs = [np.asarray(jax.block_until_ready(p(*args))) for p in programs]  # compile
    mismatched = [
        v.name
        for v, out in zip(c.variants, outputs)
        if v.name in c.same_outputs and not np.array_equal(out, outputs[0])
    ]
    for _ in range(warmup):
        for p in programs:
            jax.block_until_ready(p(*args))
    times: list[list[float]] = [[] for _ in programs]
    for _ in range(reps):
        for i, p in enumerate(programs):
            started = time.perf_counter()
            jax.block_until_ready(p(*args))
            times[i].append(time.perf_counter() - started)
    nominal = NOMINAL_HBM.get(str(device.device_kind))
    rows = []
    for v, ts in zip(c.variants, times):
        s = Spread.of(ts)
        moved = _moved(c, v)
        row: dict[str, Any] = {
            "variant": v.name,
            "seconds": s.as_dict(),
            "bytes_moved": moved,
            "bytes_per_s": moved / s.median,
        }
        if nominal:
            row["fraction_of_nominal_hbm"] = moved / s.median / nominal
        if v is not c.variants[0]:
            row["ratio_safedma_over_this"] = Spread.of(
                [a / b for a, b in zip(times[0], ts)]
            ).as_dict()
        rows.append(row)
    return {
        "comparison": c.name,
        "size": c.size,
        "note": c.note,
        "reps": reps,
        "warmup": warmup,
        "outputs_differ": mismatched,
        "variants": rows,
    }


def report(results: list[dict[str, Any]], device_kind: str) -> str:
    nominal = NOMINAL_HBM.get(device_kind)
    cells = []
    for r in results:
        for v in r["variants"]:
            s = v["seconds"]
            ratio = v.get("ratio_safedma_over_this")
            cells.append(
                [
                    r["comparison"],
                    _size(r["size"]),
                    v["variant"],
                    f"{s['median'] * 1e3:.3f} ms (IQR {s['q1'] * 1e3:.3f}-{s['q3'] * 1e3:.3f})",
                    f"{v['bytes_per_s'] / 1e9:.1f} GB/s",
                    f"{v['fraction_of_nominal_hbm']:.0%}"
                    if "fraction_of_nominal_hbm" in v
                    else "-",
                    ratio_text(Spread(**ratio)) if ratio else "-",
                    "DIFFERENT OUTPUT" if v["variant"] in r["outputs_differ"] else "",
                ]
            )
    nominal_text = f"{nominal / 1e9:.0f} GB/s" if nominal else "unknown"
    return table(
        [
            "work",
            "size",
            "variant",
            "median per call",
            "moved (read + written)",
            f"of nominal HBM ({nominal_text})",
            "time ratio safedma / variant",
            "check",
        ],
        cells,
    )


def run_timed(reps: int, warmup: int, quick: bool) -> dict[str, Any]:
    results = []
    for c in comparisons(quick):
        try:
            r = time_comparison(c, reps, warmup)
        except Exception as err:  # a size that does not fit is a result, not a crash
            r = {
                "comparison": c.name,
                "size": c.size,
                "error": f"{type(err).__name__}: {err}"[:300],
            }
            print(f"  {c.name} {_size(c.size)}: {r['error']}", flush=True)
        else:
            medians = ", ".join(
                f"{v['variant']} {v['bytes_per_s'] / 1e9:.1f} GB/s" for v in r["variants"]
            )
            print(f"  {c.name} {_size(c.size)}: {medians}", flush=True)
        results.append(r)
    kind = str(jax.devices()[0].device_kind)
    timed = [r for r in results if "variants" in r]
    print()
    print(report(timed, kind))
    for r in results:
        if "error" in r:
            print(f"{r['comparison']} {_size(r['size'])}: {r['error']}")
        elif r["outputs_differ"]:
            print(f"{r['comparison']} {_size(r['size'])}: outputs differ: {r['outputs_differ']}")
    return {
        "device_kind": kind,
        "nominal_hbm_bytes_per_s": NOMINAL_HBM.get(kind),
        "results": results,
        "ok": all("variants" in r and not r["outputs_differ"] for r in results),
    }


# ------------------------------------------------------------------ without a TPU


def compile_only(topology: str) -> list[dict[str, Any]]:
    """Each variant compiled for ``topology`` (one size per comparison), nothing timed."""
    from safedma.testing import compile_for_tpu, tpu_mesh

    n = int(tpu_mesh(topology).devices.size)
    out = []
    for c in comparisons(quick=True):
        specs = [jax.ShapeDtypeStruct((s.shape[0] * n, *s.shape[1:]), s.dtype) for s in c.specs]
        for v in c.variants:
            row: dict[str, Any] = {"comparison": c.name, "size": c.size, "variant": v.name}
            try:
                rep = compile_for_tpu(v.fn, *specs, topology=topology)
            except Exception as err:
                row["compile_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            else:
                row["generated_code_size_in_bytes"] = rep.generated_code_size_in_bytes
            out.append(row)
    return out
