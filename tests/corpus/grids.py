"""Grids, block specs and scalar prefetch: data moved by Pallas's own block copies, page
tables prefetched into SMEM, grids whose size comes from data.

* every kernel jax ships that moves data only through BlockSpecs (jax ops/tpu: the
  example kernel, matmul, flash and splash attention forward and backward, megablox
  grouped matmuls, threefry and philox): verify proves no block access races with the
  pipeline's copies (no DMA of their own);
* a grouped matmul whose grid comes from group sizes verify does not know: refused,
  naming what is missing;
* jax ops/tpu paged attention (page gathers driven by a scalar-prefetched page table),
  small;
* an output block picked through a scalar-prefetch table and written at its last step
  (ragged paged attention's layout), and a sparse grid whose output index map skips
  blocks (jax's block-sparse guide): the blocks never copied out are garbage;
* a cross-step prefetch chain in a grid whose first dimension is "parallel";
* a look-ahead into a scalar-prefetched table that reads one past its end (pytorch/xla's
  paged attention; a non-short-circuit ``logical_and``), and its clamped twin.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.corpus._case import NOTHING_TO_CHECK, OK, Case, Ok, Program, Raises, Unsupported
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
            # jax's kernels with no DMA of their own: their grid's pipeline copies are
            # made when it is lowered, out of the sanitizer's sight; they run clean.
            {"verify": Ok(check=_no_dma_of_their_own), "sanitize": NOTHING_TO_CHECK},
            slow=("verify", "sanitize") if name in SLOW else (),
        )
        for name, build in BLOCKSPEC_KERNELS.items()
    ),
    Case(
        "jax_megablox_tgmm_with_unknown_group_sizes",
        "grids",
        f"{JAX_OPS} megablox tgmm",
        lambda: _gmm(True, jax.ShapeDtypeStruct((4,), jnp.int32)),
        {
            "sanitize": NOTHING_TO_CHECK,
            "verify": Unsupported(r"dynamic grid(.|\n)*gmm\.py|gmm\.py(.|\n)*dynamic grid"),
        },
    ),
    Case(
        "jax_paged_attention",
        "grids",
        f"{JAX_OPS} paged_attention",
        paged_attention,
        {"sanitize": OK, "verify": Ok(check=_copies_each_waited)},
    ),
]


# ---------------------------------------------------------------- output blocks from a prefetch table


def tiled_sum(write_last: bool) -> Any:
    """Sum the kv blocks of each logical tile into the output tile the table names.

    Grid (logical tile, kv block); ``tile_of[t]`` is the physical output tile of
    logical tile t (two logical tiles share tile 0). The output is written once,
    at the last kv block of the last logical tile on it, from a VMEM accumulator:
    the ragged paged attention layout (torch_xla, megablox metadata). Pallas copies
    the block out only when the index map's answer changes, which verify computes
    with the table. Seeded: written at logical tile 0 only, so tile 1 is garbage.
    """

    def kernel(tile_of: Any, x_ref: Any, o_ref: Any, acc: Any) -> None:
        t, k = pl.program_id(0), pl.program_id(1)
        nt, nk = pl.num_programs(0), pl.num_programs(1)

        @pl.when(k == 0)
        def _() -> None:
            acc[...] = jnp.zeros_like(acc)

        acc[...] += x_ref[...]
        nxt = jnp.minimum(t + 1, nt - 1)
        leaving = jnp.logical_or(t == nt - 1, tile_of[t] != tile_of[nxt])

        @pl.when(  # fix: output_tile_from_a_prefetch_table_never_written
            jnp.logical_and(k == nk - 1, leaving if write_last else t == 0)
        )
        def _() -> None:
            o_ref[...] = acc[...]

    def fn(tile_of: Any, x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(3, 2),
                in_specs=[pl.BlockSpec((8, 128), lambda t, k, tile_of: (t, k))],
                out_specs=pl.BlockSpec((8, 128), lambda t, k, tile_of: (tile_of[t], 0)),
                scratch_shapes=[pltpu.VMEM((8, 128), F32)],
            ),
            out_shape=jax.ShapeDtypeStruct((16, 128), F32),
        )(tile_of, x)

    return fn


TILE_OF = np.array([0, 0, 1], np.int32)


# ---------------------------------------------------------------- a prefetch chain across a grid axis


GRID_HANG = Raises(
    "DeadlockError",
    exact=True,
    matches=(r"^\[safedma sanitizer\] hang", r"at grid step \(1, 0\)", r"grids\.py:\d+"),
    one_of=(("sems",),),
    line=False,
)
"""The sanitizer's verdict on a prefetch chain that is not started in the second slice."""


def chained_fetch(start_each_slice: bool, semantics: str) -> Any:
    """Grid (2, 3): each step waits the copy of its row block and prefetches the next
    step's into the other slot. The chain starts at step (0, 0) only, or at the first
    step of every slice of the first grid dimension (axlearn's paged attention in
    megacore mode, grid ``(num_cores, ...)``). verify runs the grid in order on one
    core, where a chain started only at the very first step deadlocks; for a
    "parallel" first dimension the deadlock says a megacore split is not modelled."""

    def kernel(x_hbm: Any, o_ref: Any, buf: Any, sems: Any) -> None:
        c, j = pl.program_id(0), pl.program_id(1)
        step = c * 3 + j

        def fetch(s: Any) -> Any:
            return pltpu.make_async_copy(x_hbm.at[pl.ds(s * 8, 8)], buf.at[s % 2], sems.at[s % 2])

        first = (  # fix: prefetch_chain_across_an_arbitrary_axis
            j == 0 if start_each_slice else step == 0
        )

        @pl.when(first)
        def _() -> None:
            fetch(step).start()

        @pl.when(j < 2)
        def _() -> None:
            fetch(step + 1).start()

        fetch(step).wait()  # fix: prefetch_chain_across_a_parallel_axis
        o_ref[...] = buf[step % 2]

    return pl.pallas_call(
        kernel,
        grid=(2, 3),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((8, 128), lambda c, j: (c * 3 + j, 0)),
        out_shape=jax.ShapeDtypeStruct((48, 128), F32),
        scratch_shapes=[pltpu.VMEM((2, 8, 128), F32), pltpu.SemaphoreType.DMA((2,))],
        compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics, "arbitrary")),
    )


# ---------------------------------------------------------------- a sparse grid


def sparse_rows(alias: bool) -> Any:
    """Copy the row blocks ``rows[b]`` of x into the same rows of the output, one grid
    step per listed block; the other row blocks are never visited (jax's block-sparse
    guide): they are garbage unless the output is aliased to an input (the guide
    aliases a zeros array for this reason)."""

    def kernel(rows: Any, x_ref: Any, zeros_ref: Any, o_ref: Any) -> None:
        del rows, zeros_ref
        o_ref[...] = x_ref[...]

    def fn(rows: Any, x: Any, zeros: Any) -> Any:
        spec = pl.BlockSpec((8, 128), lambda b, rows: (rows[b], 0))
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(2,), in_specs=[spec, spec], out_specs=spec
            ),
            out_shape=jax.ShapeDtypeStruct((32, 128), F32),
            input_output_aliases=(  # fix: sparse_grid_output_blocks_never_visited
                {2: 0} if alias else {}
            ),
        )(rows, x, zeros)

    return fn


def sparse_rows_read_where_visited(rows: Any, x: Any, zeros: Any) -> Any:
    out = sparse_rows(alias=False)(rows, x, zeros)
    return out[24:]  # one visited block (reads are bounded by one box)


ROWS = np.array([0, 3], np.int32)


def _one_kernel_no_dma(name: str) -> Ok:
    """Proved over the kernel's Pallas block copies alone."""
    return Ok(report={"kernels": (name,), "dmas": 0})


CASES += [
    Case(
        "output_tile_from_a_prefetch_table_written_at_its_last_step",
        "grids",
        "ragged paged attention's output layout (torch_xla, megablox metadata), written for this suite",
        lambda: Program(tiled_sum(write_last=True), (TILE_OF, _s(24, 256))),
        {"sanitize": NOTHING_TO_CHECK, "verify": _one_kernel_no_dma("kernel")},
    ),
    # Tile 1 (logical tile 2) is never written: its copy-out is garbage.
    Case(
        "output_tile_from_a_prefetch_table_never_written",
        "grids",
        "ragged paged attention's output layout (torch_xla, megablox metadata), written for this suite",
        lambda: Program(tiled_sum(write_last=False), (TILE_OF, _s(24, 256))),
        {
            "verify": Raises(
                "^UnwrittenReadError$",
                matches=(r"o_ref\[8:16, 0:128\]|o_ref\[0:8, 0:128\]",),
            )
        },
    ),
    Case(
        "prefetch_chain_started_in_every_parallel_slice",
        "grids",
        "axlearn paged attention in megacore mode, written for this suite",
        lambda: Program(chained_fetch(True, "parallel"), (_s(48, 128),)),
        {"sanitize": OK, "verify": Ok(report={"kernels": ("kernel",), "dmas": 6, "waits": 6})},
    ),
    Case(
        "prefetch_chain_across_a_parallel_axis",
        "grids",
        "axlearn paged attention in megacore mode, written for this suite",
        lambda: Program(chained_fetch(False, "parallel"), (_s(48, 128),)),
        {
            "verify": Raises("^DeadlockError$", matches=(r"(?s)grids\.py:\d+.*megacore",)),
            # Run in grid order (one TensorCore, as on a v5e): step (1, 0) waits a copy
            # nothing started.
            "sanitize": GRID_HANG,
        },
    ),
    # File paths may contain the word (a checkout named after it): only the note counts.
    Case(
        "prefetch_chain_across_an_arbitrary_axis",
        "grids",
        "written for this suite",
        lambda: Program(chained_fetch(False, "arbitrary"), (_s(48, 128),)),
        {
            "verify": Raises("^DeadlockError$", absent=("Note:",), line=False),
            "sanitize": GRID_HANG,
        },
    ),
    Case(
        "sparse_grid_over_an_aliased_output",
        "grids",
        "jax Pallas block-sparse guide, written for this suite",
        lambda: Program(sparse_rows(alias=True), (ROWS, _s(32, 128), _s(32, 128))),
        {"sanitize": NOTHING_TO_CHECK, "verify": _one_kernel_no_dma("kernel")},
    ),
    Case(
        "sparse_grid_output_blocks_never_visited",
        "grids",
        "jax Pallas block-sparse guide, written for this suite",
        lambda: Program(sparse_rows(alias=False), (ROWS, _s(32, 128), _s(32, 128))),
        {"verify": Raises("^UnwrittenReadError$", matches=(r"o_ref\[8:24, 0:128\]",), line=False)},
    ),
    Case(
        "sparse_grid_output_read_only_where_visited",
        "grids",
        "jax Pallas block-sparse guide, written for this suite",
        lambda: Program(sparse_rows_read_where_visited, (ROWS, _s(32, 128), _s(32, 128))),
        {"sanitize": NOTHING_TO_CHECK, "verify": _one_kernel_no_dma("kernel")},
    ),
]


# ---------------------------------------------------------------- a table read one past its end

LOOK_ROWS = 8


def next_nonempty(lengths: Any, x_ref: Any, o_ref: Any, buf: Any, sem: Any, *, clamp: bool) -> None:
    # pytorch/xla paged attention's look-ahead: `jnp.logical_and(nxt < n, lengths[nxt] == 0)`
    # evaluates both sides, so the last step reads lengths[n]: an SMEM read past
    # the table (on a TPU it reads whatever follows it). The clamped twin is clean.
    i = pl.program_id(0)
    n = lengths.shape[0]
    nxt = i + 1
    index = jnp.minimum(nxt, n - 1) if clamp else nxt  # fix: look_ahead_past_the_table
    skip = jnp.logical_and(nxt < n, lengths[index] == 0)
    copy = pltpu.make_async_copy(x_ref.at[pl.ds(i * LOOK_ROWS, LOOK_ROWS)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] + jnp.where(skip, 1.0, 0.0)


def next_nonempty_program(clamp: bool) -> Program:
    def kernel(*refs: Any) -> None:
        next_nonempty(*refs, clamp=clamp)

    def call(lengths: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, F32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(lengths.shape[0],),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec((LOOK_ROWS, 128), lambda i, lengths: (i, 0)),
                scratch_shapes=[pltpu.VMEM((LOOK_ROWS, 128), F32), pltpu.SemaphoreType.DMA],
            ),
        )(lengths, x)
        return out

    x = jnp.arange(3 * LOOK_ROWS * 128, dtype=F32).reshape(3 * LOOK_ROWS, 128)
    return Program(call, (jnp.asarray([3, 0, 5], jnp.int32), x))


def _step_0_skips(out: Any, program: Program) -> None:
    x = np.asarray(program.args[1])
    expected = x.copy()
    expected[:LOOK_ROWS] += 1.0  # step 0: the next entry (1) is empty
    np.testing.assert_array_equal(np.asarray(out), expected)


def _the_look_ahead_line(error: BaseException) -> None:
    from tests.support.simulation import line_of

    message = str(error)
    assert line_of(next_nonempty, "skip = jnp.logical_and") in message, message
    assert "Out-of-bounds read" in message, message


CASES += [
    Case(
        "look_ahead_clamped_to_the_table",
        "grids",
        "pytorch/xla paged attention, written for this suite",
        lambda: next_nonempty_program(True),
        {"sanitize": OK, "simulate": Ok(check=_step_0_skips)},
    ),
    Case(
        "look_ahead_past_the_table",
        "grids",
        "pytorch/xla paged attention, written for this suite",
        lambda: next_nonempty_program(False),
        {"simulate": Raises("^KernelFailedError$", line=False, check=_the_look_ahead_line)},
    ),
]
