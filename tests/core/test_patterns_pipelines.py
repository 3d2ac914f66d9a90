"""Issue 13 item 5: ``emit_pipeline`` / ``BufferedRef`` inside a checked kernel, and a
typed ``sync_copy``.

jax's own pipeline issues raw copies the kernel scope does not see, so it
coexists with the checks; ``sd.emit_pipeline`` checks the body as a kernel of its
own. Lowering needs a TPU generation on jax 0.12: the tests use
``abstract_mesh((), (), tpu="v5p")``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support import census_kernels as ck
from tests.support.twins import census as twin
from tests.support.patterns import X, local_call

TPU = abstract_mesh((), (), tpu="v5p")
SPEC = pl.BlockSpec(ck.BLOCK, lambda i: (i, 0))


def test_pipeline_and_sync_copy_match_raw() -> None:
    ours = ck.pipeline_call(ck.pipelined_scale, [sd.vmem(ck.BLOCK, jnp.float32)], sd.pallas_call)
    theirs = ck.pipeline_call(twin.pipelined_scale, [pltpu.VMEM(ck.BLOCK, jnp.float32)])
    assert_same_mosaic(ours, theirs, X, mesh=TPU)


def test_raw_emit_pipeline_inside_a_checked_kernel_is_accepted() -> None:
    """A kernel keeps jax's pipeline as it is and adds safedma copies around it."""

    def kernel(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
        pltpu.emit_pipeline(ck._double, grid=(4,), in_specs=[SPEC], out_specs=[SPEC])(x, o)
        sd.LocalCopy(o.at[pl.ds(0, 8)], buf, sem).start().wait()

    mosaic_text(
        local_call(kernel, [sd.vmem(ck.BLOCK, jnp.float32), sd.dma_semaphore()]), X, mesh=TPU
    )


def test_a_copy_left_in_flight_in_the_pipeline_body_is_reported() -> None:
    def kernel(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        def body(x_vmem: sd.DataRef, o_vmem: sd.DataRef) -> None:
            sd.LocalCopy(x_vmem, o_vmem, sem).start()

        sd.emit_pipeline(body, grid=(4,), in_specs=[SPEC], out_specs=[SPEC])(x, o)

    with pytest.raises(sd.CopyNeverWaitedError, match="'body'"):
        mosaic_text(local_call(kernel, [sd.dma_semaphore()]), X, mesh=TPU)


def test_sync_copy_checks_shapes_and_dtypes() -> None:
    def wrong_shape(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef) -> None:
        sd.sync_copy(x, buf)

    with pytest.raises(sd.CopyShapeMismatchError, match="sync_copy"):
        jax.jit(local_call(wrong_shape, [sd.vmem(ck.BLOCK, jnp.float32)])).trace(X)

    def wrong_dtype(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef) -> None:
        sd.sync_copy(x.at[pl.ds(0, 8)], buf)

    with pytest.raises(sd.CopyDtypeMismatchError, match="sync_copy"):
        jax.jit(local_call(wrong_dtype, [sd.vmem(ck.BLOCK, jnp.int32)])).trace(X)

    def a_value(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef) -> None:
        sd.sync_copy(x[...], buf)  # type: ignore[arg-type]

    with pytest.raises(sd.NotARefError, match="sync_copy source"):
        jax.jit(local_call(a_value, [sd.vmem(ck.BLOCK, jnp.float32)])).trace(X)
