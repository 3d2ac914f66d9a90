"""testing helpers for the common DMA patterns.

``abstract_mesh(..., tpu=...)`` lowers kernels that need a TPU generation
(emit_pipeline, sync_copy, scoped VMEM on jax 0.12) on a CPU; ``tpu_mesh`` /
``compile_for_tpu`` take ``allow_split_physical_axes`` or a ``device_order``,
and a mesh that does not fit is a ``TpuMeshError`` naming the way out.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    TPU_GENERATIONS,
    TpuMeshError,
    abstract_mesh,
    compile_for_tpu,
    mosaic_text,
    tpu_mesh,
)

HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def _sync_copy_kernel(x: Any, o: Any) -> None:
    pltpu.sync_copy(x, o)


def _call(x: jax.Array) -> jax.Array:
    result: jax.Array = pl.pallas_call(
        _sync_copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
    )(x)
    return result


@pytest.mark.parametrize("tpu", sorted(TPU_GENERATIONS))
def test_a_tpu_generation_lets_a_kernel_lower_on_cpu(tpu: str) -> None:
    text = mosaic_text(_call, X, mesh=abstract_mesh((), (), tpu=tpu))
    assert "enqueue_dma" in text


def test_without_a_generation_jax_012_cannot_lower_it() -> None:
    if jax.__version_info__ < (0, 11):
        pytest.skip("jax 0.10.2 lowers sync_copy without a TPU generation")
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        mosaic_text(_call, X)


def test_unknown_generation_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        abstract_mesh((2,), ("x",), tpu="v9")


def test_a_generation_mesh_keeps_its_axes() -> None:
    mesh = abstract_mesh((2, 2), ("x", "y"), tpu="v6e")
    assert mesh.axis_names == ("x", "y") and mesh.axis_sizes == (2, 2)
    assert mesh.abstract_device is not None
    assert mesh.abstract_device.device_kind == "TPU v6 lite"


def _local(x: jax.Array) -> jax.Array:
    return x * 2


def test_split_physical_axes_mesh_fails_as_a_safedma_error() -> None:
    with pytest.raises(TpuMeshError, match="allow_split_physical_axes=True") as err:
        tpu_mesh("v6e:16x16", (64, 4), ("x", "y"))
    assert "(64, 4)" in str(err.value) and "device_order" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_allow_split_physical_axes_compiles_the_64_by_4_mesh() -> None:
    report = compile_for_tpu(
        _local,
        jax.ShapeDtypeStruct((256 * 8, 128), jnp.float32),
        topology="v6e:16x16",
        mesh_shape=(64, 4),
        axis_names=("x", "y"),
        allow_split_physical_axes=True,
        in_specs=P(("x", "y")),
        out_specs=P(("x", "y")),
    )
    assert report.mesh_shape == (64, 4) and report.num_devices == 256


def test_device_order_sets_the_layout() -> None:
    mesh = tpu_mesh("v6e:2x2", (4,), ("x",), device_order=[3, 2, 1, 0])
    ids = [int(d.id) for d in mesh.devices.flat]
    assert ids == sorted(ids, reverse=True)
    report = compile_for_tpu(_local, X, topology="v6e:2x2", device_order=[1, 0, 3, 2])
    assert report.num_devices == 4


def test_a_device_order_that_is_not_a_permutation_is_caught() -> None:
    with pytest.raises(TpuMeshError, match="permutation"):
        tpu_mesh("v6e:2x2", (4,), ("x",), device_order=[0, 0, 1, 2])
