"""Mosaic identity helpers: cross-lowering for TPU on a CPU-only machine."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import re

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
    KERNEL_PLACEHOLDER,
    MosaicMismatchError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_kernels,
    mosaic_text,
)

X = jax.ShapeDtypeStruct((8, 128), jnp.float32)
HBM = pl.BlockSpec(memory_space=pl.ANY)


# --- two spellings of one HBM -> HBM copy -----------------------------------


def copy_kernel(x_ref, o_ref, sem):
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


def twin_copy(src, dst, dma_sem):
    def descriptor():
        return pltpu.make_async_copy(src_ref=src, dst_ref=dst, sem=dma_sem)

    descriptor().start()
    descriptor().wait()


def copy_twice_kernel(x_ref, o_ref, sem):
    for _ in range(2):
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)
        copy.start()
        copy.wait()


copy_lib = hbm_call(copy_kernel, [pltpu.SemaphoreType.DMA(())])
copy_twin = hbm_call(twin_copy, [pltpu.SemaphoreType.DMA(())])
copy_twice = hbm_call(copy_twice_kernel, [pltpu.SemaphoreType.DMA(())])


# --- HBM -> VMEM scratch -> HBM ----------------------------------------------


def staged_kernel(x_ref, o_ref, buf, sem):
    pltpu.make_async_copy(x_ref, buf, sem).start()
    pltpu.make_async_copy(x_ref, buf, sem).wait()
    pltpu.make_async_copy(buf, o_ref, sem).start()
    pltpu.make_async_copy(buf, o_ref, sem).wait()


def staged_twin(hbm_in, hbm_out, vmem, s):
    for src, dst in ((hbm_in, vmem), (vmem, hbm_out)):
        dma = pltpu.make_async_copy(src, dst, s)
        dma.start()
        dma.wait()


_STAGED_SCRATCH = [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]
staged_lib = hbm_call(staged_kernel, _STAGED_SCRATCH)
staged_twin_call = hbm_call(staged_twin, _STAGED_SCRATCH)


# --- ring permute with a remote DMA --------------------------------------------


ring_call = hbm_call(ring_kernel, [pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())])
MESH = abstract_mesh((4,), ("x",))
X_SHARDED = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(MESH, P("x")))


def ring_permute(x):
    return jax.shard_map(ring_call, mesh=MESH, in_specs=P("x"), out_specs=P("x"), check_vma=False)(
        x
    )


def ring_permute_ambient(x):
    # No mesh=: relies on mosaic_text(..., mesh=MESH) setting the current mesh.
    return jax.shard_map(ring_call, in_specs=P("x"), out_specs=P("x"), check_vma=False)(x)


# --- tests ------------------------------------------------------------------


def test_twins_lower_to_identical_mosaic():
    assert mosaic_text(copy_lib, X) == mosaic_text(copy_twin, X)
    assert_same_mosaic(copy_lib, copy_twin, X)
    assert_same_mosaic(staged_lib, staged_twin_call, X)


def test_names_are_normalised_only_on_request():
    normalised = mosaic_text(copy_lib, X)
    assert f'sym_name = "{KERNEL_PLACEHOLDER}"' in normalised
    assert "copy_kernel" not in normalised and "twin_copy" not in normalised
    exact_lib = mosaic_text(copy_lib, X, normalize_names=False)
    exact_twin = mosaic_text(copy_twin, X, normalize_names=False)
    assert 'sym_name = "copy_kernel"' in exact_lib
    assert 'sym_name = "twin_copy"' in exact_twin
    # Apart from the name, the exact texts are the normalised one.
    assert exact_lib.replace("copy_kernel", KERNEL_PLACEHOLDER) == normalised
    with pytest.raises(AssertionError):
        assert_same_mosaic(copy_lib, copy_twin, X, normalize_names=False)


def test_different_kernels_raise_with_a_diff():
    with pytest.raises(MosaicMismatchError) as info:
        assert_same_mosaic(copy_lib, copy_twice, X)
    assert isinstance(info.value, AssertionError)
    message = str(info.value)
    assert "fn_a=" in message and "fn_b=" in message
    assert "--- fn_a=" in message and "+++ fn_b=" in message
    added = [
        line for line in message.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    assert any("enqueue_dma" in line for line in added), message
    assert info.value.text_a == mosaic_text(copy_lib, X)


def test_text_has_no_source_locations():
    for fn, arg in ((copy_lib, X), (staged_lib, X), (ring_permute, X_SHARDED)):
        text = mosaic_text(fn, arg)
        assert "loc(" not in text
        assert "#loc" not in text
        assert __file__ not in text


def test_vmem_scratch_kernel_is_visible():
    text = mosaic_text(staged_lib, X)
    assert "#tpu.memory_space<vmem>" in text
    assert text.count("enqueue_dma") == 2


def test_ring_permute_under_shard_map_has_remote_dma():
    (kernel,) = mosaic_kernels(ring_permute, X_SHARDED)
    assert kernel.name == "ring_kernel"
    assert '"has_communication":true' in kernel.config
    assert "tpu.device_id" in kernel.module
    enqueues = re.findall(
        r'"stable_mosaic\.tpu\.enqueue_dma"\(([^)]*)\).*?: \(([^)]*)\) -> \(\)',
        kernel.module,
    )
    assert len(enqueues) == 1
    operands, types = enqueues[0]
    # src, src semaphore, dst, dst semaphore, then the i32 target device id.
    assert len(operands.split(",")) == 5
    assert types.split(",")[-1].strip() == "i32"


def test_mesh_argument_sets_the_ambient_mesh():
    assert mosaic_text(ring_permute_ambient, X_SHARDED, mesh=MESH) == mosaic_text(
        ring_permute, X_SHARDED
    )


def test_kernels_come_in_program_order():
    def two_kernels(x):
        return copy_twice(staged_lib(x))

    kernels = mosaic_kernels(two_kernels, X, normalize_names=False)
    assert [k.name for k in kernels] == ["staged_kernel", "copy_twice_kernel"]
    text = mosaic_text(two_kernels, X)
    assert "// ===== Mosaic kernel 1 of 2" in text
    assert "// ===== Mosaic kernel 2 of 2" in text


def test_input_output_aliases_are_part_of_identity():
    def aliased(x):
        return pl.pallas_call(
            copy_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
            input_output_aliases={0: 0},
        )(x)

    assert "output_operand_aliases" in mosaic_text(aliased, X)
    with pytest.raises(AssertionError, match="output_operand_aliases"):
        assert_same_mosaic(copy_lib, aliased, X)


def test_no_kernel_is_an_error():
    with pytest.raises(ValueError, match="no Mosaic kernel"):
        mosaic_text(lambda x: x + 1, X)


def test_missing_private_jax_api_is_reported_clearly():
    from safedma.testing import PrivateJaxApiError
    from safedma.testing import _private

    with pytest.raises(PrivateJaxApiError, match=re.escape(jax.__version__)):
        _private._private_module("jax._src.no_such_module_in_any_jax")
