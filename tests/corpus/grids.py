"""Grids, block specs and scalar prefetch: data moved by Pallas's own block copies, page
tables prefetched into SMEM, grids whose size comes from data.

* every kernel jax ships that moves data only through BlockSpecs (jax ops/tpu: the
  example kernel, matmul, flash and splash attention forward and backward, megablox
  grouped matmuls, threefry and philox): verify proves no block access races with the
  pipeline's copies (no DMA of their own);
* a grouped matmul whose grid comes from group sizes verify does not know: refused,
  naming what is missing;
* jax ops/tpu paged attention (page gathers driven by a scalar-prefetched page table),
  small.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.corpus._case import Case, Ok, Program, Unsupported
from tests.corpus._seeding import unjitted

F32 = jnp.float32
OPS = "jax.experimental.pallas.ops.tpu"
JAX_OPS = "jax ops/tpu"


def ops_module(name: str) -> Any:
    return importlib.import_module(f"{OPS}.{name}")


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


def _double() -> Program:
    return Program(unjitted(ops_module("example_kernel").double), (_s(8, 128),))


def _matmul() -> Program:
    fn = functools.partial(
        unjitted(ops_module("matmul").matmul), block_shape=(128, 128), block_k=128
    )
    return Program(fn, (_s(256, 256), _s(256, 256)))


def _gradients(attend: Callable[..., Any]) -> Callable[..., Any]:
    """The backward pass of an attention ``attend(q, k, v)``: gradients of its sum."""

    def backward(q: jax.Array, k: jax.Array, v: jax.Array) -> Any:
        return jax.grad(lambda *a: attend(*a).sum(), argnums=(0, 1, 2))(q, k, v)

    return backward


def _flash_blocks() -> Any:
    fa = ops_module("flash_attention")
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


def _flash(causal: bool, grad: bool) -> Program:
    fa = unjitted(ops_module("flash_attention").flash_attention)
    attend = functools.partial(fa, causal=causal, block_sizes=_flash_blocks())
    q = _s(1, 2, 256, 128)
    return Program(_gradients(attend) if grad else attend, (q, q, q))


def _splash(causal: bool, grad: bool) -> Program:
    sak = ops_module("splash_attention.splash_attention_kernel")
    sam = ops_module("splash_attention.splash_attention_mask")
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

    return Program(_gradients(attend) if grad else attend, (q, q, q))


GROUP_SIZES = np.array([128, 0, 256, 128], np.int32)


def _gmm(transposed: bool, sizes: Any = GROUP_SIZES) -> Program:
    gmm = ops_module("megablox.gmm")
    if transposed:
        return Program(
            functools.partial(gmm.tgmm, tiling=(128, 128, 128)), (_s(128, 512), _s(512, 128), sizes)
        )
    return Program(
        functools.partial(gmm.gmm, tiling=(128, 128, 128)), (_s(512, 128), _s(4, 128, 128), sizes)
    )


def _threefry() -> Program:
    tf = ops_module("random.threefry")
    return Program(
        lambda k: tf.threefry_2x32_count(k, (8, 128), (8, 128), (8, 128)),
        (np.zeros((2,), np.uint32),),
    )


def _philox() -> Program:
    ph = ops_module("random.philox")
    return Program(lambda k: ph.philox_4x32_count(k, (8, 128)), (np.zeros((2,), np.uint32),))


def _no_dma_of_their_own(report: Any, program: Program) -> None:
    assert report.dmas == 0, report


BLOCKSPEC_KERNELS: dict[str, Callable[[], Program]] = {
    "example_kernel_double": _double,
    "matmul": _matmul,
    "flash_attention": functools.partial(_flash, False, False),
    "flash_attention_causal": functools.partial(_flash, True, False),
    "flash_attention_causal_backward": functools.partial(_flash, True, True),
    "splash_attention": functools.partial(_splash, False, False),
    "splash_attention_causal": functools.partial(_splash, True, False),
    "splash_attention_causal_backward": functools.partial(_splash, True, True),
    "megablox_gmm": functools.partial(_gmm, False),
    "megablox_tgmm": functools.partial(_gmm, True),
    "random_threefry": _threefry,
    "random_philox": _philox,
}
SLOW = {"megablox_gmm", "flash_attention_causal_backward", "splash_attention_causal_backward"}


# ---------------------------------------------------------------- paged attention


def paged_attention_inputs() -> tuple[jax.Array, ...]:
    """q, k_pages, v_pages, lengths, page_indices: 2 sequences, 4 pages of 16 each."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 8, 128)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 8, 16, 128)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 8, 16, 128)), jnp.float32)
    lengths = jnp.array([40, 64], jnp.int32)
    indices = jnp.array([[3, 1, 0, 5], [2, 4, 6, 7]], jnp.int32)
    return q, k, v, lengths, indices


def paged_attention_module() -> Any:
    return ops_module("paged_attention.paged_attention_kernel")


def paged_attention() -> Program:
    fn = functools.partial(
        unjitted(paged_attention_module().paged_attention), pages_per_compute_block=2
    )
    return Program(fn, paged_attention_inputs())


def _copies_each_waited(report: Any, program: Program) -> None:
    """Its copies are proved, and waited (some waits cover several copies)."""
    assert report.dmas > 0 and 0 < report.waits <= report.dmas, report


CASES: list[Case] = [
    *(
        Case(
            f"jax_{name}",
            "grids",
            f"{JAX_OPS} {name}",
            build,
            {"verify": Ok(check=_no_dma_of_their_own)},
            slow=("verify",) if name in SLOW else (),
        )
        for name, build in BLOCKSPEC_KERNELS.items()
    ),
    Case(
        "jax_megablox_tgmm_with_unknown_group_sizes",
        "grids",
        f"{JAX_OPS} megablox tgmm",
        lambda: _gmm(True, jax.ShapeDtypeStruct((4,), jnp.int32)),
        {"verify": Unsupported(r"dynamic grid(.|\n)*gmm\.py|gmm\.py(.|\n)*dynamic grid")},
    ),
    Case(
        "jax_paged_attention",
        "grids",
        f"{JAX_OPS} paged_attention",
        paged_attention,
        {"verify": Ok(check=_copies_each_waited)},
    ),
]
