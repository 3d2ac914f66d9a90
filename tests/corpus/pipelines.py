"""``emit_pipeline`` and ``sync_copy``: jax's own pipeline next to safedma copies, and
``sd.emit_pipeline``, whose body is checked as a kernel of its own.

jax's pipeline issues raw copies the kernel scope does not see, so it coexists with the
checks. Lowering needs a TPU generation on jax 0.12 (``TPU``: a chip, no mesh axes).

* a pipeline and a typed ``sync_copy`` of its first block, with the raw twin (jax's
  pipelining guide, written for this suite);
* a raw ``pltpu.emit_pipeline`` inside a checked kernel, a safedma copy after it;
* a copy a pipeline body starts and leaves in flight (T7, naming the body);
* ``sync_copy`` of another shape, another dtype, or a value (T1, T2, a value for a ref).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import DataRef, SemRef
from tests.corpus._calls import TPU, X, local
from tests.corpus._case import OK, Case, Program, Raises

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
