"""simulate_gpu on jax's own Pallas GPU kernels (jax/experimental/pallas/ops/gpu), small.

Correct kernels nobody here wrote must run clean and compute the right numbers:
ragged_dot_mgpu (one warpgroup per block) and hopper_matmul_mgpu (warp-specialized,
``num_threads=3``, which verify_gpu refuses). attention_mgpu is refused: jax's GPU
interpreter cannot lower it. The SM count, CUDA version and absl are stand-ins
(tests/gpu/_jax_kernels.py); nothing of the kernels' code is changed.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from safedma.testing._gpu.jax_seam import interpret_available

if not interpret_available():
    pytest.skip("this jax has no Pallas GPU interpreter", allow_module_level=True)

import jax
import jax.numpy as jnp

from safedma.testing import SimulationUnsupportedError, simulate_gpu
from tests.gpu import _kernel_mutants as km
from tests.gpu._jax_kernels import f32, ops


def test_ragged_dot_runs_clean_and_right() -> None:
    run = km.ragged_dot(ops("ragged_dot_mgpu"))  # the mutation lane's driver, unmutated
    out = simulate_gpu(run.fn, *run.args, timeout_s=300)
    np.testing.assert_allclose(f32(out), run.want, rtol=2e-2, atol=2e-1)


def test_warp_specialized_hopper_matmul_runs_clean_and_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = ops("hopper_matmul_mgpu")
    monkeypatch.setattr(mod, "get_num_sms", lambda: 2)
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    key_a, key_b = jax.random.split(jax.random.PRNGKey(1))
    a = jax.random.normal(key_a, (256, 256), jnp.float16)
    b = jax.random.normal(key_b, (256, 256), jnp.float16)
    out = simulate_gpu(lambda a, b: mod.matmul(a, b, None, config), a, b, timeout_s=300)
    np.testing.assert_allclose(f32(out), f32(a) @ f32(b), rtol=2e-2, atol=2e-1)


def test_attention_is_refused_as_beyond_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ops("attention_mgpu")
    versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 12090)
    monkeypatch.setattr(mod, "cuda_versions", versions)
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    q = jax.random.normal(jax.random.PRNGKey(2), (1, 128, 1, 64), jnp.float16)

    with pytest.raises(SimulationUnsupportedError, match="GPU interpreter cannot run"):
        simulate_gpu(lambda q, k, v: mod.attention(q, k, v, config), q, q, q, timeout_s=300)
