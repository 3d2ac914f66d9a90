"""verify on every kernel jax ships in ``jax/experimental/pallas/ops/tpu`` it can take.

Called from the installed package, with small shapes, on both supported jax
versions. The DMA kernels (paged attention, ragged paged attention, the ring
all-gather) are in test_jax_kernels.py with their seeded bugs; the kernels
here move data only through BlockSpecs (Pallas copies each block into VMEM
before a grid step and out after it), so the verdict says no block access of
theirs races with those copies or leaves its block: all must verify clean.

Grouped matmul has a dynamic grid (its tile count comes from the group
sizes): verified with concrete group sizes, and without them the error names
what is missing.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from safedma.testing import VerificationUnsupportedError, verify

F32 = jnp.float32
OPS = "jax.experimental.pallas.ops.tpu"


def _module(name: str) -> Any:
    return importlib.import_module(f"{OPS}.{name}")


def _plain(fn: Any) -> Any:
    """The function under jax.jit (verify traces it itself)."""
    try:
        return fn.__wrapped__
    except AttributeError:
        return fn


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


def _double() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    return _plain(_module("example_kernel").double), (_s(8, 128),)


def _matmul() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    fn = functools.partial(_plain(_module("matmul").matmul), block_shape=(128, 128), block_k=128)
    return fn, (_s(256, 256), _s(256, 256))


def _gradients(attend: Callable[..., Any]) -> Callable[..., Any]:
    """The backward pass of an attention ``attend(q, k, v)``: gradients of its sum."""

    def backward(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        return jax.grad(lambda *a: attend(*a).sum(), argnums=(0, 1, 2))(q, k, v)

    return backward


def _flash_blocks() -> Any:
    fa = _module("flash_attention")
    b = 128
    return fa.BlockSizes(
        block_q=b,
        block_k_major=b,
        block_k=b,
        block_b=1,
        block_q_major_dkv=b,
        block_k_major_dkv=b,
        block_k_dkv=b,
        block_q_dkv=b,
        block_k_major_dq=b,
        block_k_dq=b,
        block_q_dq=b,
    )


def _flash(causal: bool, grad: bool) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    fa = _plain(_module("flash_attention").flash_attention)
    attend = functools.partial(fa, causal=causal, block_sizes=_flash_blocks())
    q = _s(1, 2, 256, 128)
    return (_gradients(attend) if grad else attend), (q, q, q)


def _splash(causal: bool, grad: bool) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    sak = _module("splash_attention.splash_attention_kernel")
    sam = _module("splash_attention.splash_attention_mask")
    one = sam.CausalMask((256, 256)) if causal else sam.FullMask((256, 256))
    b = 128
    blocks = sak.BlockSizes(
        block_q=b,
        block_kv=b,
        block_kv_compute=b,
        block_q_dkv=b,
        block_kv_dkv=b,
        block_kv_dkv_compute=b,
        block_q_dq=b,
        block_kv_dq=b,
    )
    kernel = sak.make_splash_mha(
        sam.MultiHeadMask([one, one]), head_shards=1, q_seq_shards=1, block_sizes=blocks
    )
    q = _s(2, 256, 128)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        return kernel(q, k, v)

    return (_gradients(attend) if grad else attend), (q, q, q)


def _gmm(transposed: bool) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    gmm = _module("megablox.gmm")
    sizes = np.array([128, 0, 256, 128], np.int32)
    if transposed:
        return functools.partial(gmm.tgmm, tiling=(128, 128, 128)), (
            _s(128, 512),
            _s(512, 128),
            sizes,
        )
    return functools.partial(gmm.gmm, tiling=(128, 128, 128)), (
        _s(512, 128),
        _s(4, 128, 128),
        sizes,
    )


def _threefry() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    tf = _module("random.threefry")
    return (lambda k: tf.threefry_2x32_count(k, (8, 128), (8, 128), (8, 128))), (
        np.zeros((2,), np.uint32),
    )


def _philox() -> tuple[Callable[..., Any], tuple[Any, ...]]:
    ph = _module("random.philox")
    return (lambda k: ph.philox_4x32_count(k, (8, 128))), (np.zeros((2,), np.uint32),)


KERNELS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]] = {
    "example_kernel.double": _double,
    "matmul": _matmul,
    "flash_attention": functools.partial(_flash, False, False),
    "flash_attention(causal)": functools.partial(_flash, True, False),
    "flash_attention(causal) backward": functools.partial(_flash, True, True),
    "splash_attention": functools.partial(_splash, False, False),
    "splash_attention(causal)": functools.partial(_splash, True, False),
    "splash_attention(causal) backward": functools.partial(_splash, True, True),
    "megablox.gmm": functools.partial(_gmm, False),
    "megablox.tgmm": functools.partial(_gmm, True),
    "random.threefry": _threefry,
    "random.philox": _philox,
}
SLOW = {"megablox.gmm", "flash_attention(causal) backward", "splash_attention(causal) backward"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in KERNELS]
)
def test_jax_blockspec_kernel_verifies_clean(name: str) -> None:
    fn, args = KERNELS[name]()
    report = verify(fn, *args)
    assert report.kernels and report.dmas == 0


def test_a_dynamic_grid_from_unknown_data_names_what_is_missing() -> None:
    fn, args = _gmm(True)
    with pytest.raises(VerificationUnsupportedError, match="dynamic grid") as caught:
        verify(fn, args[0], args[1], jax.ShapeDtypeStruct((4,), jnp.int32))
    assert "gmm.py" in str(caught.value), caught.value
