"""The registry of kernels whose run-time cost is benchmarked: one entry per kernel.

Each :class:`KernelCase` pairs the per-device function of a safedma kernel
with that of its hand-written pltpu twin, gives example arguments for a ring
of ``n`` devices, and says whether the kernel talks to other devices. The
identity benchmark (benchmarks/identity.py) lowers and compiles both for
every entry; the TPU benchmark times the entries that implement a collective
against ``jax.lax``.

An entry whose module (or twin module) does not exist yet is reported as
unavailable, with the import error, instead of being dropped silently.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


PerDevice = Callable[..., Any]
"""A per-device function: run inside ``jax.shard_map`` over the case's axis."""

F32 = jnp.float32
HBM = pl.BlockSpec(memory_space=pl.ANY)


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One kernel: its safedma and pltpu versions and how to call them.

    ``safedma`` / ``twin`` build the per-device functions (so a missing
    module is found when the registry is read, not at import time);
    ``args(n)`` gives the per-device arguments on a ring of ``n`` devices
    along ``axis`` (the global arguments stack them along dimension 0).
    ``collective`` kernels use remote DMAs and are also built for 16 chips.
    ``kind`` names the ``jax.lax`` collective the kernel implements and
    ``lax`` builds that reference, for the TPU throughput benchmark.
    """

    name: str
    source: str
    safedma: Callable[[], PerDevice]
    twin: Callable[[], PerDevice]
    args: Callable[[int], tuple[jax.ShapeDtypeStruct, ...]]
    collective: bool = False
    axis: str = "x"
    kind: str | None = None
    lax: Callable[[], PerDevice] | None = None

    def global_args(self, n: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        """The arguments of the whole program: each per-device argument n times along dim 0."""
        return tuple(
            jax.ShapeDtypeStruct((a.shape[0] * n, *a.shape[1:]), a.dtype) for a in self.args(n)
        )


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """A registered kernel that cannot be built here, and why."""

    name: str
    source: str
    reason: str


def _load(module: str, attr: str, **bound: object) -> PerDevice:
    """``module.attr`` with keyword arguments bound, named after ``attr``."""
    fn = getattr(importlib.import_module(module), attr)
    if not bound:
        return fn  # type: ignore[no-any-return]
    bound_fn = functools.partial(fn, **bound)
    return functools.update_wrapper(bound_fn, fn)


Loader = Callable[[], PerDevice]


def _pair(
    safedma_module: str, twin_module: str, attr: str, **bound: object
) -> tuple[Loader, Loader]:
    """Loaders of ``attr`` (keyword arguments bound) from a module and from its twin's."""
    return (
        lambda: _load(safedma_module, attr, **bound),
        lambda: _load(twin_module, attr, **bound),
    )


def _library(module: str, attr: str, **bound: object) -> tuple[Loader, Loader]:
    """A kernel of safedma/kernels/<module>.py and its twin in tests/support/twins/."""
    return _pair(f"safedma.kernels.{module}", f"tests.support.twins.{module}", attr, **bound)


def _bench(attr: str, **bound: object) -> tuple[Loader, Loader]:
    """A TPU benchmark kernel of benchmarks/tpu_kernels.py and its pltpu twin."""
    return _pair("benchmarks.tpu_kernels", "benchmarks.tpu_kernels_pltpu", attr, **bound)


def _block(*shape: int, dtype: Any = F32) -> Callable[[int], tuple[jax.ShapeDtypeStruct, ...]]:
    """Per-device arguments of one fixed-shape block, whatever the ring size."""
    return lambda n: (jax.ShapeDtypeStruct(shape, dtype),)


# -- kernels of the core tests (tests/support/kernels_safedma.py, twins tests/support/kernels_pltpu.py)


def _core_local(name: str, twin: bool) -> PerDevice:
    """A core-test kernel body in its tests/support/calls.py set-up, as a per-device function."""
    calls = importlib.import_module("tests.support.calls")
    bodies = importlib.import_module(
        "tests.support.kernels_pltpu" if twin else "tests.support.kernels_safedma"
    )
    import safedma as sd

    body = getattr(bodies, name)
    if not twin:
        body = sd.checked(body)
    setup = getattr(calls, f"{name}_call")

    def per_device(block: jax.Array) -> jax.Array:
        result: jax.Array = setup(body, jax.ShapeDtypeStruct(block.shape, block.dtype))(block)
        return result

    per_device.__name__ = per_device.__qualname__ = name
    return per_device


def _ring_body(module: str, twin: bool) -> PerDevice:
    """A ring permute body in the pallas_call of tests/calls.ring_permute_call."""
    import safedma as sd

    body = importlib.import_module(module).ring_permute
    if not twin:
        body = sd.checked(body)

    def per_device(block: jax.Array) -> jax.Array:
        result: jax.Array = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        )(block)
        return result

    per_device.__name__ = per_device.__qualname__ = "ring_permute"
    return per_device


# -- jax.lax references, for the TPU benchmark


def _lax_ppermute(axis: str, shift: int) -> PerDevice:
    def per_device(x: jax.Array) -> jax.Array:
        n = jax.lax.axis_size(axis)
        result: jax.Array = jax.lax.ppermute(x, axis, [(i, (i + shift) % n) for i in range(n)])
        return result

    per_device.__name__ = "lax.ppermute"
    return per_device


def _lax_all_gather(axis: str) -> PerDevice:
    def per_device(x: jax.Array) -> jax.Array:
        result: jax.Array = jax.lax.all_gather(x, axis, tiled=True)
        return result

    per_device.__name__ = "lax.all_gather"
    return per_device


def _lax_psum_scatter(axis: str) -> PerDevice:
    def per_device(x: jax.Array) -> jax.Array:
        result: jax.Array = jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
        return result

    per_device.__name__ = "lax.psum_scatter"
    return per_device


def _lax_psum(axis: str) -> PerDevice:
    def per_device(x: jax.Array) -> jax.Array:
        result: jax.Array = jax.lax.psum(x, axis)
        return result

    per_device.__name__ = "lax.psum"
    return per_device


def _affine(chunk: jax.Array) -> jax.Array:
    return chunk * 2.0 + 1.0


def _gather_args(n: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((64, 8, 512), F32), jax.ShapeDtypeStruct((24,), jnp.int32))


def _ring_rows(
    rows_per_device: int, cols: int
) -> Callable[[int], tuple[jax.ShapeDtypeStruct, ...]]:
    """A block of n * rows_per_device rows: what a reduce-scatter splits into n chunks."""
    return lambda n: (jax.ShapeDtypeStruct((n * rows_per_device, cols), F32),)


_MiB = 2**20

CASES: tuple[KernelCase, ...] = (
    # Core-test kernels.
    KernelCase(
        "scale_copy",
        "tests/support/kernels_safedma.py",
        lambda: _core_local("scale_copy", False),
        lambda: _core_local("scale_copy", True),
        _block(32, 128),
    ),
    KernelCase(
        "reverse_halves",
        "tests/support/kernels_safedma.py",
        lambda: _core_local("reverse_halves", False),
        lambda: _core_local("reverse_halves", True),
        _block(32, 128),
    ),
    KernelCase(
        "double_buffered",
        "tests/support/kernels_safedma.py",
        lambda: _core_local("double_buffered", False),
        lambda: _core_local("double_buffered", True),
        _block(32, 128),
    ),
    KernelCase(
        "ring_permute",
        "tests/support/kernels_safedma.py",
        lambda: _ring_body("tests.support.kernels_safedma", False),
        lambda: _ring_body("tests.support.kernels_pltpu", True),
        _block(32, 128),
        collective=True,
        kind="ppermute",
        lax=lambda: _lax_ppermute("x", 1),
    ),
    # The library's kernels (safedma/kernels/, twins tests/support/twins/).
    KernelCase(
        "kernels.gather_pages",
        "safedma/kernels/gather.py",
        *_library("gather", "gather_pages"),
        _gather_args,
    ),
    KernelCase(
        "kernels.pipeline",
        "safedma/kernels/pipeline.py",
        *_library("pipeline", "pipeline", fn=_affine, chunk_rows=16),
        _block(80, 512),
    ),
    KernelCase(
        "kernels.ppermute",
        "safedma/kernels/ppermute.py",
        *_library("ppermute", "ppermute", axis="x", shift=1),
        _block(32, 128),
        collective=True,
        kind="ppermute",
        lax=lambda: _lax_ppermute("x", 1),
    ),
    KernelCase(
        "kernels.ppermute(barrier)",
        "safedma/kernels/ppermute.py",
        *_library("ppermute", "ppermute", axis="x", shift=1, collective_id=0),
        _block(32, 128),
        collective=True,
    ),
    KernelCase(
        "kernels.all_gather",
        "safedma/kernels/all_gather.py",
        *_library("all_gather", "all_gather", axis="x"),
        _block(16, 256),
        collective=True,
        kind="all_gather",
        lax=lambda: _lax_all_gather("x"),
    ),
    KernelCase(
        "kernels.all_gather_bidirectional",
        "safedma/kernels/all_gather.py",
        *_library("all_gather", "all_gather_bidirectional", axis="x", collective_id=0),
        _block(16, 256),
        collective=True,
        kind="all_gather",
        lax=lambda: _lax_all_gather("x"),
    ),
    KernelCase(
        "kernels.reduce_scatter",
        "safedma/kernels/reduce_scatter.py",
        *_library("reduce_scatter", "reduce_scatter", axis="x"),
        _ring_rows(16, 256),
        collective=True,
        kind="reduce_scatter",
        lax=lambda: _lax_psum_scatter("x"),
    ),
    KernelCase(
        "kernels.all_reduce",
        "safedma/kernels/all_reduce.py",
        *_library("all_reduce", "all_reduce", axis="x"),
        _ring_rows(16, 256),
        collective=True,
        kind="all_reduce",
        lax=lambda: _lax_psum("x"),
    ),
    # The TPU benchmark's own kernels (benchmarks/tpu_kernels.py).
    KernelCase(
        "bench.hbm_to_vmem",
        "benchmarks/tpu_kernels.py",
        *_bench("hbm_to_vmem", repeats=3),
        _block(3 * 8192, 128),
    ),
    KernelCase(
        "bench.vmem_to_hbm",
        "benchmarks/tpu_kernels.py",
        *_bench("vmem_to_hbm", size_bytes=12 * _MiB, repeats=3),
        _block(8192, 128),
    ),
    KernelCase(
        "bench.vmem_to_hbm(1 chunk)",
        "benchmarks/tpu_kernels.py",
        *_bench("vmem_to_hbm", size_bytes=64 * 1024, repeats=3),
        _block(128, 128),
    ),
    KernelCase(
        "bench.hbm_to_hbm",
        "benchmarks/tpu_kernels.py",
        *_bench("hbm_to_hbm"),
        _block(8192, 128),
    ),
    KernelCase(
        "bench.remote_copy",
        "benchmarks/tpu_kernels.py",
        *_bench("remote_copy", repeats=4),
        _block(256, 128),
        collective=True,
    ),
)


@dataclasses.dataclass(frozen=True)
class Built:
    """A case with both per-device functions built."""

    case: KernelCase
    safedma: PerDevice
    twin: PerDevice


def registry(names: set[str] | None = None) -> tuple[list[Built], list[Unavailable]]:
    """The cases whose modules import here, and the ones that do not (with the reason)."""
    built: list[Built] = []
    missing: list[Unavailable] = []
    for case in CASES:
        if names is not None and case.name not in names:
            continue
        try:
            built.append(Built(case, case.safedma(), case.twin()))
        except ImportError as err:
            missing.append(Unavailable(case.name, case.source, f"{type(err).__name__}: {err}"))
    return built, missing
