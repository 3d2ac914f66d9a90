"""tokamax's DMA kernels (``tokamax._src.ops``), from the installed tokamax wheel.

Shapes follow each op's tests shipped in the wheel (``*_test.py`` next to the kernel)
or, where none drives the kernel, its ``api.py``/``arg_specs.py``, made small: the
protocol depends on the number of blocks, not on their sizes.
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

OPS = "tokamax._src.ops"


def _sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ---------------------------------------------------------------- csa_gather


def _csa_gather(module: ModuleType) -> Program:
    pages, page_size, top_k = 4, 64, 256
    rng = np.random.default_rng(0)
    indices = jnp.asarray(rng.integers(0, pages * page_size, 2 * top_k), jnp.int32)
    fn = functools.partial(_unjitted(module.csa_gather), top_k=top_k, num_streams=2)
    args = (
        _sds((pages, page_size, 128), jnp.int32),
        _sds((pages, page_size // 4, 128), jnp.int32),
        indices,
        jnp.array([top_k], jnp.int32),
    )
    return Program(fn, args, mesh=chip("tpu7x"))


# ---------------------------------------------------------------- deepseek_rope


def _deepseek_rope(entry: str, heads: int | None) -> Any:
    def build(module: ModuleType) -> Program:
        tokens = 16
        shape = (tokens, 128) if heads is None else (tokens, heads, 128)
        positions = jnp.asarray(np.random.default_rng(0).integers(0, 64, tokens), jnp.int32)
        fn = functools.partial(_unjitted(getattr(module, entry)), tile_n=8)
        args = (_sds(shape, jnp.bfloat16), positions, _sds((64, 64), jnp.float32))
        return Program(fn, args, mesh=chip("v6e"))

    return build


# ---------------------------------------------------------------- ragged_gather(_reduce)


def _ragged_gather(dtype: Any) -> Any:
    def build(module: ModuleType) -> Program:
        rows, hidden, size = 64, 256, 512
        indices = jnp.asarray(np.random.default_rng(0).integers(0, rows, size), jnp.int32)
        fn = _unjitted(module.ragged_gather_pallas)
        args = (
            _sds((rows, hidden), dtype),
            indices,
            jnp.array([3], jnp.int32),
            jnp.array([338], jnp.int32),
        )
        return Program(fn, args, mesh=chip("tpu7x"))

    return build


def _ragged_gather_reduce(module: ModuleType) -> Program:
    rows, hidden, group, tokens = 128, 512, 4, 64
    rng = np.random.default_rng(0)
    size = tokens * group
    indices = jnp.asarray(rng.integers(0, rows, size), jnp.int32)
    valid = jnp.asarray(rng.random(size) < 0.8)
    fn = functools.partial(_unjitted(module.ragged_gather_reduce), reduce_group_size=group)
    args = (_sds((rows, hidden), jnp.bfloat16), indices, _sds((size,), jnp.float32), valid)
    return Program(fn, args, mesh=chip("tpu7x"))


# ---------------------------------------------------------------- proj_and_save_state


def _proj_and_save_state(padding: bool) -> Any:
    def build(module: ModuleType) -> Program:
        return _proj_and_save_state_program(module, padding)

    return build


def _proj_and_save_state_program(module: ModuleType, padding: bool) -> Program:
    # test_base.HCA: state width 512, compress ratio 128, 128 lanes, 256-row pages of
    # uint8 slabs (8 rows a token, 32 tokens a page).
    tokens, hidden, pages = 16, 256, 2
    rng = np.random.default_rng(0)
    slots = rng.permutation(pages * 32)[:tokens] * 8
    if padding:
        slots[3] = -1  # a padding token (as the wrapper pads to tile_n): no write
    fn = functools.partial(
        _unjitted(module.proj_and_save_state), compress_ratio=128, tile_k=128, tile_n=8
    )
    args = (
        _sds((tokens, hidden), jnp.bfloat16),
        _sds((hidden, 1024), jnp.bfloat16),
        _sds((128, 512), jnp.bfloat16),
        jnp.arange(tokens, dtype=jnp.int32),
        jnp.asarray(slots, jnp.int32),
        _sds((pages, 256, 4, 128), jnp.uint8),
    )
    return Program(fn, args, mesh=chip("v6e"))


# ---------------------------------------------------------------- gmm_v2 / tgmm_v2

GROUP_SIZES = (40, 0, 56, 32)  # 128 rows in 4 groups, one empty (gmm_v2_test)


def _gmm_v2(*, offset: bool = False, transpose: bool = False) -> Any:
    def build(module: ModuleType) -> Program:
        m, k, n, groups = 128, 512, 512, len(GROUP_SIZES)
        local = 2 if offset else groups
        rhs = (local, n, k) if transpose else (local, k, n)
        fn = functools.partial(_unjitted(module.gmm_v2), transpose_rhs=transpose)
        args = [
            _sds((m, k), jnp.bfloat16),
            _sds(rhs, jnp.bfloat16),
            jnp.array(GROUP_SIZES, jnp.int32),
        ]
        if offset:
            fn = functools.partial(fn, group_offset=jnp.array([1], jnp.int32))
        return Program(fn, tuple(args), mesh=chip("v6e"))

    return build


def _tgmm_v2(module: ModuleType) -> Program:
    m, k, n = 128, 512, 512
    fn = functools.partial(
        _unjitted(module.tgmm_v2), num_actual_groups=len(GROUP_SIZES),
        preferred_element_type=jnp.bfloat16,
    )  # fmt: skip
    args = (
        _sds((m, k), jnp.bfloat16),
        _sds((m, n), jnp.bfloat16),
        jnp.array(GROUP_SIZES, jnp.int32),
    )
    return Program(fn, args, mesh=chip("v6e"))


# ---------------------------------------------------------------- masked_dense_mla


def _as_shapes(arrays: tuple[Any, ...], concrete: tuple[int, ...]) -> tuple[Any, ...]:
    """Arrays at the positions in ``concrete`` as they are, the rest as shapes."""
    return tuple(a if i in concrete else _sds(a.shape, a.dtype) for i, a in enumerate(arrays))


def _masked_dense_mla(topk: int) -> Any:
    def build(module: ModuleType) -> Program:
        return _masked_dense_mla_program(module, topk)

    return build


def _masked_dense_mla_program(module: ModuleType, topk: int) -> Program:
    from tokamax._src.ops.masked_dense_mla import test_base

    inputs, _ = test_base.make_inputs(batch_size=4, num_heads=16, pages_per_seq=4, topk=topk)
    fn = functools.partial(
        _unjitted(module.masked_dense_ragged_paged_attention),
        num_kv_pages_per_block=(1, 2, 2), num_queries_per_block=(1, 8, 8),
    )  # fmt: skip
    return Program(fn, _as_shapes(inputs, (3, 4, 5, 6, 7)), mesh=chip("v6e"))


# ---------------------------------------------------------------- sparse_mla


def _sparse_mla(module: ModuleType) -> Program:
    from tokamax._src.ops.sparse_mla import test_base

    inputs, _ = test_base.make_inputs(batch_size=2, num_heads=16, topk=128)
    fn = functools.partial(_unjitted(module.sparse_ragged_paged_attention), sm_scale=1.0)
    return Program(fn, _as_shapes(inputs, (3, 4, 5, 6)), mesh=chip("v6e"))


# ---------------------------------------------------------------- dsv4_compressor


def _shape_of(a: Any) -> Any:
    return None if a is None else _sds(a.shape, a.dtype)


def _dsv4_compressor(case: str) -> Any:
    def build(module: ModuleType) -> Program:
        from tokamax._src.ops.dsv4_compressor import test_base

        inputs = test_base.make_case_inputs(case)
        args = _as_shapes(inputs.args, (1, 2, 3, 4))
        kwargs = dict(inputs.kwargs)
        for key in ("cos_sin_cache", "state_cache", "rope_cache"):
            kwargs[key] = _shape_of(kwargs[key])
        shaped = {k: v for k, v in kwargs.items() if isinstance(v, jax.ShapeDtypeStruct)}
        static = {k: v for k, v in kwargs.items() if k not in shaped}
        names = tuple(shaped)
        entry = functools.partial(_unjitted(module.compress_norm_rope_store), **static)

        def fn(*arrays: Any) -> Any:
            head, tail = arrays[: len(args)], arrays[len(args) :]
            return entry(*head, **dict(zip(names, tail, strict=True)))

        return Program(fn, (*args, *shaped.values()), mesh=chip("v6e"))

    return build


# ---------------------------------------------------------------- fused_moe_decode


def _fused_moe_decode(devices: int, *, ep: bool = False, scatter_rows: bool = False) -> Any:
    def build(module: ModuleType) -> Program:
        # test_fused_moe_decode_kernel.py: H 1024, intermediate 256 (shared 128), FP8
        # weights with per-channel scales, made smaller: 8 experts a rank, top-4, 8 tokens.
        h, inter, inter_s, experts, topk, m = 1024, 256, 128, 8, 4, 8
        f8, n = jnp.float8_e4m3fn, devices
        rng = np.random.default_rng(0)
        n_global = n * experts if ep else experts
        ids = np.stack([rng.choice(n_global, topk, replace=False) for _ in range(m)])
        weights = rng.dirichlet(np.ones(topk), size=m)
        weights[m - 3 :] = 0  # the test's padded rows
        args = (
            jnp.arange(n, dtype=jnp.int32).reshape(n, 1),
            _sds((n * m, h), jnp.bfloat16),
            _sds((n * experts, h, 2 * inter), f8),
            _sds((n * experts, inter, h), f8),
            _sds((n * experts, 1, 1, 2 * inter), jnp.float32),
            _sds((n * experts, 1, 1, h), jnp.float32),
            _sds((n * h, 2 * inter_s), f8),
            _sds((n, 2 * inter_s), jnp.float32),
            _sds((n * inter_s, h), f8),
            _sds((n, h), jnp.float32),
            jnp.asarray(np.tile(weights, (n, 1)), jnp.bfloat16),  # routes with weight 0 skip
            jnp.asarray(np.tile(ids, (n, 1)), jnp.int32),
        )
        entry = _unjitted(module.fused_moe_decode)

        def fn(rank: Any, x: Any, *rest: Any) -> Any:
            *weights, tw, ti = rest
            gate = jnp.zeros((h, 1), jnp.bfloat16)  # replicated in the test
            return entry(
                rank.reshape(-1), x, *weights, gate, tw, ti, n_ranks=n,
                expert_start=rank.reshape(()) * experts if ep else None,
                scatter_rows=scatter_rows,
            )  # fmt: skip

        return Program(fn, args, mesh=ring(n, "d", tpu="tpu7x"))

    return build


# ---------------------------------------------------------------- experimental/mla


def _mla(module: ModuleType) -> Program:
    from tokamax._src.ops.experimental.mla import utils

    seq_lens = [(1, 40), (24, 64)]  # one decode, one prefill sequence
    page_size = 16
    inputs = utils.generate_mla_inputs(
        seq_lens, 4, 128, 64, page_size, jnp.bfloat16, jnp.bfloat16,
        8 + len(seq_lens), rng=np.random.default_rng(0),
    )  # fmt: skip
    fn = functools.partial(
        _unjitted(module.mla_ragged_paged_attention), num_kv_pages_per_block=2,
        num_queries_per_block=4, vmem_limit_bytes=64 * 1024 * 1024, s_dtype=jnp.bfloat16,
    )  # fmt: skip
    return Program(fn, _as_shapes(tuple(inputs), (5, 6, 7, 8)), mesh=chip("tpu7x"))


GATHER_DMA = (
    "unsupported: {what}: its rows are gathered by a DMA whose source is indexed by an "
    "index vector (`.at[indices]`, a SparseCore gather) at {line}, which verify does not "
    "model; the message names that operation and its line. The row counts and indices "
    "it loads from VMEM before it (copied in from concrete arguments) are followed"
)
RAGGED_GATHER_LINE = "ragged_gather/pallas_mosaic_tpu_kernel.py"
CSA_GATHER_REFUSAL = GATHER_DMA.format(
    what="csa_gather", line="csa_gather/pallas_mosaic_tpu_kernel.py:180"
)


KERNELS = [
    FieldKernel(
        "tokamax/csa_gather",
        f"{OPS}.csa_gather.pallas_mosaic_tpu_kernel",
        _csa_gather,
        "tokamax csa_gather/pallas_mosaic_tpu_kernel_test.py (test_kernel_matches_reference: "
        "top_k 256, 2 streams, 2 periods, num_valid one period)",
        readings={"verify": CSA_GATHER_REFUSAL},
    ),
    *(
        FieldKernel(
            f"tokamax/deepseek_rope/{entry}",
            f"{OPS}.deepseek_rope.pallas_mosaic_tpu_kernel",
            _deepseek_rope(entry, heads),
            "tokamax deepseek_rope/pallas_mosaic_tpu_kernel_test.py (16 tokens, tile 8)",
        )
        for entry, heads in (("rope", 2), ("qnorm_rope", 2), ("rope_quant", None))
    ),
    *(
        FieldKernel(
            f"tokamax/ragged_gather/{jnp.dtype(dtype).name}",
            f"{OPS}.ragged_gather.pallas_mosaic_tpu_kernel",
            _ragged_gather(dtype),
            "tokamax ragged_gather/arg_specs.py (start 3, end 338), 512 indices into 64 rows",
            readings={"verify": GATHER_DMA.format(what="ragged_gather", line=RAGGED_GATHER_LINE)},
        )
        for dtype in (jnp.float32, jnp.bfloat16)
    ),
    FieldKernel(
        "tokamax/ragged_gather_reduce",
        f"{OPS}.ragged_gather_reduce.pallas_mosaic_tpu_kernel",
        _ragged_gather_reduce,
        "tokamax ragged_gather_reduce/arg_specs.py (hidden 512, reduce_group_size 4), "
        "64 tokens, 80% of routes valid",
        readings={
            "verify": "unsupported: the verifier does not model the primitive "
            "'parallel_loop' on a ref (plsc.parallel_loop zeroing the accumulator, "
            "ragged_gather_reduce/pallas_mosaic_tpu_kernel.py:304); the message names the "
            "primitive and line and says to use simulate; nothing the driver can change"
        },
    ),
    FieldKernel(
        "tokamax/proj_and_save_state",
        f"{OPS}.proj_and_save_state.pallas_mosaic_tpu_kernel",
        _proj_and_save_state(False),
        "tokamax proj_and_save_state/pallas_mosaic_tpu_kernel_test.py with test_base.HCA "
        "(16 tokens, hidden 256, tile_k 128, tile_n 8)",
    ),
    FieldKernel(
        "tokamax/proj_and_save_state/padding_slot",
        f"{OPS}.proj_and_save_state.pallas_mosaic_tpu_kernel",
        _proj_and_save_state(True),
        "tokamax proj_and_save_state/pallas_mosaic_tpu_kernel_test.py with test_base.HCA, "
        "one slot -1 (what the wrapper pads a token count to tile_n with)",
    ),
    *(
        FieldKernel(
            f"tokamax/gmm_v2{variant}",
            f"{OPS}.gmm_v2.gmm_v2",
            _gmm_v2(**options),
            "tokamax gmm_v2/gmm_v2_test.py (batch 128, in 512, out 512, 4 groups)",
        )
        for variant, options in (
            ("", {}),
            ("/group_offset", {"offset": True}),
            ("/transpose_rhs", {"transpose": True}),
        )
    ),
    FieldKernel(
        "tokamax/tgmm_v2",
        f"{OPS}.gmm_v2.tgmm_v2",
        _tgmm_v2,
        "tokamax gmm_v2/gmm_v2_test.py (tgmm: batch 128, in 512, out 512, 4 groups)",
    ),
    FieldKernel(
        "tokamax/masked_dense_mla/analytic",
        f"{OPS}.masked_dense_mla.pallas_mosaic_tpu_kernel",
        _masked_dense_mla(256),
        "tokamax masked_dense_mla/test_base.py make_inputs, analytic_causal_mask case "
        "(4 sequences: 2 decode, 2 prefill; 16 heads, pages of 32, 4 a sequence, top-k 256)",
    ),
    FieldKernel(
        "tokamax/masked_dense_mla/bitmap",
        f"{OPS}.masked_dense_mla.pallas_mosaic_tpu_kernel",
        _masked_dense_mla(64),
        "tokamax masked_dense_mla/test_base.py make_inputs, bitmap_unpadded case (top-k 64: "
        "the SparseCore csa_mask kernel builds the mask first)",
    ),
    FieldKernel(
        "tokamax/sparse_mla",
        f"{OPS}.sparse_mla.pallas_mosaic_tpu_kernel",
        _sparse_mla,
        "tokamax sparse_mla/test_base.py make_inputs (2 sequences: 1 decode, 1 prefill; "
        "16 heads, pages of 16, top-k 128)",
        readings={"verify": CSA_GATHER_REFUSAL + " (sparse_mla runs csa_gather first)"},
        slow=True,
    ),
    *(
        FieldKernel(
            f"tokamax/dsv4_compressor/{case}",
            f"{OPS}.dsv4_compressor.pallas_mosaic_tpu_kernel",
            _dsv4_compressor(case),
            f"tokamax dsv4_compressor/test_base.py CASES[{case!r}]",
            slow=True,  # building runs the reference projection; the walk takes 5-12 s
        )
        for case in ("csa_decode_batch_mixed", "csa_indexer_decode")
    ),
    *(
        FieldKernel(
            f"tokamax/fused_moe_decode/{n}_devices{variant}",
            f"{OPS}.experimental.fused_moe_decode.fused_moe_decode_kernel",
            _fused_moe_decode(n, **options),
            "tokamax experimental/fused_moe_decode/test_fused_moe_decode_kernel.py "
            "(TP all-reduce; 8 experts a rank, top-4, 8 tokens)",
        )
        for n, variant, options in (
            (2, "", {}),
            (8, "", {}),
            (4, "/ep", {"ep": True}),
            (4, "/scatter_rows", {"scatter_rows": True}),
        )
    ),
    FieldKernel(
        "tokamax/mla",
        f"{OPS}.experimental.mla.pallas_mosaic_tpu_kernel",
        _mla,
        "tokamax experimental/mla/pallas_mosaic_tpu_kernel_test.py test_mla_output_shapes "
        "(4 heads, lkv 128, r 64, pages of 16, num_kv_pages_per_block 2, "
        "num_queries_per_block 4), sequences made short",
    ),
]
