"""tpu-inference's MLA attention kernels (``kernels/mla``) and DeepSeek-V4 kernels.

Shapes follow the package's own tests (``tests/kernels/mla_v2_test.py`` and
``tests/kernels/deepseek_v4/``), made small: few sequences, few pages, narrow heads.
Metadata the kernels' control flow reads (sequence lengths, page tables, the
decode/prefill/mixed distribution) is passed as arrays; data as shapes.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.corpus._seeding import unjitted as _unjitted
from tests.corpus._case import Program, chip
from tests.field._kernel import FieldKernel

TI = "tpu_inference.kernels"
DSV4 = f"{TI}.experimental.deepseek_v4"
MLA_TEST = "tpu-inference tests/kernels/mla_v2_test.py"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def _spec(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ====================================================================== MLA (v1, v2)


def _mla_inputs(
    seq_lens: list[tuple[int, int]],
    num_heads: int,
    lkv_dim: int,
    r_dim: int,
    page_size: int,
    q_dtype: Any,
    kv_dtype: Any,
    num_pages: int,
    *,
    prefill: int = 0,
    transposed: bool = False,
) -> tuple[Any, ...]:
    """``generate_mla_inputs`` of mla_v2_test.py: data as shapes, metadata as arrays.

    The first sequences with one query are decode; the ``prefill`` after them are
    chunked prefill (the distribution's second bound); the rest are mixed.
    """
    packing = 4 // jnp.dtype(kv_dtype).itemsize
    total_q = sum(q for q, _ in seq_lens)
    pages_per_seq = _cdiv(max(kv for _, kv in seq_lens), page_size)
    indices: list[int] = []
    count = 0
    for _, kv_len in seq_lens:
        n = _cdiv(kv_len, page_size)
        indices += list(range(count, count + n)) + [-1] * (pages_per_seq - n)
        count += n
    decode = 0
    for q_len, _ in seq_lens:
        if q_len != 1:
            break
        decode += 1
    cu = np.cumsum([0] + [q for q, _ in seq_lens])
    kv_dim = _align(lkv_dim, 128) + _align(r_dim, 128)
    return (
        _spec((total_q, num_heads, lkv_dim), q_dtype),
        _spec((total_q, num_heads, r_dim), q_dtype),
        _spec((total_q, lkv_dim), kv_dtype),
        _spec((total_q, r_dim), kv_dtype),
        _spec(
            (max(num_pages, count), kv_dim, page_size)
            if transposed
            else (max(num_pages, count), page_size // packing, packing, kv_dim),
            kv_dtype,
        ),
        jnp.array([kv for _, kv in seq_lens], jnp.int32),
        jnp.array(indices, jnp.int32),
        jnp.array(cu, jnp.int32),
        jnp.array([decode, decode + prefill, len(seq_lens)], jnp.int32),
    )


MIXED = [(1, 18), (1, 40), (5, 18), (13, 37)]
"""Two decode sequences, then two mixed (test_ragged_paged_attention_mixed, shortened).
The third has more queries than a query block and its cached tokens end inside a
packed word (13 of 18), as (120, 597) does in the package's test."""


def _mla_v1(module: ModuleType) -> Program:
    args = _mla_inputs(MIXED, 8, 128, 64, 16, jnp.bfloat16, jnp.bfloat16, 8)
    fn = functools.partial(
        _unjitted(module.mla_ragged_paged_attention),
        num_kv_pages_per_block=2,
        num_queries_per_block=4,
        vmem_limit_bytes=100 * 1024 * 1024,
    )
    return Program(fn, args)


def _mla_v2(
    seq_lens: list[tuple[int, int]], *, page_size: int = 16, prefill: int = 0, **options: Any
) -> Any:
    def build(module: ModuleType) -> Program:
        ql_nope, *rest = _mla_inputs(
            seq_lens, 8, 128, 64, page_size, jnp.bfloat16, jnp.float8_e4m3fn, 8,
            prefill=prefill, transposed=options.get("transpose_kv_cache", False),
        )  # fmt: skip
        ql_nope = _spec((ql_nope.shape[1], ql_nope.shape[0], ql_nope.shape[2]), ql_nope.dtype)
        fn = functools.partial(
            _unjitted(module.mla_ragged_paged_attention),
            s_dtype=jnp.float32,
            num_kv_pages_per_block=2,
            num_queries_per_block=4,
            vmem_limit_bytes=100 * 1024 * 1024,
            **options,
        )
        return Program(fn, (ql_nope, *rest))

    return build


MLA_V2_REFETCH_RACE = (
    "by design: when a sequence has more queries than a query block and its cached "
    "tokens end inside a packed word (kernel.py _fetch_bkv, 'holes' comment), the "
    "kv-block prefetch for the next query block (kernel.py:982 via start_fetch_bkv) "
    "reads that boundary word of the cache while the new-kv write-back of the same "
    "block (kernel.py:1422 via start_update_kv_cache, issued only at bq_idx == 0) is "
    "still writing it; the read and the write are unordered, a real race, but "
    "harmless: the word's old tokens are written back with the bytes they already "
    "hold, and its new-token slots are overwritten in VMEM by _pack_new_kv from "
    "new_kv_c, so the value the read sees never matters"
)

MLA_V2_TRANSPOSED_RACE = (
    "by design: the same boundary-word race as with the untransposed cache, here between "
    "the write-back at kernel.py:1322 and the transposed refetch at kernel.py:675 (called "
    "from _fetch_transposed_bkv, kernel.py:764), harmless for the same reason; its "
    "zero-length copies of the page table's -1 padding move nothing and are in range"
)

KERNELS = [
    FieldKernel(
        "tpu-inference/mla_v1",
        f"{TI}.mla.v1.kernel",
        _mla_v1,
        f"{MLA_TEST} (generate_mla_inputs; test_ragged_paged_attention_mixed, 4 sequences)",
    ),
    FieldKernel(
        "tpu-inference/mla_v2/mixed",
        f"{TI}.mla.v2.kernel",
        _mla_v2(MIXED, decode_batch_size=4),
        f"{MLA_TEST} (test_ragged_paged_attention_mixed, 4 sequences)",
        readings={"verify": MLA_V2_REFETCH_RACE},
    ),
    FieldKernel(
        "tpu-inference/mla_v2/batched_decode",
        f"{TI}.mla.v2.kernel",
        _mla_v2([(1, 18), (1, 40), (1, 33), (1, 5), (1, 64)], decode_batch_size=4),
        f"{MLA_TEST} (test_ragged_paged_attention_deepseekv3_batch_decode, 5 sequences)",
    ),
    FieldKernel(
        "tpu-inference/mla_v2/chunked_prefill",
        f"{TI}.mla.v2.kernel",
        _mla_v2([(1, 18), (8, 30), (8, 21), (3, 10)], prefill=2, chunk_prefill_size=8),
        f"{MLA_TEST} (generate_mla_inputs; chunk_prefill_size as in "
        "mla_tuned_vs_baseline_test.py, 1 decode, 2 prefill, 1 mixed sequence)",
        readings={"verify": MLA_V2_REFETCH_RACE},
    ),
    FieldKernel(
        "tpu-inference/mla_v2/transposed_kv_cache",
        f"{TI}.mla.v2.kernel",
        _mla_v2([(1, 130), (1, 40), (5, 140), (13, 37)], page_size=128, transpose_kv_cache=True),
        f"{MLA_TEST} (test_ragged_paged_attention_mixed, shortened; transpose_kv_cache "
        "as attention_interface.py passes it, page size 128)",
        readings={"verify": MLA_V2_TRANSPOSED_RACE},
    ),
]


# ====================================================================== DeepSeek-V4


COMPRESS_TEST = "tpu-inference tests/kernels/deepseek_v4/compress_store_test.py"


def _proj_and_save_state(slots: list[int], hidden_size: int) -> Any:
    """CSA-indexer state: state width 256 (two 4x256-byte rows a token), 32-row pages."""

    def build(module: ModuleType) -> Program:
        n = len(slots)
        args = (
            _spec((n, hidden_size), jnp.float32),
            _spec((hidden_size, 512), jnp.float32),
            _spec((4, 256), jnp.float32),
            jnp.arange(n, dtype=jnp.int32),
            jnp.array(slots, jnp.int32),
            _spec((3, 32, 4, 256), jnp.uint8),
        )
        fn = functools.partial(_unjitted(module.proj_and_save_state), compress_ratio=4)
        return Program(fn, args, chip("v6e"))

    return build


KERNELS += [
    FieldKernel(
        "tpu-inference/proj_and_save_state/prefill",
        f"{DSV4}.compress_and_store.proj_and_save_state",
        _proj_and_save_state([2 * t for t in range(16)], 7168),
        f"{COMPRESS_TEST} (csa_indexer_decode's 16-token first run: slot_mapping "
        "arange(16) * state_rows_per_token, hidden_size 7168)",
    ),
    FieldKernel(
        "tpu-inference/proj_and_save_state/padded",
        f"{DSV4}.compress_and_store.proj_and_save_state",
        _proj_and_save_state([6, 14, 22, -1, 30, -1], 512),
        f"{COMPRESS_TEST} (csa_indexer_decode: 4 decode tokens; -1 slots for padding "
        "tokens as compressor_v1.py masks them)",
    ),
]


DSV4_TESTS = "tpu-inference tests/kernels/deepseek_v4"
DSV4_SEQS = [(1, 40), (1, 70), (9, 50), (20, 37)]
"""(new tokens, kv length): two decode sequences, two mixed (mla_test.py's half decode,
half 4-60 new tokens over 30-200 cached, shortened)."""


def _dsv4_metadata(
    seqs: list[tuple[int, int]], pages_per_seq: int, padded_tokens: int = 0
) -> dict[str, Any]:
    """Lengths, a page table of distinct pages, cumulative query lengths, and for each
    query token the kv length it attends (its causal position); ``padded_tokens``: the
    token arrays' length when the batch is padded (as vLLM pads it to a bucket)."""
    decode = sum(1 for q, _ in seqs if q == 1)
    attend = [kv - q + i + 1 for q, kv in seqs for i in range(q)]
    attend += [0] * (padded_tokens - len(attend))
    return {
        "tokens": len(attend),
        "kv_lens": jnp.array([kv for _, kv in seqs], jnp.int32),
        "attend": jnp.array(attend, jnp.int32),
        "pages": jnp.arange(len(seqs) * pages_per_seq, dtype=jnp.int32),
        "cu": jnp.array(np.cumsum([0] + [q for q, _ in seqs]), jnp.int32),
        "distribution": jnp.array([decode, decode, len(seqs)], jnp.int32),
    }


def _dsv4_mla(padded_tokens: int) -> Any:
    return functools.partial(_dsv4_mla_program, padded_tokens)


def _dsv4_mla_program(padded_tokens: int, module: ModuleType) -> Program:
    heads, head_dim, page_size, pages_per_seq = 8, 512, 16, 5
    m = _dsv4_metadata(DSV4_SEQS, pages_per_seq, padded_tokens)
    t = m["tokens"]
    args = (
        _spec((t, heads, head_dim), jnp.bfloat16),
        _spec((len(DSV4_SEQS) * pages_per_seq, page_size * 2, 4, 128), jnp.uint8),
        m["kv_lens"],
        m["attend"],
        m["pages"],
        m["cu"],
        m["distribution"],
        _spec((heads,), jnp.float32),
        _spec((t, heads, head_dim), jnp.bfloat16),
        _spec((t, heads), jnp.float32),
        _spec((t, heads), jnp.float32),
    )
    fn = functools.partial(
        _unjitted(module.mla_ragged_paged_attention),
        num_kv_pages_per_block=1,
        num_queries_per_block=16,
    )
    return Program(fn, args)


DSV4_MLA_ATTEND_OOB = (
    "true bug: compute_with_bq (mla.py:417) reads kv_lens_to_attend_ref[q_start + "
    "bq_idx * bq_sz + i] for every i < bq_sz, past the sequence's queries; for the "
    "last query block of the last sequence that is past the end of the SMEM array "
    "unless the token arrays are padded by bq_sz - 1 (bounds checks are disabled, so "
    "it reads whatever SMEM follows); the values only mask rows past the sequence, "
    "which are never sent, so the output is right, but the read is out of range "
    "(the package's own test makes the arrays exactly as long as the tokens)"
)

KERNELS += [
    FieldKernel(
        "tpu-inference/dsv4_mla",
        f"{DSV4}.core_attention.mla",
        _dsv4_mla(48),
        f"{DSV4_TESTS}/mla_test.py (test_correctness: 2 decode and 2 mixed sequences, "
        "page size 16, one page a kv block, 16 queries a block; 31 tokens padded to 48)",
    ),
    FieldKernel(
        "tpu-inference/dsv4_mla/unpadded",
        f"{DSV4}.core_attention.mla",
        _dsv4_mla(0),
        f"{DSV4_TESTS}/mla_test.py (test_correctness as above, the token arrays exactly "
        "as long as the tokens, as the test makes them)",
        readings={"verify": DSV4_MLA_ATTEND_OOB},
    ),
]


def _dsv4_mla_swa(seqs: list[tuple[int, int]]) -> Any:
    def build(module: ModuleType) -> Program:
        heads, head_dim, page_size, pages_per_seq = 8, 512, 16, 4
        m = _dsv4_metadata(seqs, pages_per_seq)
        t = m["tokens"]
        args = (
            _spec((t, heads, head_dim), jnp.bfloat16),
            _spec((t, head_dim), jnp.bfloat16),
            # the sliding-window cache's physical page holds 4 tokens more (2 slots each)
            _spec((len(seqs) * pages_per_seq, (page_size + 4) * 2, 4, 128), jnp.uint8),
            m["kv_lens"],
            m["pages"],
            m["cu"],
            m["distribution"],
            _spec((heads,), jnp.float32),
        )
        fn = functools.partial(
            _unjitted(module.mla_sliding_window_ragged_paged_attention),
            sliding_window=16,
            logical_page_size=page_size,
            num_queries_per_block=8,
            num_kv_pages_per_block=2,
            q_compute_block_size=2,
        )
        return Program(fn, args)

    return build


SWA_TEST = f"{DSV4_TESTS}/mla_swa_test.py (test_correctness_rng"
SWA_DUPLICATE_WRITES = (
    "by design: every kv block that holds new tokens writes them back to the cache "
    "(mla_swa.py:405 via start_update_kv_cache, mla_swa.py:536), and the overlapping "
    "windows of successive query blocks hold the same new tokens, so two write-backs "
    "from the two kv buffers write the same cache rows, each waited only before its "
    "own buffer is refetched; the kernel says so ('Writing to the kv cache is "
    "idempotent, some kv segment may have been inserted into the kv cache multiple "
    "times', mla_swa.py:653): both copies carry the same bytes (the same new_kv "
    "rows), so the unordered writes leave the same result"
)
KERNELS += [
    FieldKernel(
        "tpu-inference/dsv4_mla_swa/mixed",
        f"{DSV4}.core_attention.mla_swa",
        _dsv4_mla_swa([(1, 20), (1, 35), (9, 30), (20, 45)]),
        f"{SWA_TEST}, second step: half decode, half 8-32 new tokens; 4 sequences, "
        "window 16, page 16 in a physical page of 20)",
        readings={"verify": SWA_DUPLICATE_WRITES},
    ),
    FieldKernel(
        "tpu-inference/dsv4_mla_swa/decode",
        f"{DSV4}.core_attention.mla_swa",
        _dsv4_mla_swa([(1, 21), (1, 36), (1, 31), (1, 46)]),
        f"{SWA_TEST}, third step: all decode; 4 sequences)",
    ),
]


SPARSE_TEST = (
    f"{DSV4_TESTS}/sparse_mla_test.py (test_correctness: 2 decode and 2 mixed sequences, "
    "top-k 64 of a random permutation padded with -1, tokens padded to the 32-token "
    "chunk, batches of 4"
)
SPARSE_GATHER_REFUSED = (
    "unsupported: csa_gather.py:242 (the SparseCore gather sparse_mla calls before its "
    "attention kernel) copies with a ref indexed by an array, which verify does not "
    "model; the message names the operation and line; giving the top-k indices as an "
    "array (done) does not change it"
)


def _gather_in_jnp(nope: Any, rope: Any, indices: Any) -> tuple[Any, Any]:
    """``csa_gather.csa_gather`` (a SparseCore kernel of another module) as a jnp gather:
    a token's 512 nope bytes, and its 64 bf16 rope values."""
    rope_rows = rope.reshape(-1, 128)[indices].reshape(-1, 64, 2)
    return nope.reshape(-1, 512)[indices], jax.lax.bitcast_convert_type(rope_rows, jnp.bfloat16)


def _dsv4_sparse_mla(sparse_core_gather: bool) -> Any:
    return functools.partial(_dsv4_sparse_mla_program, sparse_core_gather)


def _dsv4_sparse_mla_program(sparse_core_gather: bool, module: ModuleType) -> Program:
    seqs = [(1, 40), (1, 90), (9, 50), (12, 30)]
    heads, head_dim, page_size, pages_per_seq, topk, chunk = 8, 512, 16, 8, 64, 32
    m = _dsv4_metadata(seqs, pages_per_seq, padded_tokens=chunk)
    rng = np.random.default_rng(1234)
    rows = []
    for q_len, kv_len in seqs:
        for _ in range(q_len):
            chosen = list(rng.permutation(kv_len)[:topk])
            rows.append(chosen + [-1] * (topk - len(chosen)))
    rows += [[-1] * topk] * (chunk - len(rows))  # pad_inputs pads with -1
    pages = len(seqs) * pages_per_seq
    args = (
        _spec((chunk, heads, head_dim), jnp.bfloat16),
        _spec((pages, page_size, 4, 128), jnp.uint8),
        _spec((pages, page_size // 4, 4, 128), jnp.uint8),
        jnp.array(rows, jnp.int32),
        m["pages"],
        m["cu"],
        m["distribution"],
        _spec((heads,), jnp.float32),
        _spec((chunk, heads, head_dim), jnp.bfloat16),
        _spec((chunk, heads), jnp.float32),
        _spec((chunk, heads), jnp.float32),
    )
    attention = functools.partial(
        _unjitted(module.sparse_ragged_paged_attention),
        attention_kernel_batch_size=4,
        gather_and_attention_chunk_size=chunk,
    )
    if sparse_core_gather:
        return Program(attention, args, chip("v6e"))  # csa_gather asks for the chip

    def fn(*xs: Any) -> Any:
        kept = module.csa_gather
        module.csa_gather = SimpleNamespace(csa_gather=_gather_in_jnp)
        try:
            return attention(*xs)
        finally:
            module.csa_gather = kept

    return Program(fn, args)


KERNELS += [
    FieldKernel(
        "tpu-inference/dsv4_sparse_mla",
        f"{DSV4}.core_attention.sparse_mla",
        _dsv4_sparse_mla(False),
        f"{SPARSE_TEST}; csa_gather's SparseCore gather replaced by a jnp gather, so that "
        "verify walks the attention kernel)",
        slow=True,
    ),
    FieldKernel(
        "tpu-inference/dsv4_sparse_mla/with_csa_gather",
        f"{DSV4}.core_attention.sparse_mla",
        _dsv4_sparse_mla(True),
        f"{SPARSE_TEST}; the SparseCore gather as the wrapper calls it)",
        readings={"verify": SPARSE_GATHER_REFUSED},
    ),
]


def _streamindex_topk(
    q_lens: list[int], seq_lens: list[int], page_size: int, ratio: int, bkv_p: int,
    block_table: list[list[int]],
) -> Any:  # fmt: skip
    """One case of test_streamindex_topk_numerical_correctness (4 query heads, D 16,
    k 1024, 8 queries a block): an FP8 index cache of 256-byte records."""

    def build(module: ModuleType) -> Program:
        tokens, heads = sum(q_lens), 4
        decode = 0
        while decode < len(q_lens) and q_lens[decode] == 1:
            decode += 1
        pages = max(max(row) for row in block_table) + 1
        args = (
            _spec((tokens, heads, 16), jnp.float32),
            _spec((tokens, heads), jnp.float32),
            _spec((pages, page_size // 4, 4, 256), jnp.uint8),
            jnp.array(seq_lens, jnp.int32),
            jnp.array(block_table, jnp.int32).reshape(-1),
            jnp.array(np.cumsum([0, *q_lens]), jnp.int32),
            jnp.array([decode, decode, len(q_lens)], jnp.int32),
        )
        fn = functools.partial(
            _unjitted(module.streamindex_topk),
            k=1024,
            compression_ratio=ratio,
            num_kv_pages_per_block=bkv_p,
            num_queries_per_block=8,
        )
        return Program(fn, args)

    return build


TOPK_TEST = f"{DSV4_TESTS}/test_streamindex_topk.py (test_streamindex_topk_numerical_correctness"
KERNELS += [
    FieldKernel(
        "tpu-inference/streamindex_topk/mixed",
        f"{DSV4}.indexer.streamindex_topk",
        _streamindex_topk([1, 5], [12, 16], 64, 2, 2, [[1, 3], [2, 0]]),
        f"{TOPK_TEST} case 6: one decode and one 5-token sequence)",
    ),
    FieldKernel(
        "tpu-inference/streamindex_topk/batched_decode",
        f"{DSV4}.indexer.streamindex_topk",
        _streamindex_topk([1, 1], [12, 16], 128, 1, 1, [[1, 3], [0, 2]]),
        f"{TOPK_TEST} case 2: two decode sequences)",
    ),
    FieldKernel(
        "tpu-inference/streamindex_topk/empty_sequence",
        f"{DSV4}.indexer.streamindex_topk",
        _streamindex_topk([2, 0, 3], [16, 0, 8], 64, 1, 2, [[1, 2], [0, 0], [4, 3]]),
        f"{TOPK_TEST} case 5: a dummy sequence of no tokens between two)",
    ),
]


def _rope(entry: str, shape: tuple[int, ...], dtype: Any, **options: Any) -> Any:
    """rope_test.py's ``_run``: random positions below 4096 into a (4096, 64) cos/sin
    cache; 256 tokens make two 128-token tiles of the kernel's pipeline."""

    def build(module: ModuleType) -> Program:
        rng = np.random.default_rng(0)
        positions = jnp.array(rng.integers(0, 4096, size=(shape[0],)), jnp.int32)
        args = (_spec(shape, dtype), positions, _spec((4096, 64), jnp.float32))
        fn = functools.partial(_unjitted(getattr(module, entry)), **options)
        return Program(fn, args, chip("v6e"))  # emit_pipeline asks for the chip

    return build


ROPE_TEST = f"{DSV4_TESTS}/rope_test.py"
KERNELS += [
    FieldKernel(
        "tpu-inference/dsv4_rope/multi_head",
        f"{DSV4}.rope",
        _rope("rope", (256, 8, 512), jnp.float32),
        f"{ROPE_TEST} (test_matches_reference_multi_head, 256 tokens, 8 heads of 512)",
    ),
    FieldKernel(
        "tpu-inference/dsv4_rope/single_head_inverse",
        f"{DSV4}.rope",
        _rope("rope", (8, 512), jnp.float32, inverse=True),
        f"{ROPE_TEST} (test_matches_reference_single_head, 8 tokens, inverse)",
    ),
    FieldKernel(
        "tpu-inference/dsv4_rope/qnorm_rope",
        f"{DSV4}.rope",
        _rope("qnorm_rope", (64, 8, 512), jnp.float32),
        f"{ROPE_TEST} (QNormRopeTest, 64 tokens, 8 heads of 512)",
    ),
    FieldKernel(
        "tpu-inference/dsv4_rope/rope_quant",
        f"{DSV4}.rope",
        _rope("rope_quant", (256, 8, 128), jnp.bfloat16, quant_dtype=jnp.float8_e4m3fn),
        f"{ROPE_TEST} (RopeQuantTest, 256 tokens, 8 indexer heads of 128, fp8)",
    ),
]
