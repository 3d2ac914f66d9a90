"""tpu-inference's attention-side DMA kernels: ragged paged attention (v2, v3, v3 hd64, v3
context-parallel), the v2 KV-cache update, the KV-transfer copies (chunked HBM copies
started in one kernel and waited in another, and the copy to host memory) and the causal
conv1d.

Shapes follow the package's own tests (``tests/kernels/ragged_paged_attention_kernel_v2_test.py``,
``..._v3_test.py``, ``..._v3_hd64_test.py``, ``ragged_kv_cache_update_v2_test.py``,
``causal_conv1d_test.py``, ``rpa_v3_cp/``, ``tests/distributed/test_kv_transfer.py``), made
small: few sequences, few pages. The lengths, page tables and other metadata the kernels'
control flow reads are given as arrays.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.corpus._seeding import unjitted as _unjitted
from tests.corpus._case import Program, chip, ring
from tests.field._kernel import FieldKernel

RPA = "tpu_inference.kernels.ragged_paged_attention"
TESTS = "tpu-inference tests/kernels"


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


# ---------------------------------------------------------------- ragged paged attention v2


def _rpa_v2(
    seq_lens: list[tuple[int, int]],
    *,
    num_heads: tuple[int, int] = (8, 2),
    page_size: int = 16,
    num_pages: int = 32,
    max_num_seqs: int = 4,
    max_tokens: int = 64,
    pages_per_block: int = 2,
    queries_per_block: int = 32,
    dtype: Any = jnp.float32,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> Any:
    def build(module: ModuleType) -> Program:
        head_dim = 128
        num_q_heads, num_kv_heads = num_heads
        cu_q_lens = np.zeros(max_num_seqs + 1, np.int32)
        kv_lens = np.zeros(max_num_seqs, np.int32)
        for i, (q_len, kv_len) in enumerate(seq_lens):
            cu_q_lens[i + 1] = cu_q_lens[i] + q_len
            kv_lens[i] = kv_len
        cu_q_lens[len(seq_lens) + 1 :] = cu_q_lens[len(seq_lens)]
        pages_per_seq = _cdiv(max(kv for _, kv in seq_lens), page_size)
        rng = np.random.default_rng(0)
        page_indices = rng.integers(0, num_pages, (max_num_seqs, pages_per_seq), dtype=np.int32)
        fn = functools.partial(
            _unjitted(module.ragged_paged_attention),
            num_kv_pages_per_block=min(pages_per_block, pages_per_seq),
            num_queries_per_block=queries_per_block,
            vmem_limit_bytes=32 * 1024 * 1024,
            sliding_window=sliding_window,
            soft_cap=soft_cap,
        )
        args = (
            jax.ShapeDtypeStruct((max_tokens, num_q_heads, head_dim), dtype),
            jax.ShapeDtypeStruct((num_pages, page_size, 2 * num_kv_heads, head_dim), dtype),
            jnp.asarray(kv_lens),
            jnp.asarray(page_indices),
            jnp.asarray(cu_q_lens),
            jnp.array([len(seq_lens)], jnp.int32),
        )
        return Program(fn, args)

    return build


V2_TEST = f"{TESTS}/ragged_paged_attention_kernel_v2_test.py"

KERNELS = [
    FieldKernel(
        "tpu-inference/rpa_v2/mixed",
        f"{RPA}.v2.kernel",
        _rpa_v2([(5, 18), (1, 40), (40, 50)]),
        f"{V2_TEST} test_ragged_paged_attention_mixed (3 sequences, pages of 16)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v2/decode_bf16",
        f"{RPA}.v2.kernel",
        _rpa_v2([(1, 18), (1, 129), (1, 31), (1, 64)], dtype=jnp.bfloat16, max_tokens=32),
        f"{V2_TEST} test_ragged_paged_attention_decode_only (bfloat16, 4 sequences)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v2/sliding_window",
        f"{RPA}.v2.kernel",
        _rpa_v2([(30, 60), (3, 40), (20, 20)], num_heads=(4, 4), sliding_window=5),
        f"{V2_TEST} test_ragged_paged_attention_sliding_window (sliding_window=5, heads 4/4)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v2/soft_cap",
        f"{RPA}.v2.kernel",
        _rpa_v2([(40, 70), (10, 30)], num_heads=(12, 2), soft_cap=50.0),
        f"{V2_TEST} test_ragged_paged_attention_logit_soft_capping (soft_cap=50, heads 12/2)",
    ),
]


# ---------------------------------------------------------------- v2 kv cache update


def _kv_cache_update(page_size: int, slices_per_block: int, padded: int) -> Any:
    def build(module: ModuleType) -> Program:
        heads, head_dim, pages, tokens = 2, 128, 20, 32
        lens = np.array([7, page_size, page_size, 1, 1, 1, 9], np.int32)
        cache_starts = np.array(
            [page_size * 2 - 7, page_size * 2, page_size * 3, page_size * 4 + 6]
            + [page_size * 5 + 7, page_size * 6 + 8, page_size * 15 + 3],
            np.int32,
        )
        new_starts = np.concatenate([[0], np.cumsum(lens[:-1])]).astype(np.int32)
        slices = np.zeros((3, padded), np.int32)
        slices[:, : len(lens)] = np.stack([cache_starts, new_starts, lens])
        num_slices = np.array([len(lens)], np.int32)
        fn = functools.partial(
            _unjitted(module.kv_cache_update),
            num_slices=num_slices,
            page_size=page_size,
            num_slices_per_block=slices_per_block,
        )
        args = (
            jax.ShapeDtypeStruct((max(tokens, int(lens.sum())), heads, head_dim), jnp.bfloat16),
            jnp.asarray(slices),
            jax.ShapeDtypeStruct((pages * page_size, heads, head_dim), jnp.bfloat16),
        )
        return Program(fn, args)

    return build


KV_UPDATE_TEST = f"{TESTS}/ragged_kv_cache_update_v2_test.py"
KV_UPDATE_UNPADDED = (
    "true bug: with fewer slices than a block holds (the package test's 7 slices with "
    "num_slices_per_block=8) the kernel reads slices_ref[1, 7] past the end of the SMEM "
    "array; lax.select evaluates both operands, so the guard offset_i < num_slices does "
    "not stop the load, only discards its value. Harmless when the caller pads slices to "
    "a multiple of num_slices_per_block ([3, padded_num_slices], as the kernel's comment "
    "asks), which the test does not"
)
KV_UPDATE_UNPADDED_RUN = (
    "true bug: the same read past the slot table, seen by jax's interpreter running the "
    "kernel (an out-of-bounds SMEM read of slices_ref[1, 7] at ragged_kv_cache_update.py:45)"
)

KERNELS += [
    FieldKernel(
        f"tpu-inference/kv_cache_update/{name}",
        f"{RPA}.v2.ragged_kv_cache_update",
        _kv_cache_update(page_size, per_block, padded),
        f"{KV_UPDATE_TEST} test_basic (7 slices padded to {padded}, page_size={page_size}, "
        f"num_slices_per_block={per_block})",
        readings=readings,
    )
    for name, page_size, per_block, padded, readings in (
        ("one_block", 32, 8, 8, {}),
        ("blocks_of_2", 33, 2, 8, {}),
        ("unpadded", 32, 8, 7, {"verify": KV_UPDATE_UNPADDED, "simulate": KV_UPDATE_UNPADDED_RUN}),
    )
]


# ---------------------------------------------------------------- ragged paged attention v3


def _rpa_v3_args(
    module: ModuleType,
    seq_lens: list[tuple[int, int]],
    distribution: tuple[int, int, int] | None,
    *,
    num_heads: tuple[int, int],
    head_dim: int,
    page_size: int,
    num_pages: int,
    max_num_seqs: int,
    q_dtype: Any,
    kv_dtype: Any,
) -> tuple[Any, ...]:
    """The package test's inputs: pages of each sequence allocated one after another."""
    num_q_heads, num_kv_heads = num_heads
    tokens = _cdiv(sum(q for q, _ in seq_lens), 128) * 128
    pages_per_seq = _cdiv(max(kv for _, kv in seq_lens), page_size)
    page_indices = np.zeros((max_num_seqs, pages_per_seq), np.int32)
    kv_lens = np.zeros(max_num_seqs, np.int32)
    cu_q_lens = np.zeros(max_num_seqs + 1, np.int32)
    used = 0
    for i, (q_len, kv_len) in enumerate(seq_lens):
        pages = _cdiv(kv_len, page_size)
        page_indices[i, :pages] = np.arange(used, used + pages)
        used += pages
        kv_lens[i] = kv_len
        cu_q_lens[i + 1] = cu_q_lens[i] + q_len
    assert used <= num_pages
    if distribution is None:
        distribution = (0, 0, len(seq_lens))
    cache = module.get_kv_cache_shape(num_pages, page_size, num_kv_heads, head_dim, kv_dtype)
    return (
        jax.ShapeDtypeStruct((tokens, num_q_heads, head_dim), q_dtype),
        jax.ShapeDtypeStruct((tokens, num_kv_heads, head_dim), kv_dtype),
        jax.ShapeDtypeStruct((tokens, num_kv_heads, head_dim), kv_dtype),
        jax.ShapeDtypeStruct(cache, kv_dtype),
        jnp.asarray(kv_lens),
        jnp.asarray(page_indices.reshape(-1)),
        jnp.asarray(cu_q_lens),
        jnp.array(distribution, jnp.int32),
    )


def _rpa_v3(
    seq_lens: list[tuple[int, int]],
    distribution: tuple[int, int, int] | None = None,
    *,
    num_heads: tuple[int, int] = (8, 2),
    head_dim: int = 128,
    page_size: int = 16,
    num_pages: int = 32,
    max_num_seqs: int = 8,
    dtype: Any = jnp.float32,
    kv_dtype: Any = None,
    block_sizes: tuple[int, int, int, int] = (32, 64, 16, 32),
    decode_block_sizes: tuple[int, int, int, int] = (1, 64, 1, 64),
    **options: Any,
) -> Any:
    def build(module: ModuleType) -> Program:
        args = _rpa_v3_args(
            module, seq_lens, distribution, num_heads=num_heads, head_dim=head_dim,
            page_size=page_size, num_pages=num_pages, max_num_seqs=max_num_seqs,
            q_dtype=dtype, kv_dtype=kv_dtype or dtype,
        )  # fmt: skip
        fn = functools.partial(
            _unjitted(module.ragged_paged_attention),
            d_block_sizes=decode_block_sizes,
            p_block_sizes=block_sizes,
            m_block_sizes=block_sizes,
            vmem_limit_bytes=100 * 1024 * 1024,
            **options,
        )
        return Program(fn, args, mesh=chip("v6e"))

    return build


V3_TEST = f"{TESTS}/ragged_paged_attention_kernel_v3_test.py"
V3_SEQS = [(5, 18), (1, 40), (40, 50), (1, 31)]

KERNELS += [
    FieldKernel(
        "tpu-inference/rpa_v3/mixed",
        f"{RPA}.v3.kernel",
        _rpa_v3(V3_SEQS),
        f"{V3_TEST} test_ragged_paged_attention_mixed (4 sequences, all in the mixed range)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3/decode_prefill_mixed",
        f"{RPA}.v3.kernel",
        _rpa_v3([(1, 40), (1, 31), (16, 50), (16, 20), (5, 18)], (2, 4, 5), chunk_prefill_size=16),
        f"{V3_TEST} test_ragged_paged_attention_mixed with a distribution of 2 decode, "
        "2 chunked-prefill (chunk_prefill_size=16) and 1 mixed sequence: all three kernels",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3/bf16_no_causal_mask",
        f"{RPA}.v3.kernel",
        _rpa_v3(V3_SEQS, dtype=jnp.bfloat16, use_causal_mask=False),
        f"{V3_TEST} test_ragged_paged_attention_basic (bfloat16, use_causal_mask=False)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3/sliding_window",
        f"{RPA}.v3.kernel",
        _rpa_v3([(30, 60), (3, 40), (20, 20)], num_heads=(4, 4), sliding_window=5),
        f"{V3_TEST} test_ragged_paged_attention_sliding_window (sliding_window=5, heads 4/4)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3/quantized_kv",
        f"{RPA}.v3.kernel",
        _rpa_v3(V3_SEQS, dtype=jnp.bfloat16, kv_dtype=jnp.float8_e4m3fn, k_scale=0.5, v_scale=0.5),
        f"{V3_TEST} test_ragged_paged_attention_quantized_kv_cache (float8_e4m3fn, scales 0.5)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3/kv_share",
        f"{RPA}.v3.kernel",
        _rpa_v3([(8, 24)], (0, 0, 1), num_heads=(8, 1), dtype=jnp.bfloat16, update_kv_cache=False),
        f"{V3_TEST} test_kv_share_chunked_prefill_input_kv_is_ignored (update_kv_cache=False)",
    ),
]


# ---------------------------------------------------------------- ragged paged attention v3 hd64


def _rpa_hd64(
    seq_lens: list[tuple[int, int]],
    *,
    num_heads: tuple[int, int] = (8, 2),
    dtype: Any = jnp.float32,
    kv_dtype: Any = None,
    pages_per_block: int = 2,
    queries_per_block: int = 32,
    attention_sink: bool = False,
    prefill: int = 0,
    **options: Any,
) -> Any:
    def build(module: ModuleType) -> Program:
        seqs = sorted(seq_lens, key=lambda s: s[0])  # decode sequences first, as the test
        decode = sum(1 for q, _ in seqs if q == 1)
        distribution = (decode, decode + prefill, len(seqs))
        args = _rpa_v3_args(
            module, seqs, distribution, num_heads=num_heads, head_dim=64,
            page_size=16, num_pages=32, max_num_seqs=8, q_dtype=dtype,
            kv_dtype=kv_dtype or dtype,
        )  # fmt: skip
        fn = functools.partial(
            _unjitted(module.ragged_paged_attention_hd64),
            num_kv_pages_per_block=pages_per_block,
            num_queries_per_block=queries_per_block,
            vmem_limit_bytes=100 * 1024 * 1024,
            **options,
        )
        if attention_sink:
            return Program(fn, (*args, jax.ShapeDtypeStruct((num_heads[0],), jnp.float32)))
        return Program(fn, args)

    return build


HD64_TEST = f"{TESTS}/ragged_paged_attention_kernel_v3_hd64_test.py"

KERNELS += [
    FieldKernel(
        "tpu-inference/rpa_v3_hd64/mixed",
        f"{RPA}.v3.kernel_hd64",
        _rpa_hd64(V3_SEQS),
        f"{HD64_TEST} test_ragged_paged_attention_mixed (4 sequences, 2 of them decode)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_hd64/chunked_prefill",
        f"{RPA}.v3.kernel_hd64",
        _rpa_hd64([(1, 40), (16, 50), (16, 20), (30, 31)], prefill=2, chunk_prefill_size=16),
        f"{HD64_TEST} test_ragged_paged_attention_mixed with 1 decode, 2 chunked-prefill "
        "(chunk_prefill_size=16) and 1 mixed sequence",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_hd64/sliding_window_sink",
        f"{RPA}.v3.kernel_hd64",
        _rpa_hd64(
            [(30, 60), (3, 40), (20, 20)], num_heads=(4, 4), sliding_window=5, attention_sink=True
        ),
        f"{HD64_TEST} test_ragged_paged_attention_sliding_window_with_attention_sink_hd64 "
        "(sliding_window=5)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_hd64/quantized_kv",
        f"{RPA}.v3.kernel_hd64",
        _rpa_hd64(V3_SEQS, dtype=jnp.bfloat16, kv_dtype=jnp.float8_e5m2, k_scale=0.5, v_scale=0.5),
        f"{HD64_TEST} test_ragged_paged_attention_quantized_kv_cache (float8_e5m2, scales 0.5)",
    ),
]


# ---------------------------------------------------------------- kv transfer

KV_TRANSFER = "tpu_inference.distributed.kv_transfer"
KV_TRANSFER_TEST = "tpu-inference tests/distributed/test_kv_transfer.py"
KV_TRANSFER_SHARD_MAPS = (
    "unsupported: the wrapper puts each start and each wait kernel in its own shard_map "
    "(4 here), and verify walks one shard_map per program; its message names the "
    "shard_maps and says to verify the per-device function, which the other "
    "kv_transfer kernels of this file do"
)


def _kv_transfer_args(
    layers: int,
    kv_shape: tuple[int, ...],
    offsets: tuple[list[int], list[int], list[int]],
    dtype: Any,
    num_chunks: int | None,
) -> tuple[Any, ...]:
    src_offsets, dest_offsets, chunk_sizes = offsets
    chunks = len(chunk_sizes) if num_chunks is None else num_chunks
    src = jax.ShapeDtypeStruct((sum(chunk_sizes), *kv_shape[1:]), dtype)
    dest = jax.ShapeDtypeStruct(kv_shape, dtype)
    metadata = (
        jnp.array(src_offsets, jnp.int32),
        jnp.array(dest_offsets, jnp.int32),
        jnp.array(chunk_sizes, jnp.int32),
        jnp.array([chunks], jnp.int32),
    )
    return (*[src] * layers, *[dest] * layers, *metadata)


def _chunked_copy(
    layers: int,
    kv_shape: tuple[int, ...],
    offsets: tuple[list[int], list[int], list[int]],
    dtype: Any = jnp.bfloat16,
    num_chunks: int | None = None,
) -> Any:
    """One device's part of ``_async_copy_jit``: every layer's start kernel (each aliasing
    the previous layer's destination, as the wrapper chains them), then every wait kernel
    (each taking the DMA future the start returned)."""

    def build(module: ModuleType) -> Program:
        def program(*arrays: jax.Array) -> list[jax.Array]:
            srcs, dests, metadata = arrays[:layers], arrays[layers:-4], arrays[-4:]
            last = dests[-1] if layers > 1 else srcs[0]
            started = []
            for src, dest in zip(srcs, dests, strict=True):
                aliased, future = module._start_chunked_copy_kernel(*metadata, src, last, dest)
                started.append((aliased, future))
                last = future[0]
            last, out = started[-1][0], []
            for aliased, future in started:
                last = module._wait_for_chunked_copy_kernel(*metadata, aliased, last, future)
                out.append(last)
            return out

        return Program(program, _kv_transfer_args(layers, kv_shape, offsets, dtype, num_chunks))

    return build


def _multi_layer_copy(module: ModuleType) -> Program:
    from jax.sharding import PartitionSpec as P

    from safedma.testing import abstract_mesh

    mesh = abstract_mesh((1, 2), ("data", "model"))
    spec = P(None, None, "model")
    args = _kv_transfer_args(2, (32, 16, 8, 2, 128), ([0, 1], [0, 10], [1, 2]), jnp.bfloat16, None)

    def program(*arrays: jax.Array) -> Any:
        return _unjitted(module._async_copy_jit)(
            src_array=list(arrays[:2]), dest_array=list(arrays[2:4]),
            src_offsets=arrays[4], dest_offsets=arrays[5], chunk_sizes=arrays[6],
            num_chunks=arrays[7], mesh=mesh, src_sharding_spec=spec, dest_sharding_spec=spec,
            src_offsets_sharding_spec=P(), dest_offsets_sharding_spec=P(),
            chunk_sizes_sharding_spec=P(), num_chunks_sharding_spec=P(),
        )  # fmt: skip

    return Program(program, args)


def _copy_to_host(memory_kind: str) -> Any:
    def build(module: ModuleType) -> Program:
        from jax.sharding import NamedSharding, PartitionSpec as P

        from safedma.testing import abstract_mesh

        mesh = abstract_mesh((2,), ("x",))
        spec = P(None, "x")
        out = NamedSharding(mesh, spec, memory_kind=memory_kind)
        copy = module._get_copy_to_dest_fn(mesh, spec, out, jnp.bfloat16, memory_kind)
        shape = jax.ShapeDtypeStruct((8, 256), jnp.bfloat16)
        return Program(_unjitted(copy), (shape, shape))

    return build


KERNELS += [
    FieldKernel(
        "tpu-inference/kv_transfer/multi_layer_variable_block",
        KV_TRANSFER,
        _chunked_copy(3, (40, 16, 8, 2, 128), ([0, 1, 3, 6], [0, 10, 20, 30], [1, 2, 3, 4])),
        f"{KV_TRANSFER_TEST} test_async_copy multi_layer_variable_block (3 layers of 40 "
        "pages, one device's share)",
    ),
    FieldKernel(
        "tpu-inference/kv_transfer/single_layer_single_block",
        KV_TRANSFER,
        _chunked_copy(1, (32, 16, 8, 2, 128), ([0], [0], [1])),
        f"{KV_TRANSFER_TEST} test_async_copy single_layer_single_block (head_dim 128: the "
        "wrapper's padding of 64 is jnp code)",
    ),
    FieldKernel(
        "tpu-inference/kv_transfer/padded_offsets_array",
        KV_TRANSFER,
        _chunked_copy(
            2,
            (32, 16, 8, 2, 128),
            ([0, 1, 10, 11, 12], [7, 1, 10, 11, 12], [1] * 5),
            jnp.float32,
            num_chunks=2,
        ),  # fmt: skip
        f"{KV_TRANSFER_TEST} test_async_copy padded_offsets_array_middle_blocks (2 of 5 "
        "chunks copied, 2 layers)",
    ),
    FieldKernel(
        "tpu-inference/kv_transfer/multi_layer_copy_wrapper",
        KV_TRANSFER,
        _multi_layer_copy,
        f"{KV_TRANSFER_TEST} test_async_copy through multi_layer_copy's jit on a (1, 2) mesh",
        readings={"verify": KV_TRANSFER_SHARD_MAPS},
    ),
    FieldKernel(
        "tpu-inference/kv_transfer/copy_to_host",
        KV_TRANSFER,
        _copy_to_host("pinned_host"),
        f"{KV_TRANSFER_TEST} test_hbm_to_host_dma ((8, 256) bfloat16 over 2 devices)",
    ),
    FieldKernel(
        "tpu-inference/kv_transfer/copy_to_device",
        KV_TRANSFER,
        _copy_to_host("device"),
        f"{KV_TRANSFER_TEST} _run_copy_to_host_test with a device destination",
    ),
]


# ---------------------------------------------------------------- causal conv1d


def _causal_conv1d(
    lengths: list[int],
    q_loc: list[int],
    distribution: list[int],
    *,
    dim: int = 128,
    tile_size: int = 8,
    dtype: Any = jnp.bfloat16,
    bias: bool = True,
) -> Any:
    def build(module: ModuleType) -> Program:
        kernel_size, reqs = 4, len(lengths)
        has_initial_state = np.array(lengths) > np.diff(q_loc)
        fn = functools.partial(
            _unjitted(module.ragged_causal_conv1d), kernel_size=kernel_size, tile_size=tile_size
        )
        args = (
            jax.ShapeDtypeStruct((q_loc[-1], dim), dtype),
            jax.ShapeDtypeStruct((reqs + 1, kernel_size - 1, dim), dtype),
            jax.ShapeDtypeStruct((dim, 1, kernel_size), dtype),
            jax.ShapeDtypeStruct((dim,), dtype) if bias else None,
            jnp.array(q_loc, jnp.int32),
            jnp.arange(1, reqs + 1, dtype=jnp.int32),
            jnp.array(distribution, jnp.int32),
            jnp.asarray(has_initial_state),
        )
        if not bias:
            return Program(
                lambda x, s, w, *rest: fn(x, s, w, None, *rest),
                args[:3] + args[4:],
                mesh=chip("v6e"),
            )
        return Program(fn, args, mesh=chip("v6e"))

    return build


CONV_TEST = f"{TESTS}/causal_conv1d_test.py"

KERNELS += [
    FieldKernel(
        "tpu-inference/causal_conv1d/varying_length",
        "tpu_inference.kernels.causal_conv1d.causal_conv1d",
        _causal_conv1d([40, 20], [0, 24, 36], [0, 0, 2]),
        f"{CONV_TEST} test_causal_conv1d_edge_cases multiple_sequences_varying_length "
        "(36 tokens in tiles of 8)",
    ),
    FieldKernel(
        "tpu-inference/causal_conv1d/single_token_decode",
        "tpu_inference.kernels.causal_conv1d.causal_conv1d",
        _causal_conv1d([10] * 6, list(range(7)), [6, 6, 6]),
        f"{CONV_TEST} test_causal_conv1d_edge_cases single_token_decode (6 sequences)",
    ),
    FieldKernel(
        "tpu-inference/causal_conv1d/empty_sequence_f32",
        "tpu_inference.kernels.causal_conv1d.causal_conv1d",
        _causal_conv1d([100, 10, 50], [0, 16, 16, 28], [0, 0, 3], dtype=jnp.float32, bias=False),
        f"{CONV_TEST} test_causal_conv1d_edge_cases empty_sequence, and test_causal_conv1d "
        "(float32, no bias)",
    ),
]


# ---------------------------------------------------------------- rpa v3 context parallel

RPA_CP = "tpu_inference.kernels.experimental.rpa_v3_cp.kernel"
CP_TEST = f"{TESTS}/rpa_v3_cp/ragged_paged_attention_kernel_cp_test.py"
CP_MAX_SEQ = 8
CP_SHUFFLE_RACE = (
    "true bug: the strided cache write stages each kv block's rank share in one "
    "kv_shuffle scratch (not double-buffered) and DMAs it to the cache on sems[3, slot] "
    "(kernel.py:976); the only wait for those copies is wait_update_kv_cache(slot) when "
    "that bkv slot is refetched (kernel.py:742). The last kv block of a launch prefetches "
    "nothing, so its strided store into kv_shuffle (kernel.py:960) runs while the previous "
    "block's cache-update copies, which read kv_shuffle, may still be in flight, and the "
    "cache gets the wrong tokens. Any launch whose writing sequence spans 2+ kv blocks "
    "(bkv_sz 32 here; one block of 64 is clean); the package tests use one block"
)


def _pad(values: list[int], length: int = CP_MAX_SEQ) -> jax.Array:
    return jnp.asarray(np.pad(np.array(values, np.int32), (0, length - len(values))))


def _cp_page_indices(pages: int, copies: int = 1) -> jax.Array:
    return _pad(list(range(pages)) * copies, CP_MAX_SEQ * pages)


def _rpa_cp(
    tokens: int,
    kv_len: int,
    cu_q_lens: list[int],
    *,
    page_size: int = 16,
    num_pages: int = 16,
    dtype: Any = jnp.float32,
    block_sizes: tuple[int, int, int, int] = (16, 32, 16, 32),
    arrays: dict[str, list[int]] | None = None,
    same_request: bool = False,
    **options: Any,
) -> Any:
    """One rank's launch as the package's PCP tests make it (one device, ``cp_rank``
    given): the array keywords (``cp_rank``, ``kv_cache_lens``, ``q_pos_offsets``,
    ``kv_write_seq_mask``) are concrete, padded to ``max_num_seqs`` as the test's ``_pad1``
    does."""

    def build(module: ModuleType) -> Program:
        seqs = len(cu_q_lens) - 1
        pps = _cdiv(kv_len, page_size)
        cache = module.get_kv_cache_shape(num_pages, page_size, 2, 128, dtype)
        given = {
            name: jnp.array(v, jnp.int32) if name == "cp_rank" else _pad(v)
            for name, v in (arrays or {}).items()
        }
        fn = functools.partial(
            _unjitted(module.ragged_paged_attention),
            d_block_sizes=(1, block_sizes[1], 1, block_sizes[3]),
            m_block_sizes=block_sizes,
            vmem_limit_bytes=100 * 1024 * 1024,
            **options,
        )
        args = (
            jax.ShapeDtypeStruct((tokens, 8, 128), dtype),
            jax.ShapeDtypeStruct((tokens, 2, 128), dtype),
            jax.ShapeDtypeStruct((tokens, 2, 128), dtype),
            jax.ShapeDtypeStruct(cache, dtype),
            _pad([kv_len] * seqs),
            _cp_page_indices(pps, seqs if same_request else 1),
            _pad(cu_q_lens, CP_MAX_SEQ + 1),
            jnp.array([0, 0, seqs], jnp.int32),
        )
        names = list(given)

        def program(*a: jax.Array) -> Any:
            return fn(*a[:8], **dict(zip(names, a[8:], strict=True)))

        return Program(program, (*args, *given.values()), mesh=chip("v6e"))

    return build


def _rpa_cp_ring(devices: int, prev_len: int, chunk: int, *, dtype: Any = jnp.float32) -> Any:
    """``_ring_vs_full_cache``: each rank holds every ``devices``-th token of the previous
    cache and streams it around the ring (remote copies to its right neighbour)."""

    def build(module: ModuleType) -> Program:
        page_size = 16
        kv_total = prev_len + devices * chunk
        pps = _cdiv(kv_total, page_size)
        cache = module.get_kv_cache_shape(16, page_size, 2, 128, dtype)
        dummy_kv = jax.ShapeDtypeStruct((chunk, 2, 128), dtype)
        metadata = (
            _pad([kv_total]),
            _cp_page_indices(pps),
            _pad([0, chunk], CP_MAX_SEQ + 1),
            jnp.array([0, 0, 1], jnp.int32),
            _pad([prev_len]),
        )
        blocks = (16, 32, 16, 32)

        def ring_body(q_l: jax.Array, c_l: jax.Array, k: jax.Array, v: jax.Array) -> Any:
            kv_lens, page_indices, cu_q_lens, distribution, kv_cache_lens = metadata
            rank = jax.lax.axis_index("pcp")
            out, _, _ = _unjitted(module.ragged_paged_attention)(
                q_l[0], k[0], v[0], c_l[0], kv_lens, page_indices, cu_q_lens, distribution,
                kv_cache_lens=kv_cache_lens,
                cp_rank=jax.lax.reshape(rank, (1,)).astype(jnp.int32),
                cp_group_size=devices, pcp_ring_axis_name="pcp", skip_current_attn=True,
                use_causal_mask=False, update_kv_cache=False, return_lse=True,
                sm_scale=128**-0.5, d_block_sizes=(1, 32, 1, 32), m_block_sizes=blocks,
                vmem_limit_bytes=100 * 1024 * 1024,
            )  # fmt: skip
            return out[None]

        per_rank = (
            jax.ShapeDtypeStruct((devices, chunk, 8, 128), dtype),
            jax.ShapeDtypeStruct((devices, *cache), dtype),
            jax.ShapeDtypeStruct((devices, *dummy_kv.shape), dtype),
            jax.ShapeDtypeStruct((devices, *dummy_kv.shape), dtype),
        )
        return Program(ring_body, per_rank, mesh=ring(devices, "pcp", tpu="v6e"))

    return build


KERNELS += [
    FieldKernel(
        "tpu-inference/rpa_v3_cp/current_head_tail",
        RPA_CP,
        _rpa_cp(
            64,
            64,
            [0, 16],
            arrays={"cp_rank": [1], "kv_cache_lens": [0], "q_pos_offsets": [32]},
            cp_group_size=2,
            skip_cache_attn=True,
            update_kv_cache=False,
        ),  # fmt: skip
        f"{CP_TEST} test_pcp_current_head_tail (P=2, rank 1's tail chunk of 16 of 64 tokens)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/two_phase_cache_lse",
        RPA_CP,
        _rpa_cp(
            32,
            64,
            [0, 16],
            arrays={"cp_rank": [0], "kv_cache_lens": [32]},
            cp_group_size=1,
            update_kv_cache=False,
            return_lse=True,
            use_causal_mask=False,
            skip_current_attn=True,
        ),  # fmt: skip
        f"{CP_TEST} test_pcp_two_phase_chunked_prefill (cache phase with LSE, 32 cached "
        "and 32 current tokens)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/strided_cache_write",
        RPA_CP,
        _rpa_cp(
            64,
            64,
            [0, 16],
            arrays={"cp_rank": [1], "kv_cache_lens": [0]},
            cp_group_size=2,
            update_kv_cache=True,
            skip_cache_attn=True,
            use_causal_mask=False,
        ),  # fmt: skip
        f"{CP_TEST} test_pcp_strided_cache_write (P=2, rank 1, 64 tokens)",
        readings={"verify": CP_SHUFFLE_RACE},
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/strided_cache_write_one_block",
        RPA_CP,
        _rpa_cp(
            64,
            64,
            [0, 16],
            arrays={"cp_rank": [1], "kv_cache_lens": [0]},
            cp_group_size=2,
            update_kv_cache=True,
            skip_cache_attn=True,
            use_causal_mask=False,
            block_sizes=(16, 64, 16, 32),
        ),  # fmt: skip
        f"{CP_TEST} test_pcp_strided_cache_write (P=2, rank 1, 64 tokens in one kv block, "
        "as the test's default block sizes make it)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/fused_current_phase_write",
        RPA_CP,
        _rpa_cp(
            33,
            33,
            [0, 16, 16],
            arrays={
                "cp_rank": [0],
                "kv_cache_lens": [0, 0],
                "q_pos_offsets": [0, 48],
                "kv_write_seq_mask": [0, 1],
            },
            same_request=True,
            cp_group_size=2,
            update_kv_cache=True,
            skip_cache_attn=True,
        ),  # fmt: skip
        f"{CP_TEST} test_pcp_fused_current_phase_write (P=2, aligned=False: rank 0's tail "
        "chunk is all padding)",
        readings={"verify": CP_SHUFFLE_RACE},
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/ring_cache_phase",
        RPA_CP,
        _rpa_cp_ring(2, 37, 16),
        f"{CP_TEST} test_pcp_ring_cache_phase_matches_full_cache (P=2 ring, 37 cached "
        "tokens striped over the ranks)",
    ),
    FieldKernel(
        "tpu-inference/rpa_v3_cp/ring_cache_phase_4",
        RPA_CP,
        _rpa_cp_ring(4, 75, 16),
        f"{CP_TEST} test_pcp_ring_cache_phase_matches_full_cache (P=4 ring, 75 cached "
        "tokens striped over the ranks)",
    ),
]
