"""Control flow the program computes from data: DMA offsets, trip counts and scalar
prefetch that come out of vector code, jnp code between kernels, or an earlier kernel.

Each program is verified with concrete arguments (verify evaluates the values exactly),
refused with its arguments given as shapes (the message names the operation whose
value is needed, its line, and the argument to give concretely), and caught with one
seeded mistake (written for this suite):

* ``moe_routing``: an MoE kernel takes the top-1 expert of each token from its router
  logits (vector code in VMEM), moves the routing table to SMEM and copies each token's
  expert row; the bug's table is off by one, and the last expert's tokens copy past
  the weights (R4);
* ``offsets_between_kernels``: jnp's ``top_k`` and ``sort`` under the program's
  ``shard_map`` pick the rows a kernel gathers through scalar prefetch; the bug shifts
  them past the end (R4);
* ``schedule_kernel``: a schedule ``pallas_call`` turns row lengths into offsets that
  the main kernel reads as scalar prefetch; the bug's inclusive prefix sum sends the
  last step past the end (R4);
* ``counted_rows``: a kernel counts the valid rows of a VMEM mask (a vector reduced to
  a scalar) and copies that many rows; the bug waits one copy fewer than it starts (R2).
"""

from __future__ import annotations

import functools

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.corpus._case import OK, Case, Program, Raises, ring

DEVICES = 2
T, E, D = 8, 8, 128  # tokens, experts, row width (per device)
NOT_INTERMEDIATE = ("pass it as a concrete array",)


def _shapes(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)


def _refused(op: str, arg: str) -> Raises:
    """The abstract program is refused naming the operation, its line and the argument."""
    return Raises(
        "VerificationUnsupported",
        says=(f"`{op}`", f"`{arg}`", "concrete array"),
        absent=NOT_INTERMEDIATE,
    )


# ---------------------------------------------------------------- (a) vector code


def moe_kernel(
    logits_ref: Any,
    w_hbm: Any,
    o_ref: Any,
    table_v: Any,
    table_s: Any,
    row: Any,
    sem: Any,
    *,
    bug: bool,
) -> None:
    """Top-1 routing from the router logits, then one expert row copied per token."""
    expert = jnp.argmax(logits_ref[...], axis=1).astype(jnp.int32)  # fix: moe_routing_abstract
    if bug:
        expert = expert + 1  # fix: moe_routing_bug
    table_v[...] = expert.reshape(1, T)
    pltpu.sync_copy(table_v, table_s)  # the scalars the copies need, in SMEM

    def token(t: Any, carry: Any) -> Any:
        copy = pltpu.make_async_copy(w_hbm.at[pl.ds(table_s[0, t], 1)], row, sem)
        copy.start()  # fix: moe_routing_bug
        copy.wait()
        o_ref[pl.ds(t, 1), :] = row[...]
        return carry

    lax.fori_loop(0, T, token, 0)


def moe_routing(bug: bool = False) -> Any:
    def fn(logits: Any, w: Any) -> Any:
        return pl.pallas_call(
            functools.partial(moe_kernel, bug=bug),
            out_shape=jax.ShapeDtypeStruct((T, D), jnp.float32),
            in_specs=[
                pl.BlockSpec(memory_space=pltpu.VMEM),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
            scratch_shapes=[
                pltpu.VMEM((1, T), jnp.int32),
                pltpu.SMEM((1, T), jnp.int32),
                pltpu.VMEM((1, D), jnp.float32),
                pltpu.SemaphoreType.DMA,
            ],
        )(logits, w)

    return fn


def _moe_args() -> tuple[Any, ...]:
    # token t prefers expert (3 t) mod E: the last expert is chosen (token 5)
    logits = np.zeros((DEVICES * T, E), np.float32)
    for t in range(DEVICES * T):
        logits[t, (3 * t) % E] = 1.0
    return logits, np.zeros((DEVICES * E, D), np.float32)


# ---------------------------------------------------- (b) jnp between the kernels

ROWS = 16


def gather_kernel(offs_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    """Grid step i copies row ``offs[i]`` of x to row i of the output."""
    i = pl.program_id(0)
    copy = pltpu.make_async_copy(  # fix: offsets_between_kernels_bug schedule_kernel_bug
        x_hbm.at[pl.ds(offs_ref[0, i], 1)], o_hbm.at[pl.ds(i, 1)], sem
    )
    copy.start()  # fix: offsets_between_kernels_bug schedule_kernel_bug
    copy.wait()


def _gather(offs: Any, x: Any) -> Any:
    return pl.pallas_call(
        gather_kernel,
        out_shape=jax.ShapeDtypeStruct((8, D), jnp.float32),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(8,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        ),
    )(offs, x)


def offsets_between_kernels(bug: bool = False) -> Any:
    def fn(scores: Any, x: Any) -> Any:
        _, best = lax.top_k(scores[0], 8)  # fix: offsets_between_kernels_abstract
        offs = jnp.sort(best).astype(jnp.int32).reshape(1, 8)
        if bug:
            offs = offs + 8  # fix: offsets_between_kernels_bug
        return _gather(offs, x)

    return fn


def _between_args() -> tuple[Any, ...]:
    scores = np.random.default_rng(0).standard_normal((DEVICES, ROWS)).astype(np.float32)
    return scores, np.zeros((DEVICES * ROWS, D), np.float32)


# ------------------------------------------------------- (c) an earlier kernel


def schedule_kernel(lens_ref: Any, offs_ref: Any, *, bug: bool) -> None:
    """Offsets of each step's row from the row lengths: an exclusive prefix sum."""
    lens = lens_ref[...]
    ends = jnp.cumsum(lens, axis=1)  # fix: schedule_kernel_abstract schedule_kernel_bug
    offs_ref[...] = ends if bug else ends - lens


def schedule_then_gather(bug: bool = False) -> Any:
    def fn(lens: Any, x: Any) -> Any:
        offs = pl.pallas_call(
            functools.partial(schedule_kernel, bug=bug),
            out_shape=jax.ShapeDtypeStruct((1, 8), jnp.int32),
        )(lens)
        return _gather(offs, x)

    return fn


def _schedule_args() -> tuple[Any, ...]:
    return np.ones((DEVICES, 8), np.int32), np.zeros((DEVICES * 8, D), np.float32)


# ---------------------------------------- (d) a VMEM vector reduced to a scalar


def counted_rows_kernel(mask_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any, *, bug: bool) -> None:
    """Copies as many rows as the mask has valid entries, all started, then waited."""
    n = jnp.sum(mask_ref[...])  # fix: counted_rows_abstract

    def copy(i: Any) -> Any:
        return pltpu.make_async_copy(x_hbm.at[pl.ds(i, 1)], o_hbm.at[pl.ds(i, 1)], sem)

    def start(i: Any, carry: Any) -> Any:
        copy(i).start()  # fix: counted_rows_bug
        return carry

    def wait(i: Any, carry: Any) -> Any:
        copy(i).wait()
        return carry

    lax.fori_loop(0, n, start, 0)
    lax.fori_loop(0, n - 1 if bug else n, wait, 0)  # fix: counted_rows_bug


def counted_rows(bug: bool = False) -> Any:
    def fn(mask: Any, x: Any) -> Any:
        return pl.pallas_call(
            functools.partial(counted_rows_kernel, bug=bug),
            out_shape=jax.ShapeDtypeStruct((ROWS, D), jnp.float32),
            in_specs=[
                pl.BlockSpec(memory_space=pltpu.VMEM),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            input_output_aliases={1: 0},
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(mask, x)

    return fn


def _counted_args() -> tuple[Any, ...]:
    mask = np.zeros((DEVICES, ROWS), np.int32)
    mask[0, :5] = 1
    mask[1, :11] = 1
    return mask, np.zeros((DEVICES * ROWS, D), np.float32)


# ---------------------------------------------------------------- the cases


def _case(
    name: str, provenance: str, make: Any, args: Any, op: str, arg: str, bug: Raises
) -> list[Case]:
    def build(bugged: bool, concrete: bool) -> Any:
        def program() -> Program:
            values = args()
            return Program(make(bugged), values if concrete else _shapes(values), ring(DEVICES))

        return program

    return [
        Case(name, "data_dependent", provenance, build(False, True), {"verify": OK}),
        Case(
            f"{name}_abstract",
            "data_dependent",
            provenance + "; its arguments given as shapes",
            build(False, False),
            {"verify": _refused(op, arg)},
        ),
        Case(
            f"{name}_bug",
            "data_dependent",
            provenance + "; seeded mistake",
            build(True, True),
            {"verify": bug},
            tags=frozenset({"bug"}),
        ),
    ]


_OOB = ("OutOfBounds", r"(?i)outside|out of")

CASES: list[Case] = [
    *_case(
        "moe_routing",
        "MoE top-1 routing table computed in VMEM, read as SMEM scalars by the copies",
        moe_routing,
        _moe_args,
        "argmax",
        "logits",
        Raises(_OOB[0], matches=(_OOB[1], r"\bw_hbm\b")),
    ),
    *_case(
        "offsets_between_kernels",
        "jnp top_k/sort under shard_map feeding a kernel's scalar prefetch",
        offsets_between_kernels,
        _between_args,
        "squeeze",
        "scores",
        Raises(_OOB[0], matches=(_OOB[1], r"\bx_hbm\b")),
    ),
    *_case(
        "schedule_kernel",
        "a schedule pallas_call's output as the main pallas_call's scalar prefetch",
        schedule_then_gather,
        _schedule_args,
        "cumsum",
        "lens",
        Raises(_OOB[0], matches=(_OOB[1], r"\bx_hbm\b")),
    ),
    *_case(
        "counted_rows",
        "a VMEM mask summed to the trip count of the copy loops",
        counted_rows,
        _counted_args,
        "reduce_sum",
        "mask",
        Raises(r"Leftover|Race", matches=(r"(?i)not back to zero|never waited|race", r"\bsem\b")),
    ),
]
