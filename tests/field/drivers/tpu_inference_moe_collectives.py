"""tpu-inference's expert-parallel MoE, collective matmul and gated-delta-net kernels.

Shapes and metadata follow the package's own tests (``tests/kernels/fused_moe_v1_test.py``,
``collectives/all_gather_matmul_kernel_test.py``, ``fused_gdn_kernel_test.py``,
``gdn_decode_kernel_test.py``, ``recurrent_scan_test.py``, ``gdn_attention_v3_test.py``),
made small: the protocol depends on the number of blocks, devices and the routing, not
on sizes. The experimental fused-MoE reduce-scatter kernel has no package test: its
shapes follow its docstring and its routing ``fused_moe_rs._compute_rs_routing``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tests.corpus._seeding import unjitted as _unjitted
from tests.corpus._case import Program, chip
from tests.field._kernel import FieldKernel

TPI = "tpu_inference.kernels"


@contextlib.contextmanager
def _helper_module(module: ModuleType, *users: str) -> Iterator[None]:
    """While tracing, the modules ``users`` (which import ``module``'s package module *as
    a module* and call its DMA helpers through it) see ``module`` (original or mutant)."""
    name = module.__name__.rsplit(".", 1)[-1]
    held = [importlib.import_module(u) for u in users]
    saved = [getattr(h, name) for h in held]
    for h in held:
        setattr(h, name, module)
    try:
        yield
    finally:
        for h, old in zip(held, saved):
            setattr(h, name, old)


# ------------------------------------------------------------------ fused_moe v1


def _fused_moe(devices: int) -> Any:
    def build(module: ModuleType) -> Program:
        from safedma.testing import abstract_mesh

        mesh = abstract_mesh((1, devices), ("data", "model"))
        experts, top_k, hidden, inter = 2 * devices, 2, 256, 256
        tokens = 8 * devices
        rng = np.random.default_rng(0)
        gating = jnp.asarray(rng.standard_normal((tokens, experts)), jnp.bfloat16)
        bf16 = jnp.bfloat16

        def program(a: jax.Array, w1: jax.Array, w2: jax.Array, g: jax.Array) -> jax.Array:
            out: jax.Array = _unjitted(module.fused_ep_moe)(
                mesh, a, w1, w2, g, top_k, renormalize_topk_logits=True,
                bt=8, bf=256, bd1=256, bd2=256, btc=8, bfc=128, bd1c=256, bd2c=256,
            )  # fmt: skip
            return out

        return Program(
            program,
            (
                jax.ShapeDtypeStruct((tokens, hidden), bf16),
                jax.ShapeDtypeStruct((experts, 2, hidden, inter), bf16),
                jax.ShapeDtypeStruct((experts, inter, hidden), bf16),
                gating,
            ),
        )

    return build


# ------------------------------------------------------------------ all_gather_matmul


def _all_gather_matmul(devices: int) -> Any:
    def build(module: ModuleType) -> Program:
        from safedma.testing import abstract_mesh

        mesh = abstract_mesh((devices,), ("x",))
        bk, bn, grid_k, grid_n = 128, 128, 2, 2
        m, k, n = 16 * devices, bk * grid_k, bn * grid_n * devices

        def program(x: jax.Array, y: jax.Array) -> jax.Array:
            out: jax.Array = module.all_gather_matmul(x, y, mesh, "x", bn=bn, bk=bk)
            return out

        return Program(
            program,
            (
                jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                jax.ShapeDtypeStruct((k, n), jnp.bfloat16),
            ),
        )

    return build


# ------------------------------------------------------------------ gdn v1


def _gdn_inputs(decode_n: int, mixed: list[int], h_qk: int = 2, h_v: int = 2) -> dict[str, Any]:
    """The arguments of ``fused_gdn``'s two kernels as ``fused_gdn`` passes them (b, A_log
    and dt_bias broadcast to 128 lanes), data as shapes, metadata concrete."""
    lens = [1] * decode_n + mixed
    n, t, kd, vd, lanes = len(lens), sum(lens), 128, 128, 128
    f32 = jnp.float32
    return {
        "q": jax.ShapeDtypeStruct((t, h_qk, kd), jnp.bfloat16),
        "k": jax.ShapeDtypeStruct((t, h_qk, kd), jnp.bfloat16),
        "v": jax.ShapeDtypeStruct((t, h_v, vd), jnp.bfloat16),
        "g": jax.ShapeDtypeStruct((t, h_v, kd), f32),
        "state": jax.ShapeDtypeStruct((n, h_v, kd, vd), f32),
        "b": jax.ShapeDtypeStruct((t, h_v, lanes), jnp.bfloat16),
        "A_log": jax.ShapeDtypeStruct((h_v, lanes), f32),
        "cu_seqlens": jnp.asarray(np.cumsum([0, *lens]), jnp.int32),
        "state_indices": jnp.arange(n, dtype=jnp.int32),
        "has_initial_state": jnp.ones((n,), jnp.int32),
        "distribution": jnp.array([decode_n, n], jnp.int32),
    }


def _gdn_decode(module: ModuleType) -> Program:
    x = _gdn_inputs(8, [])

    def program(q, k, v, g, state, state_indices, distribution, b, a_log):  # type: ignore[no-untyped-def]
        return _unjitted(module.fused_decoding_gdn)(
            q, k, v, g, state, state_indices, distribution, b, scale=128**-0.5,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log,
        )  # fmt: skip

    names = ("q", "k", "v", "g", "state", "state_indices", "distribution", "b", "A_log")
    return Program(program, tuple(x[n] for n in names), chip("v6e"))


def _gdn_recurrent(module: ModuleType) -> Program:
    x = _gdn_inputs(3, [9, 15])

    def program(q, k, v, cu, g, state, idx, b, has_init, distribution, a_log):  # type: ignore[no-untyped-def]
        return module.fused_recurrent_gdn(
            q, k, v, cu, g, state, idx, b, has_init, scale=128**-0.5, use_qk_l2norm=True,
            use_gate_in_kernel=True, A_log=a_log, distribution=distribution,
        )  # fmt: skip

    names = (
        "q", "k", "v", "cu_seqlens", "g", "state", "state_indices", "b",
        "has_initial_state", "distribution", "A_log",
    )  # fmt: skip
    return Program(program, tuple(x[n] for n in names), chip("v6e"))


# ------------------------------------------------------------------ gdn v2


def _gdn_v2_decode(module: ModuleType) -> Program:
    n, h, d = 13, 2, 128
    bf16, f32 = jnp.bfloat16, jnp.float32

    def program(qkv, b, a, state, a_log, cu, idx, distribution, has_init):  # type: ignore[no-untyped-def]
        return module.ragged_gated_delta_rule_decode_only(
            qkv, b, a, state, a_log, None, cu, idx, distribution, has_init,
            n_kq=h, n_v=h, d_k=d, d_v=d, apply_silu=True,
        )  # fmt: skip

    args = (
        jax.ShapeDtypeStruct((n, 3 * h * d), bf16),
        jax.ShapeDtypeStruct((n, h), bf16),
        jax.ShapeDtypeStruct((n, h), bf16),
        jax.ShapeDtypeStruct((n, h, d, d), f32),
        jax.ShapeDtypeStruct((h,), f32),
        jnp.arange(n + 1, dtype=jnp.int32),
        jnp.arange(n, dtype=jnp.int32),
        jnp.array([n, n, n], jnp.int32),
        jnp.ones((n,), jnp.bool_),
    )
    return Program(program, args, chip("v6e"))


def _recurrent_scan(module: ModuleType) -> Program:
    """``recurrent_scan_v2.recurrent_scan`` with its DMA helpers (``recurrent_scan_impl``,
    imported there as a module) taken from ``module``."""
    scan = importlib.import_module(f"{TPI}.gdn.v2.recurrent_scan_v2")
    decodes, prefills, chunk = 10, [9, 15], 64
    n_kq, n_v, d, max_tokens, max_reqs = 2, 8, 128, 128, 16
    reqs = decodes + len(prefills)
    q_loc = np.cumsum([0] + [1] * decodes + prefills)
    q_loc = np.pad(q_loc, (0, max_reqs + 1 - len(q_loc)), constant_values=1)
    indices = np.pad(np.arange(1, reqs + 1), (0, max_reqs - reqs))
    bf16 = jnp.bfloat16

    def program(qkv, b, a, state, a_log, dt_bias, loc, idx, distribution):  # type: ignore[no-untyped-def]
        with _helper_module(module, scan.__name__):
            return _unjitted(scan.recurrent_scan)(
                qkv, b, a, state, a_log, dt_bias, loc, idx, distribution, n_kq=n_kq,
                n_v=n_v, d_k=d, d_v=d, chunk_size=chunk, BT=chunk, use_qk_norm_in_gdn=True,
            )  # fmt: skip

    rows = max_tokens + chunk
    args = (
        jax.ShapeDtypeStruct((rows, (2 * n_kq + n_v) * d), bf16),
        jax.ShapeDtypeStruct((rows, n_v), bf16),
        jax.ShapeDtypeStruct((rows, n_v), bf16),
        jax.ShapeDtypeStruct((max_reqs, n_v, d, d), jnp.float32),
        jax.ShapeDtypeStruct((n_v,), bf16),
        jax.ShapeDtypeStruct((n_v,), bf16),
        jnp.asarray(q_loc, jnp.int32),
        jnp.asarray(indices, jnp.int32),
        jnp.array([decodes, reqs, reqs], jnp.int32),
    )
    return Program(program, args, chip("v6e"))


# ------------------------------------------------------------------ gdn v3


def _gdn_v3(module: ModuleType) -> Program:
    """``wrapper.fused_conv1d_gdn`` (two kernels: batched decodes, then per-sequence
    prefills) with its buffered refs (``memory_ref``) taken from ``module``."""
    v3 = f"{TPI}.gdn.v3"
    wrapper = importlib.import_module(f"{v3}.wrapper")
    lengths = [1] * 8 + [64, 128]
    n_kq, n_v, d, ks = 2, 8, 128, 4
    reqs, tokens, dim = len(lengths), sum(lengths), (2 * n_kq + n_v) * d
    q_loc = np.cumsum([0, *lengths])
    f32 = jnp.float32

    def program(qkv, b, a, conv, state, w, bias, a_log, dt, loc, idx, dist, lens):  # type: ignore[no-untyped-def]
        with _helper_module(module, f"{v3}.wrapper", f"{v3}.metadata", f"{v3}.vmem_ldst"):
            return _unjitted(wrapper.fused_conv1d_gdn)(
                qkv, b, a, conv, state, w, bias, a_log, dt, loc, idx, dist, lens, idx,
                n_kq=n_kq, n_v=n_v, d_k=d, d_v=d, kernel_size=ks,
            )  # fmt: skip

    args = (
        jax.ShapeDtypeStruct((tokens, dim), f32),
        jax.ShapeDtypeStruct((tokens, n_v), f32),
        jax.ShapeDtypeStruct((tokens, n_v), f32),
        jax.ShapeDtypeStruct((reqs + 1, ks - 1, dim), f32),
        jax.ShapeDtypeStruct((reqs + 1, n_v, d, d), f32),
        jax.ShapeDtypeStruct((dim, 1, ks), f32),
        jax.ShapeDtypeStruct((dim,), f32),
        jax.ShapeDtypeStruct((n_v,), f32),
        jax.ShapeDtypeStruct((n_v,), f32),
        jnp.asarray(q_loc, jnp.int32),
        jnp.arange(1, reqs + 1, dtype=jnp.int32),
        jnp.array([8, reqs, reqs], jnp.int32),
        jnp.asarray(lengths, jnp.int32),
    )
    return Program(program, args, chip("v6e"))


# ------------------------------------------------------------------ experimental fused MoE


def _routing(tokens: int, experts: int, top_k: int) -> dict[str, Any]:
    """Top-k routing as ``fused_moe_rs._compute_rs_routing`` derives it (concrete)."""
    rng = np.random.default_rng(0)
    topk = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])
    flat = topk.reshape(-1)
    order = np.argsort(flat, kind="stable")
    return {
        "topk": topk,
        "group_sizes": jnp.asarray(np.bincount(flat, minlength=experts), jnp.int32),
        "lhs_indices": jnp.asarray(order // top_k, jnp.int32),
        "output_indices": jnp.asarray(order // top_k, jnp.int32),
        "topk_slot": jnp.asarray(order % top_k, jnp.int32),
    }


def _fused_rs_nodedup(devices: int) -> Any:
    def build(module: ModuleType) -> Program:
        from safedma.testing import abstract_mesh

        mesh = abstract_mesh((devices,), ("model",), tpu="v6e")
        tokens, experts, top_k, hidden, inter = 8 * devices, 2 * devices, 2, 256, 256
        r = _routing(tokens, experts, top_k)
        bf16 = jnp.bfloat16

        def program(h, w1, w2, gs, li, oi, tw, ti):  # type: ignore[no-untyped-def]
            return _unjitted(module.run_gmm_fused_rs)(
                h, w1, w2, gs, li, oi, tw, ti, devices, mesh, top_k=top_k
            )

        args = (
            jax.ShapeDtypeStruct((tokens, hidden), bf16),
            jax.ShapeDtypeStruct((experts, hidden, 2 * inter), bf16),
            jax.ShapeDtypeStruct((experts, inter, hidden), bf16),
            r["group_sizes"],
            r["lhs_indices"],
            r["output_indices"],
            jax.ShapeDtypeStruct((tokens, top_k), jnp.float32),
            r["topk_slot"],
        )
        return Program(program, args, chip("v6e"))

    return build


MOE_V1_REFUSAL = (
    "unsupported: the a2a scatter's offsets (kernel.py:489) are computed from the gating "
    "block b_gating_x2_vmem, which the copy at kernel.py:340 fills from gating_hbm, the "
    "argument `g` of the wrapper's own shard_map body (kernel.py:1680): verify follows "
    "the routing through the run_scoped buffer and SMEM table, but not a concrete array "
    "into a shard_map the program runs itself, so the message asks for `g` as a concrete "
    "array although the driver passes the gating as one; the expert sizes also come "
    "from the other devices (remote d2e_count copies)"
)

RS_NODEDUP_REFUSAL = (
    "unsupported: the grouped-matmul loop's trip count (gmm_fused_rs_nodedup.py:1109) reads "
    "max_num_gm_ref, which run_gmm_fused_rs computes with lax.pmax over the expert axis "
    "(data from other devices); the message names the operand max_num_gm_ref and says to "
    "simulate, not the pmax that computes it. Routing is given as concrete arrays"
)

DECODE_STORE_RACE = (
    "true bug: step 1 of block b prefetches block b+1's states into h_bufs[(b+1) % 2] "
    "while the state stores started from that slot in block b-1 (_start_store) are still "
    "in flight: they are waited only in step 4 of block b+1 ('stores from 2 blocks ago'), "
    "so a prefetch can overwrite a state before its store has read it and the cache gets "
    "another request's state; needs three or more blocks (here bt={bt}, {blocks} blocks)"
)
DECODE_STORE_RACE_RUN = (
    "true bug: the same race, seen by jax's interpreter with race detection: the "
    "prefetch DMA writes h_bufs while a state store still reads it"
)

SCAN_STORE_RACE = (
    "true bug: DecodeProcessor writes decode_store_scratch[slot] (recurrent_scan_impl.py:854) "
    "before _wait_same_slot_store waits the store DMA started from that slot two decode "
    "steps earlier (line 887); the comment says the wait comes before the write, the code "
    "does it after, so the earlier request's state can be overwritten while it is copied "
    "out"
)

KERNELS = [
    *(
        FieldKernel(
            f"tpu-inference/fused_moe_v1/{n}_devices",
            f"{TPI}.fused_moe.v1.kernel",
            _fused_moe(n),
            "tpu-inference tests/kernels/fused_moe_v1_test.py (test_basic, renormalized)",
            readings={"verify": MOE_V1_REFUSAL},
        )
        for n in (2, 4, 8)
    ),
    *(
        FieldKernel(
            f"tpu-inference/all_gather_matmul/{n}_devices",
            f"{TPI}.collectives.all_gather_matmul",
            _all_gather_matmul(n),
            "tpu-inference tests/kernels/collectives/all_gather_matmul_kernel_test.py "
            "(grid_k=2, grid_n=2, rhs_transpose=False)",
        )
        for n in (2, 4, 8)
    ),
    FieldKernel(
        "tpu-inference/gdn_v1_decode",
        f"{TPI}.gdn.v1.fused_gdn_decode_kernel",
        _gdn_decode,
        "tpu-inference tests/kernels/fused_gdn_kernel_test.py (test_basic, 8 decodes)",
        readings={
            "verify": DECODE_STORE_RACE.format(bt=1, blocks=8),
            "simulate": DECODE_STORE_RACE_RUN,
        },
    ),
    FieldKernel(
        "tpu-inference/gdn_v1_recurrent",
        f"{TPI}.gdn.v1.fused_gdn_recurrent_kernel",
        _gdn_recurrent,
        "tpu-inference tests/kernels/fused_gdn_kernel_test.py (test_basic 3 decodes + [9, 15])",
    ),
    FieldKernel(
        "tpu-inference/gdn_v2_decode",
        f"{TPI}.gdn.v2.gdn_decode_kernel",
        _gdn_v2_decode,
        "tpu-inference tests/kernels/gdn_decode_kernel_test.py (test_basic, 13 decodes)",
        readings={
            "verify": DECODE_STORE_RACE.format(bt=2, blocks=7),
            "simulate": DECODE_STORE_RACE_RUN,
        },
    ),
    FieldKernel(
        "tpu-inference/gdn_v2_recurrent_scan",
        f"{TPI}.gdn.v2.recurrent_scan_impl",
        _recurrent_scan,
        "tpu-inference tests/kernels/recurrent_scan_test.py (test_basic 10 decodes + [9, 15], "
        "chunk 64)",
        readings={"verify": SCAN_STORE_RACE},
        slow=True,
    ),
    FieldKernel(
        "tpu-inference/gdn_v3",
        f"{TPI}.gdn.v3.memory_ref",
        _gdn_v3,
        "tpu-inference tests/kernels/gdn_attention_v3_test.py "
        "(test_run_jax_gdn_attention_local, mixed_prefill_decode, shorter prefills)",
        slow=True,
    ),
    *(
        FieldKernel(
            f"tpu-inference/gmm_fused_rs_nodedup/{n}_devices",
            f"{TPI}.experimental.fused_moe.gmm_fused_rs_nodedup",
            _fused_rs_nodedup(n),
            "no package test: run_gmm_fused_rs's docstring, routing as "
            "fused_moe_rs._compute_rs_routing (2 experts a device, top 2)",
            readings={"verify": RS_NODEDUP_REFUSAL},
        )
        for n in (2, 4, 8)
    ),
]
