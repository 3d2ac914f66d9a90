"""safedma.checked on the bodies of jax's own Pallas GPU kernels: none is rejected.

Each kernel of ``jax/experimental/pallas/ops/gpu`` that ``test_jax_gpu_kernels.py``
traces is traced again with ``plgpu.kernel`` replaced by one that wraps the body in
``safedma.checked`` (nothing of the kernels' code is copied or changed; the SM count,
the CUDA version and absl are the same stand-ins). The raw GPU check must read each
body's barriers and stores and find nothing wrong: these kernels are correct, including
the warp-specialized ones and those whose pipelines index barriers by ``step % n``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import pytest

from safedma.testing._gpu.jax_seam import plgpu_available

if not plgpu_available():
    pytest.skip("this jax has no Pallas GPU API the check reads", allow_module_level=True)

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import safedma
from safedma import _raw_gpu
from tests.gpu._jax_kernels import JaxWithDevices, ops


class _Seen:
    """What the check read: bodies checked, the barrier waits and stores in them, and the
    waits the barrier rules were applied to (each wait of a straight line whose slot is
    known, or whose index expression its arrivals share)."""

    def __init__(self) -> None:
        self.bodies = 0
        self.waits = 0
        self.stores = 0
        self.checked = 0  # barrier waits the rules were applied to


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> _Seen:
    """``plgpu.kernel`` and ``pl.pallas_call`` wrap each body in ``safedma.checked``."""
    record = _Seen()
    kernel, pallas_call = plgpu.kernel, pl.pallas_call

    # Wrapped, so that a probe of plgpu.kernel's signature (safedma.gpu.available) still
    # sees jax's.
    @functools.wraps(kernel)
    def checked_kernel(body: Any = None, **kwargs: Any) -> Any:
        if body is None:
            return lambda fn: checked_kernel(fn, **kwargs)
        return kernel(safedma.checked(body), **kwargs)

    @functools.wraps(pallas_call)
    def checked_pallas_call(body: Any, *args: Any, **kwargs: Any) -> Any:
        return pallas_call(safedma.checked(body), *args, **kwargs)

    run, check = _raw_gpu._Barriers.run, _raw_gpu._Barriers.check

    def spy(self: Any, items: list[Any], *, top: bool = True) -> None:
        if top:
            record.bodies += 1
            record.waits += sum(op.kind == "wait" for op in self.reader.ops)
            record.stores += sum(op.kind == "store" for op in self.reader.ops)
        run(self, items, top=top)

    def spy_check(self: Any, *args: Any, **kwargs: Any) -> None:
        record.checked += 1
        check(self, *args, **kwargs)

    monkeypatch.setattr(plgpu, "kernel", checked_kernel)
    monkeypatch.setattr(pl, "pallas_call", checked_pallas_call)
    monkeypatch.setattr(_raw_gpu._Barriers, "run", spy)
    monkeypatch.setattr(_raw_gpu._Barriers, "check", spy_check)
    return record


def _trace(fn: Callable[..., Any], *args: Any) -> None:
    jax.make_jaxpr(fn)(*args)


@pytest.mark.parametrize(
    ("m", "groups", "k", "steps", "transpose_rhs"),
    [(256, 2, 128, 2, False), (320, 3, 256, 3, False), (256, 2, 256, 2, True)],
)
def test_checked_ragged_dot_bodies_pass(
    seen: _Seen, m: int, groups: int, k: int, steps: int, transpose_rhs: bool
) -> None:
    mod = ops("ragged_dot_mgpu")
    n = 128
    rhs_shape = (groups, n, k) if transpose_rhs else (groups, k, n)

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

    _trace(
        run,
        jax.ShapeDtypeStruct((m, k), jnp.float16),
        jax.ShapeDtypeStruct(rhs_shape, jnp.float16),
        jax.ShapeDtypeStruct((groups,), jnp.int32),
    )
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_transposed_ragged_dot_body_passes(
    seen: _Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = ops("transposed_ragged_dot_mgpu")
    monkeypatch.setattr(mod, "jax", JaxWithDevices(4))

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

    a = jax.ShapeDtypeStruct((256, 128), jnp.float16)
    _trace(run, a, a, jax.ShapeDtypeStruct((2,), jnp.int32))
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_hopper_matmul_body_passes(seen: _Seen, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ops("hopper_matmul_mgpu")
    monkeypatch.setattr(mod, "get_num_sms", lambda: 4)
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)
    a = jax.ShapeDtypeStruct((256, 256), jnp.float16)
    _trace(lambda a, b: mod.matmul(a, b, None, config), a, a)
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_hopper_mixed_type_matmul_body_passes(
    seen: _Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = ops("hopper_mixed_type_matmul_mgpu")
    device = types.SimpleNamespace(core_count=4)
    monkeypatch.setattr(mod, "backend", types.SimpleNamespace(get_default_device=lambda: device))
    config = mod.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)

    def run(a: Any, b: Any) -> Any:
        return mod.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=config)

    _trace(
        run,
        jax.ShapeDtypeStruct((256, 256), jnp.int8),
        jax.ShapeDtypeStruct((256, 256), jnp.bfloat16),
    )
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_attention_body_passes(seen: _Seen, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ops("attention_mgpu")
    versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: 12090)
    monkeypatch.setattr(mod, "cuda_versions", versions)
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    q = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.float16)
    _trace(lambda q, k, v: mod.attention(q, k, v, config), q, q, q)
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def _attention_module(monkeypatch: pytest.MonkeyPatch, cuda: int = 12090) -> Any:
    mod = ops("attention_mgpu")
    versions = types.SimpleNamespace(cuda_runtime_get_version=lambda: cuda)
    monkeypatch.setattr(mod, "cuda_versions", versions)
    return mod


def test_checked_causal_attention_body_passes(seen: _Seen, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _attention_module(monkeypatch, cuda=13000)  # causal masking needs CUDA 13 here
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=True)
    q = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.float16)
    _trace(lambda q, k, v: mod.attention(q, k, v, config), q, q, q)
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_attention_backward_bodies_pass(
    seen: _Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _attention_module(monkeypatch)
    blocks = dict(block_q_dkv=64, block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, **blocks)
    q = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.float16)

    def loss(q: Any, k: Any, v: Any) -> Any:
        return mod.attention(q, k, v, config).astype(jnp.float32).sum()

    _trace(jax.grad(loss, argnums=(0, 1, 2)), q, q, q)
    assert seen.bodies == 3  # the forward kernel, then dq and dk/dv
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


def test_checked_attention_with_pipeline_emitter_body_passes(
    seen: _Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _attention_module(monkeypatch)
    config = mod.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)
    q = jax.ShapeDtypeStruct((1, 128, 1, 64), jnp.float16)
    _trace(lambda q, k, v: mod.attention_with_pipeline_emitter(q, k, v, config), q, q, q)
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0


@pytest.mark.parametrize("collective", [False, True])
def test_checked_blackwell_matmul_body_passes(seen: _Seen, collective: bool) -> None:
    mod = ops("blackwell_matmul_mgpu")
    config = mod.TuningConfig(
        tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2, collective=collective
    )
    a = jax.ShapeDtypeStruct((512, 512), jnp.float16)
    _trace(lambda a, b: mod.matmul_kernel(a, b, config), a, a)
    assert seen.bodies == 1
    assert seen.waits > 0 and seen.stores > 0
    assert seen.checked > 0
