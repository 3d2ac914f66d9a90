"""What the TPU lane runs: each single-chip kernel and DMA pattern safedma supports, with
its inputs and the output numpy says it must give.

Each builder returns a :class:`LaneCase`: a single-device function (run by
``jax.jit`` on the chip and by ``safedma.testing.simulate`` on the CPU), its
numpy arguments and the expected output. Kernels that already exist are
imported from where they live (the library's, and the suite's in
tests/support); the rest are written here, each as small as its pattern
allows. Every function here lowers and compiles for TPU v5e with libtpu's
compiler (``safedma.testing.compile_for_tpu(..., topology="v5e:2x2",
in_specs=P(), out_specs=P())``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

HBM = pl.BlockSpec(memory_space=pl.ANY)
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
F32 = jnp.float32
LANES = 128


@dataclasses.dataclass(frozen=True)
class LaneCase:
    """One kernel or pattern: ``fn(*args)`` must give ``want`` on the chip and in simulate.

    ``simulate_limit``: a pattern of the error ``simulate`` stops with where jax's TPU
    interpreter cannot run the kernel (the lane then requires ``verify`` to pass
    instead, and compares again once simulate runs it).
    """

    fn: Callable[..., Any]
    args: tuple[np.ndarray, ...]
    want: Any
    simulate_limit: str = ""


# What jax's TPU interpreter (0.10.2 and 0.12) cannot run, in the words of the error.
RESHAPE_VIEWS = r"ReshapeTransform"  # a .reshape() view of a ref
SEMAPHORE_READ = r"semaphore_read"  # no CPU rule for pl.semaphore_read
FUTURES = r"lives across pallas_calls"  # semaphores live for one kernel only
PIPELINE_TILING = r"Unsupported TPU device kind: cpu"  # emit_pipeline asks the device


def rows_f32(rows: int, cols: int = LANES, seed: int = 0) -> np.ndarray:
    """Distinct float32 values (exact), so a misplaced row shows."""
    base = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    return base + np.float32(seed * 2**20)


def _hbm_call(
    kernel: Callable[..., None], scratch: list[Any], **options: Any
) -> Callable[[jax.Array], jax.Array]:
    """``sd.pallas_call`` of ``kernel`` with input and output in HBM, shaped like the input."""

    def run(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            **options,
        )(x)
        return out

    return run


# ------------------------------------------------------------------ local copies


def hbm_vmem_hbm() -> LaneCase:
    """HBM -> VMEM, compute in VMEM, VMEM -> HBM (the suite's scale_copy)."""
    from tests.support import kernels_safedma

    x = rows_f32(64)
    fn = _hbm_call(kernels_safedma.scale_copy, [sd.vmem(x.shape, F32), sd.dma_semaphore()])
    return LaneCase(fn, (x,), x * 2 + 1)


def two_copies_in_flight() -> LaneCase:
    """Two sliced copies in flight on two semaphores, one at priority 1 (reverse_halves)."""
    from tests.support import kernels_safedma

    x = rows_f32(64)
    fn = _hbm_call(kernels_safedma.reverse_halves, [sd.vmem(x.shape, F32), sd.dma_semaphores(2)])
    return LaneCase(fn, (x,), np.concatenate([x[32:], x[:32]]))


def double_buffering() -> LaneCase:
    """Chunk i + 1 fetched while chunk i is computed (the suite's double_buffered)."""
    from tests.support import kernels_safedma

    chunk = kernels_safedma.CHUNK
    x = rows_f32(8 * chunk)
    fn = _hbm_call(
        kernels_safedma.double_buffered,
        [
            sd.vmem((2, chunk, LANES), F32),
            sd.vmem((chunk, LANES), F32),
            sd.dma_semaphores(2),
            sd.dma_semaphore(),
        ],
    )
    return LaneCase(fn, (x,), x * 3)


def _hbm_to_hbm_kernel(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray) -> None:
    half = x.shape[0] // 2
    top, bottom = pl.ds(0, half), pl.ds(half, half)
    first = sd.LocalCopy(x.at[top], o.at[bottom], sems.at[0]).start()
    second = sd.LocalCopy(x.at[bottom], o.at[top], sems.at[1]).start()
    first.wait()
    second.wait()


def hbm_to_hbm() -> LaneCase:
    """Two HBM -> HBM copies of row windows in flight, no VMEM (the halves swapped)."""
    x = rows_f32(4096)  # 2 MiB
    fn = _hbm_call(_hbm_to_hbm_kernel, [sd.dma_semaphores(2)])
    return LaneCase(fn, (x,), np.concatenate([x[2048:], x[:2048]]))


SMEM_WORDS = 128


def _smem_kernel(x: sd.DataRef, o: sd.DataRef, table: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x, table, sem).start().wait()  # HBM -> SMEM

    def update(i: jax.Array, carry: None) -> None:
        table[i] = table[i] * 3 + i  # scalar work on the copied words
        return carry

    jax.lax.fori_loop(0, SMEM_WORDS, update, None)
    sd.LocalCopy(table, o, sem).start().wait()  # SMEM -> HBM


def smem_copies() -> LaneCase:
    """HBM -> SMEM, scalar work, SMEM -> HBM (1-D int32)."""
    x = (np.arange(SMEM_WORDS, dtype=np.int32) * 7) - 100
    fn = _hbm_call(_smem_kernel, [sd.smem((SMEM_WORDS,), jnp.int32), sd.dma_semaphore()])
    return LaneCase(fn, (x,), x * 3 + np.arange(SMEM_WORDS, dtype=np.int32))


# ------------------------------------------------------------------ the library's kernels


def _affine(chunk: jax.Array) -> jax.Array:
    return chunk * 2 + 1


def pipeline_f32() -> LaneCase:
    """safedma.kernels.pipeline over a (1024, 256) float32 array in 128-row chunks."""
    from safedma.kernels import pipeline

    x = rows_f32(1024, 256)
    fn = functools.partial(pipeline, fn=_affine, chunk_rows=128)
    return LaneCase(fn, (x,), x * 2 + 1)


def _negate(chunk: jax.Array) -> jax.Array:
    return -chunk


def pipeline_int32() -> LaneCase:
    """safedma.kernels.pipeline on int32 (another tile dtype), odd step count."""
    from safedma.kernels import pipeline

    x = np.arange(7 * 64 * 128, dtype=np.int32).reshape(7 * 64, 128) - 5000
    fn = functools.partial(pipeline, fn=_negate, chunk_rows=64)
    return LaneCase(fn, (x,), -x)


def gather_pages() -> LaneCase:
    """safedma.kernels.gather_pages: 12 of 32 pages, repeats and any order, one wait."""
    from safedma.kernels import gather_pages as gather

    pages = rows_f32(32 * 16).reshape(32, 16, LANES)
    indices = np.array([5, 0, 31, 5, 17, 2, 2, 30, 11, 8, 0, 19], dtype=np.int32)
    return LaneCase(gather, (pages, indices), pages[indices])


# ------------------------------------------------------------------ ref views, semaphores


def _views_kernel(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    # x, o: float32 (32, 128) in HBM; buf: int32 (16, 256) in VMEM.
    sd.LocalCopy(x.reshape(16, 256), buf.bitcast(F32), sem).start().wait()
    # Overwrite buf's second half with x's first 16 rows, seen as 8 rows of 256.
    top = x.at[pl.ds(0, 16)].reshape(8, 256)
    sd.LocalCopy(top, buf.bitcast(F32).at[pl.ds(8, 8)], sem).start().wait()
    sd.LocalCopy(buf, o.bitcast(jnp.int32).reshape(16, 256), sem).start().wait()


def ref_views() -> LaneCase:
    """`.reshape` and `.bitcast` views of HBM and VMEM refs as copy operands."""
    x = rows_f32(32)
    fn = _hbm_call(_views_kernel, [sd.vmem((16, 256), jnp.int32), sd.dma_semaphore()])
    return LaneCase(fn, (x,), np.concatenate([x[:16], x[:16]]), RESHAPE_VIEWS)


def _nd_sems_kernel(
    x: sd.DataRef,
    o: sd.DataRef,
    sems: sd.SemArray2,
    cube: sd.SemArray3,
    flags: sd.RegularSemArray2,
) -> None:
    i = pl.program_id(0)
    half = x.shape[0] // 2
    top, bottom = pl.ds(0, half), pl.ds(half, half)
    first = sd.LocalCopy(x.at[top], o.at[bottom], sems.at[1, 2]).start()
    second = sd.LocalCopy(x.at[bottom], o.at[top], sems.at[i % 2].at[0]).start()
    first.wait()
    second.wait()
    sd.LocalCopy(o.at[top], o.at[top], cube.at[1, 0, 3]).start().wait()
    sd.signal(flags.at[1, i % 2], 2)
    sd.wait(flags.at[1, i % 2], 2)


def nd_semaphore_arrays() -> LaneCase:
    """2-D and 3-D DMA semaphore arrays (static and traced indices), 2-D REGULAR ones, a grid."""
    x = rows_f32(64)
    fn = _hbm_call(
        _nd_sems_kernel,
        [sd.dma_semaphores((2, 3)), sd.dma_semaphores((2, 2, 4)), sd.regular_semaphores((2, 2))],
        grid=(2,),
    )
    return LaneCase(fn, (x,), np.concatenate([x[32:], x[:32]]))


def _regular_kernel(
    x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef, flags: sd.RegularSemArray
) -> None:
    sd.signal(flags.at[0], 3)
    sd.signal(flags.at[1])
    handle = sd.LocalCopy(x, o, sem).start()
    sd.wait(flags.at[0], 2)
    sd.wait(flags.at[1])
    handle.wait()
    sd.wait(flags.at[0])


def regular_semaphores() -> LaneCase:
    """sd.signal / sd.wait on REGULAR semaphores, amounts above 1, around a copy."""
    x = rows_f32(64)
    fn = _hbm_call(_regular_kernel, [sd.dma_semaphore(), sd.regular_semaphores(2)])
    return LaneCase(fn, (x,), x)


def _read_kernel(
    x: sd.DataRef, o: sd.DataRef, counts: sd.DataRef, sem: sd.SemRef, flag: sd.RegularSem
) -> None:
    sd.signal(flag, 3)
    counts[0] = sd.read(flag)
    sd.wait(flag, 2)
    counts[1] = sd.read(flag)
    sd.wait(flag)
    counts[2] = sd.read(flag)
    sd.LocalCopy(x, o, sem).start().wait()
    counts[3] = sd.read(sem)  # a DMA semaphore, after its wait


def semaphore_read() -> LaneCase:
    """sd.read of REGULAR and DMA semaphores, the counts returned through SMEM."""
    x = rows_f32(64)

    def fn(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        out: tuple[jax.Array, jax.Array] = sd.pallas_call(
            _read_kernel,
            (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((4,), jnp.int32)),
            in_specs=[HBM],
            out_specs=(HBM, SMEM),
            scratch_shapes=[sd.dma_semaphore(), sd.regular_semaphore()],
        )(x)
        return out

    return LaneCase(fn, (x,), (x, np.array([3, 1, 0, 0], dtype=np.int32)), SEMAPHORE_READ)


def _scoped_kernel(x: sd.DataRef, o: sd.DataRef) -> None:
    def body(
        a: sd.DataRef, b: sd.DataRef, sems: sd.SemArray2, one: sd.SemRef, flag: sd.RegularSem
    ) -> None:
        sd.LocalCopy(x, a, sems.at[0, 1]).start().wait()
        b[...] = a[...] + 1
        sd.LocalCopy(b, o, one).start().wait()
        sd.signal(flag)
        sd.wait(flag)

    sd.run_scoped(
        body,
        sd.vmem((32, LANES), F32),
        sd.vmem((32, LANES), F32),
        sd.dma_semaphores((2, 2)),
        sd.dma_semaphore(),
        sd.regular_semaphore(),
    )

    def named(*, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(o, buf, sem).start().wait()
        buf[...] = buf[...] * 2
        sd.LocalCopy(buf, o, sem).start().wait()

    sd.run_scoped(named, buf=sd.vmem((32, LANES), F32), sem=sd.dma_semaphore())


def run_scoped() -> LaneCase:
    """sd.run_scoped with VMEM buffers, DMA semaphores (one, 2-D), a REGULAR one, keywords."""
    x = rows_f32(32)
    return LaneCase(_hbm_call(_scoped_kernel, []), (x,), (x + 1) * 2)


# ------------------------------------------------------------------ futures and pipelines


def dma_future() -> LaneCase:
    """sd.start_async in one pallas_call, sd.finish_async in the next (the suite's)."""
    from tests.corpus import futures

    x = rows_f32(64)
    return LaneCase(futures.copy_through_future, (x,), x, FUTURES)


def staggered_futures() -> LaneCase:
    """Four futures chained: each call finishes one copy and starts the next."""
    from tests.corpus import futures

    x = rows_f32(64)
    return LaneCase(futures.staggered_futures, (x,), x, FUTURES)


def emit_pipeline_and_sync_copy() -> LaneCase:
    """sd.emit_pipeline in a checked kernel next to sd.sync_copy (the suite's pipelined_scale)."""
    from tests.corpus import pipelines

    x = rows_f32(64)
    fn = pipelines._pipeline_call(  # noqa: SLF001 (the corpus's own set-up, shared)
        pipelines.pipelined_scale, [sd.vmem(pipelines.BLOCK, F32)], sd.pallas_call
    )
    return LaneCase(fn, (x,), x * 2, PIPELINE_TILING)


def paged_prefetch() -> LaneCase:
    """Scalar-prefetched page table, grid-step prefetch into a double buffer, a 2-D
    semaphore array per slot and page, the result out through reshape + bitcast views."""
    from tests.corpus import semaphore_arrays as sa

    steps, num_pages = sa.RPA_STEPS, sa.RPA_NUM_PAGES
    pages = rows_f32(num_pages * sa.PAGE_ROWS).reshape(num_pages, sa.PAGE_ROWS, LANES)
    table = np.array([(7 * i + 3) % num_pages for i in range(steps * sa.PAGES)], dtype=np.int32)
    fn = sa.rpa_program(True).fn
    want = pages[table].reshape(steps, sa.PAGES * sa.PAGE_ROWS, LANES).view(np.uint32)
    return LaneCase(fn, (table, pages), want, RESHAPE_VIEWS)


# ------------------------------------------------------------------ a TensorCore mesh


def one_core_mesh() -> Any:
    """A mesh of the chip's one TensorCore (jax 0.12 has a public class, 0.10.2 a factory)."""
    mesh_type = getattr(pltpu, "TensorCoreMesh", None)
    if mesh_type is not None and "num_cores" in str(getattr(mesh_type, "__dataclass_fields__", "")):
        return mesh_type(axis_name="core", num_cores=1)
    return pltpu.create_tensorcore_mesh("core", num_cores=1)


def _core_body(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x, buf, sem).start().wait()

    @pl.when(sd.my_index("core") == 0)
    def _() -> None:
        buf[...] = buf[...] + 5

    sd.LocalCopy(buf, o, sem).start().wait()


def core_kernel() -> LaneCase:
    """sd.core_kernel (pl.kernel) over a one-core TensorCore mesh."""
    x = rows_f32(64)

    def fn(x: jax.Array) -> jax.Array:
        call = sd.core_kernel(
            _core_body,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=one_core_mesh(),
            scratch_types=[sd.vmem(x.shape, F32), sd.dma_semaphore()],
        )
        out: jax.Array = call(x)
        return out

    return LaneCase(fn, (x,), x + 5)


#: Every lane case by name; the test modules pick theirs from here.
CASES: dict[str, Callable[[], LaneCase]] = {
    "hbm_vmem_hbm": hbm_vmem_hbm,
    "two_copies_in_flight": two_copies_in_flight,
    "double_buffering": double_buffering,
    "hbm_to_hbm": hbm_to_hbm,
    "smem_copies": smem_copies,
    "pipeline_f32": pipeline_f32,
    "pipeline_int32": pipeline_int32,
    "gather_pages": gather_pages,
    "ref_views": ref_views,
    "nd_semaphore_arrays": nd_semaphore_arrays,
    "regular_semaphores": regular_semaphores,
    "semaphore_read": semaphore_read,
    "run_scoped": run_scoped,
    "dma_future": dma_future,
    "staggered_futures": staggered_futures,
    "emit_pipeline_and_sync_copy": emit_pipeline_and_sync_copy,
    "paged_prefetch": paged_prefetch,
    "core_kernel": core_kernel,
}
