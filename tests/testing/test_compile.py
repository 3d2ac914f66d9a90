"""Compile-only TPU builds with libtpu's real compiler on a CPU-only machine."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.support.calls import hbm_call
from tests.support.kernels_pltpu import ring_kernel
from safedma.testing import (
    TpuCompileError,
    TpuCompileReport,
    abstract_mesh,
    compile_for_tpu,
    mosaic_text,
    tpu_mesh,
)

HBM = pl.BlockSpec(memory_space=pl.ANY)
TOPOLOGIES = ["v5e:2x2", "v6e:2x2", "v5p:2x2x1", "v4:2x2x1", "tpu7x:2x2x1"]


def _hbm_call(kernel, scratch):
    call = hbm_call(kernel, scratch)
    call.__name__ = call.__qualname__ = kernel.__name__.replace("_kernel", "")
    return call


def local_copy_kernel(x_ref, o_ref, sem):
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


def ring_2d_kernel(x_ref, o_ref, send_sem, recv_sem):
    # Ring along "x" on a 2-D ("x", "y") mesh: the device id is a mesh coordinate.
    me = jax.lax.axis_index("x")
    n = jax.lax.axis_size("x")
    copy = pltpu.make_async_remote_copy(
        x_ref,
        o_ref,
        send_sem,
        recv_sem,
        device_id=((me + 1) % n, jax.lax.axis_index("y")),
    )
    copy.start()
    copy.wait()


def huge_scratch_kernel(x_ref, o_ref, buf, sem):
    rows = x_ref.shape[0]
    to_vmem = pltpu.make_async_copy(x_ref, buf.at[pl.ds(0, rows)], sem)
    to_vmem.start()
    to_vmem.wait()
    to_hbm = pltpu.make_async_copy(buf.at[pl.ds(0, rows)], o_ref, sem)
    to_hbm.start()
    to_hbm.wait()


DMA = pltpu.SemaphoreType.DMA(())
local_copy = _hbm_call(local_copy_kernel, [DMA])
ring = _hbm_call(ring_kernel, [DMA, DMA])
ring_2d = _hbm_call(ring_2d_kernel, [DMA, DMA])
# 2**21 x 128 float32 = 1 GiB of VMEM, far beyond any TPU's.
huge_scratch = _hbm_call(huge_scratch_kernel, [pltpu.VMEM((2**21, 128), jnp.float32), DMA])


def _global(rows_per_device: int, devices: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows_per_device * devices, 128), jnp.float32)


def _check(report: TpuCompileReport, topology: str, fn_name: str) -> None:
    assert report.topology == topology
    assert report.function == fn_name
    assert report.num_devices == 4  # 2x2 chips, one device per chip
    assert report.mesh_shape == (4,)
    assert report.generated_code_size_in_bytes > 0
    assert report.argument_size_in_bytes == 8 * 128 * 4  # one shard per device


def test_local_copy_compiles_for_default_topology():
    report = compile_for_tpu(local_copy, _global(8, 4))
    _check(report, "v6e:2x2", "local_copy")
    assert report.kernel_names == ("local_copy_kernel",)
    assert report.device_kind.startswith("TPU")


def test_ring_permute_compiles():
    report = compile_for_tpu(ring, _global(8, 4), topology="v5e:2x2")
    _check(report, "v5e:2x2", "ring")
    assert report.kernel_names == ("ring_kernel",)


@pytest.mark.slow
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("fn", [local_copy, ring], ids=["local_copy", "ring"])
def test_compile_matrix(topology, fn):
    report = compile_for_tpu(fn, _global(8, 4), topology=topology)
    _check(report, topology, fn.__name__)


def test_already_sharded_function():
    mesh = tpu_mesh("tpu7x:2x2x1")

    def permute(x):
        return jax.shard_map(ring, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)(x)

    report = compile_for_tpu(permute, _global(8, 4), topology="tpu7x:2x2x1", per_device=False)
    _check(report, "tpu7x:2x2x1", "test_already_sharded_function.<locals>.permute")
    assert report.kernel_names == ("ring_kernel",)


def test_two_dimensional_mesh():
    report = compile_for_tpu(
        ring_2d,
        _global(8, 4),
        topology="v6e:2x2",
        mesh_shape=(2, 2),
        axis_names=("x", "y"),
    )
    assert report.mesh_shape == (2, 2)
    assert report.axis_names == ("x", "y")
    assert report.generated_code_size_in_bytes > 0


def test_explicit_specs():
    # Shard rows over "x" only; the "y" axis sees replicated data.
    report = compile_for_tpu(
        ring_2d,
        _global(16, 2),
        topology="v6e:2x2",
        mesh_shape=(2, 2),
        axis_names=("x", "y"),
        in_specs=(P("x"),),
        out_specs=P("x"),
    )
    assert report.argument_size_in_bytes == 16 * 128 * 4


def test_too_much_vmem_is_a_tpu_compile_error():
    with pytest.raises(TpuCompileError) as info:
        compile_for_tpu(huge_scratch, _global(8, 4), topology="v5e:2x2")
    err = info.value
    message = str(err)
    assert "v5e:2x2" in message
    assert "huge_scratch" in message  # the function and its Mosaic kernel
    assert "huge_scratch_kernel" in err.kernel_names
    assert "would exceed memory" in message
    assert "RESOURCE_EXHAUSTED" in err.compiler_message
    assert err.topology == "v5e:2x2"


def test_bad_topology_and_mesh_are_value_errors():
    with pytest.raises(ValueError, match="v9z:2x2"):
        compile_for_tpu(local_copy, _global(8, 4), topology="v9z:2x2")
    with pytest.raises(ValueError, match="4 chips"):
        tpu_mesh("v6e:2x2", mesh_shape=(8,))
    with pytest.raises(ValueError, match="differ in length"):
        tpu_mesh("v6e:2x2", mesh_shape=(2, 2), axis_names=("x",))


def test_two_cores_per_chip_topologies_use_one_device_per_chip():
    for name in ("v4:2x2x1", "tpu7x:2x2x1"):
        mesh = tpu_mesh(name)
        assert mesh.devices.shape == (4,)
        assert all(getattr(d, "core_on_chip", 0) == 0 for d in mesh.devices.flat)


def test_topology_mesh_cross_lowers_like_an_abstract_mesh():
    # A compile-only TPU mesh is also a valid (ambient) mesh for mosaic_text,
    # and gives the same Mosaic as a device-free AbstractMesh.
    def permute(v):
        return jax.shard_map(ring, in_specs=P("x"), out_specs=P("x"), check_vma=False)(v)

    texts = []
    for mesh in (tpu_mesh("v6e:2x2"), abstract_mesh((4,), ("x",))):
        x = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
        texts.append(mosaic_text(permute, x, mesh=mesh))
    assert texts[0] == texts[1]
    assert "stable_mosaic.tpu.device_id" in texts[0]
