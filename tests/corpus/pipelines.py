"""``emit_pipeline`` and ``sync_copy``: jax's own pipeline next to safedma copies, and
``sd.emit_pipeline``, whose body is checked as a kernel of its own.

jax's pipeline issues raw copies the kernel scope does not see, so it coexists with the
checks. Lowering needs a TPU generation on jax 0.12 (``TPU``: a chip, no mesh axes).

* a pipeline and a typed ``sync_copy`` of its first block, with the raw twin (jax's
  pipelining guide, written for this suite);
* a raw ``pltpu.emit_pipeline`` inside a checked kernel, a safedma copy after it;
* a copy a pipeline body starts and leaves in flight (T7, naming the body);
* ``sync_copy`` of another shape, another dtype, or a value (T1, T2, a value for a ref);
* a manual DMA running beside a raw pipeline, into an output of its own or (seeded) into
  the output the pipeline writes.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import DataRef, SemRef
from tests.corpus._calls import TPU, X, local
from tests.corpus._case import OK, Case, Ok, Program, Raises

BLOCK = (8, 128)
SPEC = pl.BlockSpec(BLOCK, lambda i: (i, 0))
GUIDE = "jax Pallas TPU pipelining guide, written for this suite"


def double(x_vmem: DataRef, o_vmem: DataRef) -> None:
    o_vmem[...] = x_vmem[...] * 2


def _block_index(i: jax.Array) -> tuple[jax.Array, int]:
    return i, 0


def pipelined_scale(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef) -> None:
    spec = pl.BlockSpec(BLOCK, _block_index)
    steps = x_hbm.shape[0] // BLOCK[0]
    sd.emit_pipeline(double, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    # A safedma copy next to the pipeline: the first block again, through VMEM.
    sd.sync_copy(o_hbm.at[pl.ds(0, BLOCK[0])], buf)
    sd.sync_copy(buf, o_hbm.at[pl.ds(0, BLOCK[0])])


def pipelined_scale_raw(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
    spec = pl.BlockSpec(BLOCK, lambda i: (i, 0))
    steps = x_hbm.shape[0] // BLOCK[0]
    pltpu.emit_pipeline(double, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    pltpu.sync_copy(o_hbm.at[pl.ds(0, BLOCK[0])], buf)
    pltpu.sync_copy(buf, o_hbm.at[pl.ds(0, BLOCK[0])])


def raw_pipeline_then_a_copy(x: DataRef, o: DataRef, buf: DataRef, sem: SemRef) -> None:
    """A kernel keeps jax's pipeline as it is and adds safedma copies around it."""
    pltpu.emit_pipeline(double, grid=(4,), in_specs=[SPEC], out_specs=[SPEC])(x, o)
    sd.LocalCopy(o.at[pl.ds(0, 8)], buf, sem).start().wait()


def copy_left_in_flight_in_the_body(x: DataRef, o: DataRef, sem: SemRef) -> None:
    def body(x_vmem: DataRef, o_vmem: DataRef) -> None:
        sd.LocalCopy(x_vmem, o_vmem, sem).start()  # fix: copy_left_in_flight_in_a_pipeline_body

    sd.emit_pipeline(body, grid=(4,), in_specs=[SPEC], out_specs=[SPEC])(x, o)


def sync_copy_of_another_shape(x: DataRef, o: DataRef, buf: DataRef) -> None:
    sd.sync_copy(x, buf)  # fix: sync_copy_of_another_shape


def sync_copy_of_another_dtype(x: DataRef, o: DataRef, buf: DataRef) -> None:
    sd.sync_copy(x.at[pl.ds(0, 8)], buf)  # fix: sync_copy_of_another_dtype


def sync_copy_of_a_value(x: DataRef, o: DataRef, buf: DataRef) -> None:
    sd.sync_copy(x[...], buf)  # type: ignore[arg-type]  # fix: sync_copy_of_a_value


def _pipeline_call(kernel: Any, scratch: list[Any], pallas: Any) -> Any:
    def run(x: jax.Array) -> jax.Array:
        result: jax.Array = pallas(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=scratch,
        )(x)
        return result

    return run


CASES: list[Case] = [
    Case(
        "pipeline_and_sync_copy",
        "pipelines",
        GUIDE,
        lambda: Program(
            _pipeline_call(pipelined_scale, [sd.vmem(BLOCK, jnp.float32)], sd.pallas_call),
            (X,),
            TPU,
        ),
        {"mosaic": OK},
        twin=lambda: Program(
            _pipeline_call(pipelined_scale_raw, [pltpu.VMEM(BLOCK, jnp.float32)], pl.pallas_call),
            (X,),
            TPU,
        ),
    ),
    Case(
        "raw_pipeline_inside_a_checked_kernel",
        "pipelines",
        GUIDE,
        lambda: local(
            raw_pipeline_then_a_copy,
            [sd.vmem(BLOCK, jnp.float32), sd.dma_semaphore()],
            mesh=TPU,
            lower=True,
        ),
        {"trace": OK},
    ),
    Case(
        "copy_left_in_flight_in_a_pipeline_body",
        "pipelines",
        "written for this suite",
        lambda: local(copy_left_in_flight_in_the_body, [sd.dma_semaphore()], mesh=TPU, lower=True),
        {"trace": Raises("^CopyNeverWaitedError$", says=("'body'",), line=False)},
    ),
    Case(
        "sync_copy_of_another_shape",
        "pipelines",
        "written for this suite",
        lambda: local(sync_copy_of_another_shape, [sd.vmem(BLOCK, jnp.float32)]),
        {"trace": Raises("^CopyShapeMismatchError$", says=("sync_copy",), line=False)},
    ),
    Case(
        "sync_copy_of_another_dtype",
        "pipelines",
        "written for this suite",
        lambda: local(sync_copy_of_another_dtype, [sd.vmem(BLOCK, jnp.int32)]),
        {"trace": Raises("^CopyDtypeMismatchError$", says=("sync_copy",), line=False)},
    ),
    Case(
        "sync_copy_of_a_value",
        "pipelines",
        "written for this suite",
        lambda: local(sync_copy_of_a_value, [sd.vmem(BLOCK, jnp.float32)]),
        {"trace": Raises("^NotARefError$", says=("sync_copy source",), line=False)},
    ),
]


# ---------------------------------------------------------------- a manual DMA beside a raw pipeline


def _double(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2.0


def pipeline_with_a_side_copy(
    x_hbm: Any, o_hbm: Any, side_hbm: Any, sem: Any, *, side_into_output: bool
) -> None:
    rows = x_hbm.shape[0]
    block = pl.BlockSpec((8, x_hbm.shape[1]), lambda i: (i, 0))
    # A manual DMA runs next to the pipeline: into its own output (fine), or,
    # seeded bug, into the output the pipeline is writing.
    side = pltpu.make_async_copy(
        x_hbm, o_hbm if side_into_output else side_hbm, sem
    )  # fix: side_copy_into_the_pipelines_output
    side.start()  # fix: side_copy_into_the_pipelines_output
    pltpu.emit_pipeline(
        _double, grid=(rows // 8,), in_specs=[block], out_specs=[block]
    )(  # fix: side_copy_into_the_pipelines_output
        x_hbm, o_hbm
    )
    side.wait()
    if side_into_output:
        # The side output still has to be written: copy it from x, done in place.
        again = pltpu.make_async_copy(x_hbm, side_hbm, sem)
        again.start()
        again.wait()


def pipeline_and_side_copy_call(x: jax.Array, *, seeded_race: bool = False) -> Any:
    """``(x * 2, x)``: the doubling through emit_pipeline, ``x`` through a manual DMA."""
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    kernel = functools.partial(pipeline_with_a_side_copy, side_into_output=seeded_race)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=(shape, shape),
        in_specs=[hbm],
        out_specs=(hbm, hbm),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)


def on_a_tpu_mesh(seeded_race: bool) -> Any:
    """emit_pipeline reads the TPU generation while tracing (jax 0.12): the program traces
    it under a compile-only TPU mesh's abstract mesh."""
    from safedma.testing import tpu_mesh

    abstract = tpu_mesh("v5e:2x2").abstract_mesh

    def program(x: jax.Array) -> Any:
        with jax.sharding.use_abstract_mesh(abstract):
            return pipeline_and_side_copy_call(x, seeded_race=seeded_race)

    return program


X16 = jax.ShapeDtypeStruct((16, 128), jnp.float32)


def _every_copy_waited(report: Any, program: Program) -> None:
    """The side copy and the pipeline's own copies (their count is jax's), each waited."""
    assert report.dmas >= 2 and report.waits == report.dmas, report


CASES += [
    Case(
        "manual_dma_beside_a_raw_pipeline",
        "pipelines",
        "jax Pallas TPU pipelining guide (a manual DMA beside emit_pipeline), written for this suite",
        lambda: Program(on_a_tpu_mesh(False), (X16,)),
        {
            "sanitize": OK,
            "verify": Ok(
                report={"kernels": ("pipeline_with_a_side_copy",)}, check=_every_copy_waited
            ),
        },
    ),
    # Eager DMAs land at their start, before the pipeline writes, so simulate once saw no
    # race; with a clock entry per copy the interpreter's race detector sees that the
    # pipeline's write-back is not ordered after the side copy, as verify does.
    Case(
        "side_copy_into_the_pipelines_output",
        "pipelines",
        "written for this suite",
        lambda: Program(on_a_tpu_mesh(True), (X16,)),
        {
            "verify": Raises("RaceDetectedError", matches=(r"pipelines\.py:\d+",)),
            "simulate": Raises("RaceDetectedError"),
        },
    ),
]


# ---------------------------------------------------------------- a zero fill beside a pipeline


def zero_fill_then_pipeline(first_row_block: int) -> Any:
    """Zero rows [0:16) of the output with a DMA from a VMEM zero tile while an
    emit_pipeline writes row blocks ``first_row_block``.. of it; wait at the end
    (maxtext's grouped matmul zero-fills the rows the pipeline does not write). From row
    block 1 the pipeline's own copy-out races the fill: jax wraps the pipeline's
    functions in ``jax.named_scope``, whose frame is Python's ``contextlib``; the message
    names the user's lines, never the standard library's."""

    def kernel(x_hbm: Any, o_hbm: Any, zeros: Any, sem: Any) -> None:
        zeros[...] = jnp.zeros_like(zeros)
        fill = pltpu.make_async_copy(zeros, o_hbm.at[pl.ds(0, 16)], sem)
        fill.start()

        def body(x_ref: Any, o_ref: Any) -> None:
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i + first_row_block, 0))
        pltpu.emit_pipeline(  # fix: zero_fill_under_a_pipeline
            body, grid=(4 - first_row_block,), in_specs=[spec], out_specs=[spec]
        )(x_hbm, o_hbm)
        fill.wait()

    any_ = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        in_specs=[any_],
        out_specs=any_,
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA],
    )


def traced_on_a_tpu_mesh(fn: Any) -> Any:
    """``fn`` traced under a compile-only TPU mesh's abstract mesh (emit_pipeline reads
    the TPU generation); skips where no libtpu topology can be built."""
    from safedma.testing import tpu_mesh

    mesh: Any = None
    reason: Exception | None = None
    for topology in ("v5e:1x1", "v5e:2x2"):  # jax 0.10.2's libtpu builds only the second
        try:
            mesh = tpu_mesh(topology)
            break
        except Exception as err:  # no libtpu topology on this machine
            reason = err
    if mesh is None:
        import pytest

        pytest.skip(f"no TPU topology for tracing: {reason}")

    def program(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return program


X32 = jax.ShapeDtypeStruct((32, 128), jnp.float32)

CASES += [
    Case(
        "zero_fill_beside_a_pipeline",
        "pipelines",
        "maxtext grouped matmul (rows the pipeline does not write zero-filled by DMA), written for this suite",
        lambda: Program(traced_on_a_tpu_mesh(zero_fill_then_pipeline(2)), (X32,)),
        {"sanitize": OK, "verify": Ok(report={"kernels": ("kernel",)}, check=_every_copy_waited)},
    ),
    Case(
        "zero_fill_under_a_pipeline",
        "pipelines",
        "maxtext grouped matmul (rows the pipeline does not write zero-filled by DMA), written for this suite",
        lambda: Program(traced_on_a_tpu_mesh(zero_fill_then_pipeline(1)), (X32,)),
        {
            "verify": Raises(
                "RaceDetectedError",
                # the pipeline's line and the fill's
                matches=(r"(?s)pipelines\.py:\d+.*pipelines\.py:\d+",),
                absent=("contextlib", "functools"),
            )
        },
    ),
]
