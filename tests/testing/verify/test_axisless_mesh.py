"""``verify(..., mesh=abstract_mesh((), (), tpu=...))``: a mesh with no axes names only
the TPU generation.

Kernels that are not shard_mapped often ask the TPU for its geometry in their
wrapper (``pltpu.get_tpu_info()``, tokamax's and vLLM's wrappers do), which fails
on a CPU outside a mesh that names the generation. Such a mesh must not be taken
as a request to split the arguments over devices (jax's shard_map rejects an
empty mesh): ``fn`` runs whole, on one device.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import RaceDetectedError, abstract_mesh, verify

HBM = pl.BlockSpec(memory_space=pl.ANY)


def _asks_the_tpu(wait: bool) -> Any:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, buf, sem)
        copy.start()
        if wait:
            copy.wait()
        o_ref[...] = buf[...]

    def fn(x: jax.Array) -> jax.Array:
        lanes = pltpu.get_tpu_info().num_lanes  # needs a TPU, or a mesh naming one
        block = (8, lanes)
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(block, x.dtype),
            in_specs=[HBM],
            scratch_shapes=[pltpu.VMEM(block, x.dtype), pltpu.SemaphoreType.DMA(())],
        )(x[:, :lanes])
        return out

    return fn


X = jax.ShapeDtypeStruct((8, 128), jnp.float32)
NO_AXES = abstract_mesh((), (), tpu="v5p")


def test_a_wrapper_that_asks_the_tpu_verifies_inside_a_mesh_with_no_axes() -> None:
    report = verify(_asks_the_tpu(True), X, mesh=NO_AXES)
    assert report.devices == 1 and report.dmas == 1


def test_its_seeded_mistake_is_still_caught() -> None:
    with pytest.raises(RaceDetectedError, match="test_axisless_mesh.py"):
        verify(_asks_the_tpu(False), X, mesh=NO_AXES)


def test_specs_with_a_mesh_with_no_axes_are_refused() -> None:
    with pytest.raises(ValueError, match="in_specs/out_specs need a mesh with axes"):
        verify(_asks_the_tpu(True), X, mesh=NO_AXES, in_specs=P())
