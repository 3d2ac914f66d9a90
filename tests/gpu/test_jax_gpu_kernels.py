"""verify_gpu on jax's own Pallas GPU kernels (jax/experimental/pallas/ops/gpu), traced small.

What each gives today, recorded: ragged_dot_mgpu is proved clean for every program
of its grid; transposed_ragged_dot_mgpu is refused (its pipeline's step count is
read from memory); the warp-specialized kernels (hopper_matmul_mgpu,
hopper_mixed_type_matmul_mgpu, attention_mgpu: ``num_threads=3``) are refused
with the reason. The kernel modules import ``jax._src.test_util`` (absl) and ask
the default device for its SM count; absl is served by the field lane's
stand-in where it is not installed, and the SM count, the CUDA version and the
device are stand-ins too: nothing of the kernels' code is changed.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from safedma.testing._gpu.jax_seam import plgpu_available

if not plgpu_available():
    pytest.skip("this jax has no Pallas GPU API the checker reads", allow_module_level=True)

import jax
import jax.numpy as jnp

from safedma.testing import VerificationUnsupportedError, verify_gpu
from tests.gpu._jax_kernels import JaxWithDevices, ops


@pytest.mark.parametrize(
    ("m", "groups", "k", "steps", "transpose_rhs"),
    [(256, 2, 128, 2, False), (320, 3, 256, 3, False), (256, 2, 256, 2, True)],
)
def test_ragged_dot_is_clean(m: int, groups: int, k: int, steps: int, transpose_rhs: bool) -> None:
    mod = ops("ragged_dot_mgpu")
    n = 128
    lhs = jax.ShapeDtypeStruct((m, k), jnp.float16)
    rhs_shape = (groups, n, k) if transpose_rhs else (groups, k, n)
    rhs = jax.ShapeDtypeStruct(rhs_shape, jnp.float16)
    sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)

    def run(lhs: Any, rhs: Any, sizes: Any) -> Any:
        return mod.ragged_dot(
            lhs,
            rhs,
            group_sizes=sizes,
            block_m=64,
            block_n=64,
            block_k=64,
            max_concurrent_steps=steps,
            grid_block_n=1,
            transpose_rhs=transpose_rhs,
        )

    report = verify_gpu(run, lhs, rhs, sizes)
    blocks = (m // 64 + groups - 1) * (n // 64)
    assert report.programs == 132
    assert report.barrier_waits == blocks * (k // 64)


def test_transposed_ragged_dot_is_refused_for_its_data_dependent_pipeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = ops("transposed_ragged_dot_mgpu")
    monkeypatch.setattr(mod, "jax", JaxWithDevices(4))
    lhs = jax.ShapeDtypeStruct((256, 128), jnp.float16)
    rhs = jax.ShapeDtypeStruct((256, 128), jnp.float16)
    sizes = jax.ShapeDtypeStruct((2,), jnp.int32)

    def run(lhs: Any, rhs: Any, sizes: Any) -> Any:
        return mod.transposed_ragged_dot(
            lhs,
            rhs,
            group_sizes=sizes,
            block_m=64,
            block_n=64,
            block_k=64,
            max_concurrent_steps=2,
            grid_block_n=1,
        )

    with pytest.raises(VerificationUnsupportedError, match="while loop whose condition"):
        verify_gpu(run, lhs, rhs, sizes)


def test_hopper_matmul_is_refused_for_its_warpgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ops("hopper_matmul_mgpu")
    monkeypatch.setattr(mod, "get_num_sms", lambda: 4)
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    with pytest.raises(VerificationUnsupportedError, match="num_threads=3"):
        verify_gpu(lambda a, b: mod.matmul(a, b, None, config), a, a)


def test_hopper_mixed_type_matmul_is_refused_for_its_warpgroups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = ops("hopper_mixed_type_matmul_mgpu")
    device = types.SimpleNamespace(core_count=4)
    monkeypatch.setattr(mod, "backend", types.SimpleNamespace(get_default_device=lambda: device))
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a = jax.ShapeDtypeStruct((256, 256), jnp.int8)
    b = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)

    def run(a: Any, b: Any) -> Any:
        return mod.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=config)

    with pytest.raises(VerificationUnsupportedError, match="num_threads=3"):
        verify_gpu(run, a, b)


def test_attention_is_refused_for_its_warpgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ops("attention_mgpu")
    versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 12090)
    monkeypatch.setattr(mod, "cuda_versions", versions)
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    q = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.float16)
    with pytest.raises(VerificationUnsupportedError, match="num_threads=3"):
        verify_gpu(lambda q, k, v: mod.attention(q, k, v, config), q, q, q)
