"""tpu-inference's stacked and batched ragged paged attention, tokamax's batched RPA, and
tpu-inference's SparseCore ragged gather / gather-reduce / scatter.

Shapes follow the packages' own tests (tpu-inference ``tests/kernels/stacked_rpa/``,
``ragged_gather_v2_test.py``, ``ragged_gather_reduce_v2_test.py``,
``ragged_scatter_test.py``; tokamax ``_src/ops/batched_rpa/kernel/*_test.py``), made
small; the metadata the control flow reads (lengths, page tables, start and end rows,
indices) is given as concrete arrays.
"""

from __future__ import annotations

import functools
import types
from types import ModuleType
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.corpus._seeding import unjitted as _unjitted
from tests.corpus._case import Program, chip
from tests.field._kernel import FieldKernel

TPUI = "tpu_inference.kernels"
SPARSE = f"{TPUI}.sparse_core"
STACKED = f"{TPUI}.experimental.stacked_rpa"


# ---------------------------------------------------------------- stacked RPA

PAGE = 128
HEADS = (8, 1, 128)  # query heads, KV heads, head dim
BATCH_Q_LENS, BATCH_KV_LENS = [1, 1, 5, 30], [129, 70, 65, 300]  # 2 decode, 2 mixed


def _rpa_inputs(
    q_lens: list[int],
    kv_lens: list[int],
    distribution: list[int],
    cache_shape: Callable[[int, int, int], tuple[int, ...]],
) -> tuple[Any, ...]:
    """A ragged paged attention wrapper's arguments: shapes for the data, arrays for the
    metadata; ``cache_shape(pages, kv_heads, dim)`` is the package's own cache shape."""
    rng = np.random.default_rng(0)
    n = len(kv_lens)
    pages_per_seq = -(-max(kv_lens) // PAGE)
    tokens = sum(q_lens)
    q_heads, kv_heads, dim = HEADS
    cache = cache_shape(n * pages_per_seq + 4, kv_heads, dim)
    cu = np.zeros(n + 1, np.int32)
    np.cumsum(q_lens, out=cu[1:])
    pages = rng.permutation(n * pages_per_seq + 4)[: n * pages_per_seq].astype(np.int32)
    return (
        jax.ShapeDtypeStruct((tokens, q_heads, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((tokens, kv_heads, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct((tokens, kv_heads, dim), jnp.bfloat16),
        jax.ShapeDtypeStruct(cache, jnp.bfloat16),
        jnp.asarray(kv_lens, jnp.int32),
        jnp.asarray(pages),
        jnp.asarray(cu),
        jnp.asarray(distribution, jnp.int32),
    )


def _stacked_inputs(q_lens: list[int], kv_lens: list[int], distribution: list[int]) -> tuple:
    """The stacked wrapper's arguments (its cache shape asks for the TPU generation)."""
    import importlib

    wrapper = importlib.import_module(f"{STACKED}.wrapper")

    def cache_shape(pages: int, kv_heads: int, dim: int) -> tuple[int, ...]:
        with jax.sharding.use_abstract_mesh(chip("v6e").abstract()):
            return tuple(wrapper.get_kv_cache_shape(pages, PAGE, kv_heads, dim, jnp.bfloat16))

    return _rpa_inputs(q_lens, kv_lens, distribution, cache_shape)


def _stacked(mode: str, window: int | None) -> Any:
    """The schedule kernel of one stacked-RPA path of ``wrapper.ragged_paged_attention``:
    ``mode`` "decode" or "prefill" (the MIXED case); the module is the schedule's."""

    def build(module: ModuleType) -> Program:
        import importlib

        wrapper = importlib.import_module(f"{STACKED}.wrapper")
        configs = importlib.import_module(f"{STACKED}.configs")
        config = importlib.import_module(f"{STACKED}.{mode}.config")

        def program(q, k, kv_cache, kv_lens, page_indices, cu_q_lens, distribution):  # noqa: ANN001, ANN202
            model, serve, decode_blocks, prefill_blocks, vmem, _, _ = wrapper._resolve_attn_static(
                q, k, kv_cache, kv_lens, page_indices, sm_scale=0.088, sliding_window=window,
                soft_cap=None, mask_value=None, q_scale=None, k_scale=None, v_scale=None,
                vmem_limit_bytes=None, out_dtype=None, decode_block_sizes=None,
                prefill_block_sizes=None,
            )  # fmt: skip
            if mode == "decode":
                cfgs = config.make_config(model, serve, decode_blocks, vmem, update_kv_cache=True)
            else:
                cfgs = config.make_config(
                    configs.RpaCase.MIXED, model, serve, prefill_blocks, vmem, update_kv_cache=True
                )
            sched = _unjitted(module.generate_rpa_metadata)(
                cu_q_lens, kv_lens, distribution, page_indices, cfgs=cfgs
            )
            # The schedule's rows past the steps it built are padding (copied out in
            # 1024-entry granules from SMEM rows never written); the attention kernel,
            # its only reader, reads the steps below actual_steps.
            return sched.actual_steps

        if mode == "decode":
            q, k, _, *rest = _stacked_inputs([1, 1, 1, 1], [1, 129, 70, 300], [4, 4, 4])
        else:
            q, k, _, *rest = _stacked_inputs([1, 5, 30, 60], [1, 65, 410, 300], [0, 0, 4])
        return Program(program, (q, k, *rest), mesh=chip("v6e"))

    return build


def _stacked_kernels() -> list[FieldKernel]:
    """The schedule kernels. The attention kernels are not driven: on jax 0.12 they fail
    while tracing (the output ``BufferedRef`` subclasses in ``bref.py`` use lookahead,
    and ``emit_pipeline``'s ``wait_in`` asks an output buffer for ``cumulative_wait_in``:
    an AssertionError in jax; the package pins jax 0.11.2). The prefill schedule
    without a sliding window is left out too: it masks a 2048-step SMEM window store by
    store, over two minutes of verify."""
    source = {
        "decode": "tpu-inference tests/kernels/stacked_rpa/stacked_rpa_kv_writeback_test.py "
        "(test_new_kv_lands_on_the_right_page_and_lane: one-token decode of 4 sequences, "
        "8 query heads, 1 KV head, bfloat16, pages of 128)",
        "prefill": "tpu-inference tests/kernels/stacked_rpa/stacked_rpa_kv_writeback_test.py "
        "(test_mixed_writes_every_new_token, MIXED: 4 sequences, queries of 1 to 60 tokens, "
        "bfloat16, pages of 128)",
    }
    kernels = []
    for mode, window in (("decode", None), ("decode", 256), ("prefill", 256)):
        variant = "non_sliding_window" if window is None else "sliding_window"
        kernels.append(
            FieldKernel(
                f"tpu-inference/stacked_rpa/{mode}/{variant}/schedule",
                f"{STACKED}.{mode}.{variant}.schedule",
                _stacked(mode, window),
                source[mode] + ("" if window is None else ", sliding window 256"),
            )
        )
    return kernels


# ---------------------------------------------------------------- batched RPA

BATCHED = f"{TPUI}.experimental.batched_rpa"


def _batched(part: str) -> Any:
    """``batched_rpa.wrapper.ragged_paged_attention``: the DECODE then the MIXED pass,
    each a schedule kernel and an attention kernel; ``part`` names the module given."""

    def build(module: ModuleType) -> Program:
        import importlib

        wrapper = importlib.import_module(f"{BATCHED}.wrapper")
        configs = importlib.import_module(f"{BATCHED}.configs")
        tuned = importlib.import_module(f"{BATCHED}.tuned_params")
        schedule = module if part == "schedule" else importlib.import_module(f"{BATCHED}.schedule")
        kernel = module if part == "kernel" else importlib.import_module(f"{BATCHED}.kernel")
        layout = configs.KVLayout.HEAD_ALONG_SUBLANE

        def program(q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution):  # noqa: ANN001, ANN202
            vmem = 64 * 1024 * 1024
            model = configs.ModelConfigs(
                num_q_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim=q.shape[2],
                sliding_window=None, sm_scale=0.088, soft_cap=None,
                mask_value=float(jnp.finfo(q.dtype).min),
            )  # fmt: skip
            serve = configs.ServingConfigs(
                num_seqs=kv_lens.shape[0], num_page_indices=page_indices.shape[0],
                total_q_tokens=q.shape[0], dtype_q=q.dtype, dtype_kv=kv_cache.dtype,
                dtype_out=q.dtype, page_size=kv_cache.shape[1], scale_q=None, scale_k=None,
                scale_v=None, kv_layout=layout, decode_query_size=1,
            )  # fmt: skip
            o_hbm, new_kv_hbm = wrapper.prepare_inputs(
                q, k, v, q.dtype, kv_cache.dtype, kv_layout=layout
            )
            steps = []
            for mode, case in (
                (configs.RpaCase.DECODE, "decode"),
                (configs.RpaCase.MIXED, "prefill"),
            ):
                blocks = tuned.get_tuned_params(model, serve, case=case, vmem_limit_bytes=vmem)
                cfgs = configs.RpaConfigs(
                    block=blocks, model=model, serve=serve, vmem_limit_bytes=vmem, mode=mode
                )
                sched = _unjitted(schedule.generate_rpa_metadata)(
                    cu_q_lens, kv_lens, distribution, cfgs=cfgs, update_kv_cache=True
                )
                steps.append(sched.actual_steps)
                if part == "kernel":
                    o_hbm, kv_cache = _unjitted(kernel.rpa_kernel)(
                        cu_q_lens, kv_lens, page_indices, sched, o_hbm, new_kv_hbm, kv_cache,
                        cfgs=cfgs,
                    )  # fmt: skip
            if part == "schedule":
                return steps
            return o_hbm, kv_cache

        def cache_shape(pages: int, kv_heads: int, dim: int) -> tuple[int, ...]:
            with jax.sharding.use_abstract_mesh(chip("v6e").abstract()):
                return tuple(
                    wrapper.get_kv_cache_shape(
                        pages, PAGE, kv_heads, dim, jnp.bfloat16, kv_layout=layout
                    )
                )

        args = _rpa_inputs(BATCH_Q_LENS, BATCH_KV_LENS, [2, 2, 4], cache_shape)
        return Program(program, args, mesh=chip("v6e"))

    return build


# ---------------------------------------------------------------- tokamax batched RPA

TOKAMAX = "tokamax._src.ops.batched_rpa.kernel"


def _tokamax(part: str) -> Any:
    """tokamax's ``wrapper.ragged_paged_attention`` (DECODE, PREFILL and MIXED passes,
    each a schedule kernel and an attention kernel), with the wrapper's ``schedule`` or
    ``kernel`` module replaced by the one given while it is traced."""

    def build(module: ModuleType) -> Program:
        import contextlib
        import importlib

        wrapper = importlib.import_module(f"{TOKAMAX}.wrapper")
        run = _unjitted(wrapper.ragged_paged_attention)

        # For the schedule alone the attention kernel is left out (it passes its
        # outputs through): the schedule is checked without its reader.
        swap = {part: module}
        if part == "schedule":
            swap["kernel"] = types.SimpleNamespace(rpa_kernel=lambda *a, **_: (a[6], a[8], a[9]))

        def program(*args: Any) -> Any:
            with contextlib.ExitStack() as stack:
                for name, value in swap.items():
                    saved = getattr(wrapper, name)
                    setattr(wrapper, name, value)
                    stack.callback(setattr, wrapper, name, saved)
                return run(*args, sm_scale=0.088)

        def cache_shape(pages: int, kv_heads: int, dim: int) -> tuple[int, ...]:
            return tuple(wrapper.get_kv_cache_shape(pages, PAGE, kv_heads, dim, jnp.bfloat16))

        args = _rpa_inputs(BATCH_Q_LENS, BATCH_KV_LENS, [2, 2, 4], cache_shape)
        return Program(program, args, mesh=chip("tpu7x"))

    return build


# ---------------------------------------------------------------- SparseCore


def _ragged_gather_v2(module: ModuleType) -> Program:
    rng = np.random.default_rng(0)
    x = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    indices = jnp.asarray(rng.integers(0, 512, (400,)), jnp.int32)
    start = jnp.array([3], jnp.int32)
    end = jnp.array([338], jnp.int32)
    fn = functools.partial(_unjitted(module.ragged_gather_v2), max_row_subchunks=1)
    return Program(fn, (x, indices, start, end), mesh=chip("v6e"))


def _ragged_scatter(module: ModuleType) -> Program:
    rng = np.random.default_rng(0)
    # x over 0.3 of the chip's VMEM: the wrapper's XLA fallback is taken below that.
    x = jax.ShapeDtypeStruct((1024, 16384), jnp.float32)
    indices = jnp.asarray(rng.permutation(1024), jnp.int32)
    start = jnp.array([10], jnp.int32)
    end = jnp.array([422], jnp.int32)
    fn = _unjitted(module.ragged_scatter)
    return Program(fn, (x, indices, start, end), mesh=chip("v6e"))


def _ragged_gather_reduce_v2(module: ModuleType) -> Program:
    rng = np.random.default_rng(0)
    # x over 0.3 of the chip's VMEM: the wrapper's XLA fallback is taken below that.
    x = jax.ShapeDtypeStruct((840, 16384), jnp.float32)
    indices = rng.permutation(840).astype(np.int32)
    weights = jnp.asarray(rng.standard_normal(840), jnp.bfloat16)
    valid = jnp.asarray((indices >= 10) & (indices < 255))
    fn = functools.partial(_unjitted(module.ragged_gather_reduce), reduce_group_size=8)
    return Program(fn, (x, jnp.asarray(indices), weights, valid), mesh=chip("v6e"))


SCHEDULE_STEPS = (
    "unsupported: the attention kernel's pipeline length is the schedule's actual_steps, "
    "which the schedule kernel stores into a one-element SMEM scratch and DMAs to its "
    "one-element HBM output; verify does not follow contents through that copy and says "
    "'written where the verifier does not follow contents: a buffer over 4096 elements, "
    "or a copy from one' (neither buffer is large; a plain SMEM output store is "
    "followed). The message names the operand, not an argument to give concretely: the "
    "metadata already is"
)

GATHER_DMA = (
    "unsupported: its rows are gathered by a DMA whose source is indexed by an index "
    "vector (`.at[indices]`, a SparseCore gather) at {}, which verify does not model; "
    "the message names that operation and its line. The row counts it loads from VMEM "
    "before it (copied in from concrete arguments) are followed"
)

SCATTER_IN_ORDER = (
    "true bug: every row copy of a tile (ragged_scatter.py:123) shares one receive "
    "semaphore, and each column's write-back waits 8 copies' worth of bytes on it "
    "(line 141) before reading those rows out (line 232); any 8 of the tile's copies "
    "may have landed by then, so the rows read may still be in flight. The kernel's own "
    "NOTE says it relies on copies completing in start order, which no Pallas document "
    "promises (the verify page's all-gather example is the same mechanism)"
)

BATCHED_SOURCE = (
    "tpu-inference tests/layers/common/test_attention_interface.py (the batched RPA "
    "path; shapes as stacked_rpa_kv_writeback_test.py: 2 decode and 2 mixed sequences, "
    "8 query heads, 1 KV head, bfloat16, pages of 128)"
)

TOKAMAX_SOURCE = (
    "tokamax _src/ops/batched_rpa/kernel/stacked_rpa_kv_writeback_test.py (the wrapper "
    "on a mixed batch: 2 decode and 2 mixed sequences, 8 query heads, 1 KV head, "
    "bfloat16, pages of 128)"
)

KERNELS = [
    *_stacked_kernels(),
    FieldKernel(
        "tpu-inference/batched_rpa/schedule",
        f"{BATCHED}.schedule",
        _batched("schedule"),
        BATCHED_SOURCE,
        slow=True,
    ),
    FieldKernel(
        "tpu-inference/batched_rpa",
        f"{BATCHED}.kernel",
        _batched("kernel"),
        BATCHED_SOURCE,
        readings={"verify": SCHEDULE_STEPS},
        slow=True,
    ),
    FieldKernel(
        "tokamax/batched_rpa/schedule",
        f"{TOKAMAX}.schedule",
        _tokamax("schedule"),
        TOKAMAX_SOURCE,
    ),
    FieldKernel(
        "tokamax/batched_rpa",
        f"{TOKAMAX}.kernel",
        _tokamax("kernel"),
        TOKAMAX_SOURCE,
        readings={"verify": SCHEDULE_STEPS},
    ),
    FieldKernel(
        "tpu-inference/ragged_gather_v2",
        f"{SPARSE}.ragged_gather_v2",
        _ragged_gather_v2,
        "tpu-inference tests/kernels/ragged_gather_v2_test.py (test_sc_gather: in 512, "
        "out 400, rows 3..338, hidden 128, float32, max_row_subchunks=1)",
        readings={"verify": GATHER_DMA.format("ragged_gather_v2.py")},
    ),
    FieldKernel(
        "tpu-inference/ragged_gather_reduce_v2",
        f"{SPARSE}.ragged_gather_reduce_v2",
        _ragged_gather_reduce_v2,
        "tpu-inference tests/kernels/ragged_gather_reduce_v2_test.py "
        "(test_sc_ragged_gather_reduce: out 840, rows 10..255, float32, group 8; hidden "
        "16384 so that the SparseCore path is taken)",
        readings={"verify": GATHER_DMA.format("ragged_gather_reduce_v2.py:589")},
    ),
    FieldKernel(
        "tpu-inference/ragged_scatter",
        f"{SPARSE}.ragged_scatter",
        _ragged_scatter,
        "tpu-inference tests/kernels/ragged_scatter_test.py (test_sc_gather: out 1024, "
        "rows 10..422, float32; hidden 16384 so that the SparseCore path is taken)",
        readings={"verify": SCATTER_IN_ORDER},
    ),
]
