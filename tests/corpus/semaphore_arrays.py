"""N-D semaphore arrays and ref views: a semaphore chosen by index, per slot or per
device; ``reshape`` / ``bitcast`` views as copy operands; ``select_ref``.

* R5, a static index past the array, and an index per device that runs past it on
  devices 2 and 3 (written for this suite);
* copies on 2-D and 3-D arrays, signals on a 2-D REGULAR array, each with its raw twin;
  a row where one semaphore belongs and static indices outside the array, caught at
  trace time (jax itself lowers them);
* a ragged-paged-attention prefetch into a double buffer with ``sems.at[slot, page]``,
  copied out through a ``reshape`` + ``bitcast`` view;
* views whose shape or dtype differ from the other operand, and ``select_ref`` of refs
  and of semaphores;
* jax ops/tpu ragged paged attention, whose copies go through ref ``.reshape`` views.
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

import safedma as sd
from tests.corpus._blocks import ALL, AXIS, HBM, Pair, caught, sanitized
from tests.corpus._calls import local
from tests.corpus._case import OK, Case, Ok, Program, Raises, Unsupported

D = sd.DataRef

# ---------------------------------------------------------------- R5: semaphore index


def r5_static_pltpu(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """``sems`` holds two DMA semaphores; the bug's copy uses a third."""
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[2 if bug else 1])  # fix: r5_static
    c.start()  # fix: r5_static
    c.wait()  # fix: r5_static


def r5_static_safedma(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    sd.LocalCopy(x_ref, o_ref, sems.at[2 if bug else 1]).start().wait()  # fix: r5_static


def r5_per_device_pltpu(x_ref: Any, o_ref: Any, sems: Any, *, bug: bool) -> None:
    """The bug takes one semaphore per device index: out of range on devices 2 and 3."""
    me = lax.axis_index(AXIS)
    c = pltpu.make_async_copy(x_ref, o_ref, sems.at[me if bug else me % 2])  # fix: r5_per_device
    c.start()  # fix: r5_per_device
    c.wait()  # fix: r5_per_device


def r5_per_device_safedma(x_ref: D, o_ref: D, sems: sd.SemArray, *, bug: bool) -> None:
    me = sd.my_index(AXIS)
    slot = me if bug else me % 2
    sd.LocalCopy(x_ref, o_ref, sems.at[slot]).start().wait()  # fix: r5_per_device


PAIRS = (
    Pair(
        "r5_static",
        "R5",
        "silent",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        r5_static_safedma,
        r5_static_pltpu,
        caught(
            r"Range|Bounds|Index",
            r"(?i)out of (range|bounds)|outside",
            ALL,
            ("sems",),
            r"(?i)dma_semaphores\(3\)|index|semaphores",
        ),
        simulate_bug="KernelFailedError",
        sanitize_bug=sanitized("SemaphoreIndexError", ALL, ("sems",)),
        # A static index outside the array is rejected when the copy is described.
        trace_bug=Raises("^SemaphoreIndexError$", exact=True),
    ),
    Pair(
        "r5_per_device",
        "R5",
        "silent",
        lambda: [pltpu.SemaphoreType.DMA((2,))],
        r5_per_device_safedma,
        r5_per_device_pltpu,
        caught(
            r"Range|Bounds|Index",
            r"(?i)out of (range|bounds)|outside",
            ("x=2", "x=3"),
            ("sems",),
            r"(?i)dma_semaphores\(4\)|index|semaphores",
        ),
        simulate_bug="KernelFailedError",
        sanitize_bug=sanitized("SemaphoreIndexError", ("x=2", "x=3"), ("sems",)),
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("semaphore_arrays")]


# ---------------------------------------------------------------- N-D arrays


def two_d(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray2) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], sems.at[1, 2]).start().wait()
    sd.LocalCopy(x.at[pl.ds(16, 16)], o.at[pl.ds(16, 16)], sems.at[i % 2].at[0]).start().wait()


def two_d_raw(x: Any, o: Any, sems: Any) -> None:
    i = pl.program_id(0)
    c = pltpu.make_async_copy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], sems.at[1, 2])
    c.start()
    c.wait()
    c = pltpu.make_async_copy(x.at[pl.ds(16, 16)], o.at[pl.ds(16, 16)], sems.at[i % 2].at[0])
    c.start()
    c.wait()


def three_d(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray3, flags: sd.RegularSemArray2) -> None:
    sd.LocalCopy(x, o, sems.at[1, 0, 3]).start().wait()
    sd.signal(flags.at[1, 1])
    sd.wait(flags.at[1, 1])


def three_d_raw(x: Any, o: Any, sems: Any, flags: Any) -> None:
    c = pltpu.make_async_copy(x, o, sems.at[1, 0, 3])
    c.start()
    c.wait()
    pl.semaphore_signal(flags.at[1, 1], 1)
    pl.semaphore_wait(flags.at[1, 1], 1)


def a_row_for_one_semaphore(x: Any, o: Any, sems: Any) -> None:
    sd.LocalCopy(x, o, sems.at[1]).start().wait()  # fix: a_row_of_a_2d_array_for_one_semaphore


def outside(select: Any) -> Any:
    def kernel(x: Any, o: Any, sems: Any) -> None:
        sd.LocalCopy(x, o, select(sems)).start().wait()

    return kernel


def raw_outside(x: Any, o: Any, sems: Any) -> None:
    c = pltpu.make_async_copy(x, o, sems.at[1, 3])
    c.start()
    c.wait()


def traced_indices(x: Any, o: Any, sems: Any, flags: Any) -> None:
    i = pl.program_id(0)
    sd.LocalCopy(x, o, sems.at[i, i + 5]).start().wait()
    sd.signal(flags.at[i, 1])
    sd.wait(flags.at[i, 1])


def signal_outside(x: Any, o: Any, flags: Any) -> None:
    sd.signal(flags.at[0, 2])  # fix: signal_outside_a_2d_regular_array


# ---------------------------------------------------------------- ref views


def views(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x.reshape(16, 256), buf.bitcast(jnp.float32), sem).start().wait()
    sd.LocalCopy(buf, o.bitcast(jnp.int32).reshape(16, 256), sem).start().wait()
    half = x.at[pl.ds(0, 16)].reshape(8, 256)
    sd.LocalCopy(half, buf.bitcast(jnp.float32).at[pl.ds(0, 8)], sem).start().wait()


def views_raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
    for src, dst in [
        (x.reshape(16, 256), buf.bitcast(jnp.float32)),
        (buf, o.bitcast(jnp.int32).reshape(16, 256)),
        (x.at[pl.ds(0, 16)].reshape(8, 256), buf.bitcast(jnp.float32).at[pl.ds(0, 8)]),
    ]:
        c = pltpu.make_async_copy(src, dst, sem)
        c.start()
        c.wait()


def view_of_another_shape(x: Any, o: Any, buf: Any, sem: Any) -> None:
    sd.LocalCopy(x.reshape(16, 256), buf, sem).start().wait()  # fix: view_of_another_shape


def bitcast_of_another_dtype(x: Any, o: Any, buf: Any, sem: Any) -> None:
    sd.LocalCopy(x.bitcast(jnp.int32), buf, sem).start().wait()  # fix: bitcast_of_another_dtype


def views_of_the_right_size(x: Any, o: Any, buf: Any, sem: Any) -> None:
    sd.LocalCopy(x.reshape(64, 64).bitcast(jnp.uint32), buf, sem).start().wait()
    sd.LocalCopy(buf.bitcast(jnp.float32).reshape(32, 128), o, sem).start().wait()


# ---------------------------------------------------------------- select_ref


def select(x: sd.DataRef, o: sd.DataRef, a: sd.DataRef, b: sd.DataRef, sems: sd.SemArray) -> None:
    i = pl.program_id(0) % 2
    buf = sd.select_ref(i, a, b)
    sem = sd.select_ref(i, sems.at[0], sems.at[1])
    sd.LocalCopy(x, buf, sem).start().wait()


def select_raw(x: Any, o: Any, a: Any, b: Any, sems: Any) -> None:
    i = pl.program_id(0) % 2
    buf = pl.select_ref(i, a, b)
    sem = pl.select_ref(i, sems.at[0], sems.at[1])
    c = pltpu.make_async_copy(x, buf, sem)
    c.start()
    c.wait()


def select_of_mixed_kinds(x: Any, o: Any, a: Any, sem: Any) -> None:
    sd.select_ref(pl.program_id(0), a, sem)  # fix: select_ref_of_mixed_kinds


def select_of_two_shapes(x: Any, o: Any, a: Any, b: Any) -> None:
    sd.select_ref(pl.program_id(0), a, b)  # fix: select_ref_of_two_shapes


# ---------------------------------------------------------------- ragged paged attention

PAGES = 4  # pages per step
PAGE_ROWS = 8
LANES = 128


def rpa_prefetch(
    table_smem: sd.DataRef,
    pages_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    buf: sd.DataRef,
    sems: sd.SemArray2,
    out_sem: sd.SemRef,
) -> None:
    """A grid-step prefetch of pages into a double buffer with a 2-D semaphore array
    ``sems.at[slot, page]``, the result copied out through a ``reshape`` + ``bitcast``
    view."""
    step = pl.program_id(0)
    steps = pl.num_programs(0)

    def fetch(s: jax.Array | int, slot: jax.Array | int) -> None:
        for p in range(PAGES):
            page = table_smem[s * PAGES + p]
            sd.LocalCopy(pages_hbm.at[page], buf.at[slot, p], sems.at[slot, p]).start()

    @pl.when(step == 0)
    def _() -> None:
        fetch(0, 0)

    @pl.when(step + 1 < steps)
    def _() -> None:
        fetch(step + 1, (step + 1) % 2)

    slot = step % 2
    for p in range(PAGES):
        # Started in the previous step (or above, for step 0).
        sd.LocalCopy(pages_hbm.at[0], buf.at[slot, p], sems.at[slot, p]).started_elsewhere().wait()
    flat = buf.reshape(2, PAGES * PAGE_ROWS, LANES).at[slot].bitcast(jnp.uint32)
    sd.LocalCopy(flat, o_hbm.at[step], out_sem).start().wait()


def rpa_prefetch_raw(
    table_smem: Any, pages_hbm: Any, o_hbm: Any, buf: Any, sems: Any, out_sem: Any
) -> None:
    step = pl.program_id(0)
    steps = pl.num_programs(0)

    def fetch(s: Any, slot: Any) -> None:
        for p in range(PAGES):
            page = table_smem[s * PAGES + p]
            pltpu.make_async_copy(pages_hbm.at[page], buf.at[slot, p], sems.at[slot, p]).start()

    @pl.when(step == 0)
    def _() -> None:
        fetch(0, 0)

    @pl.when(step + 1 < steps)
    def _() -> None:
        fetch(step + 1, (step + 1) % 2)

    slot = step % 2
    for p in range(PAGES):
        pltpu.make_async_copy(pages_hbm.at[0], buf.at[slot, p], sems.at[slot, p]).wait()
    flat = buf.reshape(2, PAGES * PAGE_ROWS, LANES).at[slot].bitcast(jnp.uint32)
    out = pltpu.make_async_copy(flat, o_hbm.at[step], out_sem)
    out.start()
    out.wait()


RPA_STEPS, RPA_NUM_PAGES = 3, 16


def rpa_program(safe: bool) -> Program:
    kernel = rpa_prefetch if safe else rpa_prefetch_raw
    scratch = (
        [
            sd.vmem((2, PAGES, PAGE_ROWS, LANES), jnp.float32),
            sd.dma_semaphores((2, PAGES)),
            sd.dma_semaphore(),
        ]
        if safe
        else [
            pltpu.VMEM((2, PAGES, PAGE_ROWS, LANES), jnp.float32),
            pltpu.SemaphoreType.DMA((2, PAGES)),
            pltpu.SemaphoreType.DMA(()),
        ]
    )
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(RPA_STEPS,),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=scratch,
    )
    pallas = sd.pallas_call if safe else pl.pallas_call

    def run(table: jax.Array, pages: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct((RPA_STEPS, PAGES * PAGE_ROWS, LANES), jnp.uint32)
        result: jax.Array = pallas(kernel, out_shape=out, grid_spec=grid_spec)(table, pages)
        return result

    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.integers(0, RPA_NUM_PAGES, RPA_STEPS * PAGES), jnp.int32)
    pages = jax.ShapeDtypeStruct((RPA_NUM_PAGES, PAGE_ROWS, LANES), jnp.float32)
    return Program(run, (table, pages))


_DMA_2x3 = [sd.dma_semaphores((2, 3))]
_IN_KERNEL = "written for this suite"


def _outside_case(name: str, select: Any, index: str) -> Case:
    return Case(
        f"static_index_outside_a_2d_array_{name}",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(outside(select), _DMA_2x3),
        {
            "trace": Raises(
                "^SemaphoreIndexError$",
                says=(index, "sems", "(2, 3)", "Wrap the index"),
                line=False,
            )
        },
    )


CASES += [
    Case(
        "rpa_prefetch_into_a_2d_semaphore_array",
        "semaphore_arrays",
        "jax ops/tpu ragged paged attention (the prefetch and its views), written for this suite",
        lambda: rpa_program(True),
        {"mosaic": OK, "verify": Ok(report={"dmas": 15, "waits": 15})},
        twin=lambda: rpa_program(False),
    ),
    Case(
        "copies_on_a_2d_array",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(two_d, _DMA_2x3, grid=(2,)),
        {"mosaic": OK},
        twin=lambda: local(two_d_raw, [pltpu.SemaphoreType.DMA((2, 3))], checked=False, grid=(2,)),
    ),
    Case(
        "copies_on_a_3d_array_and_signals_on_a_2d_regular_array",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(three_d, [sd.dma_semaphores((2, 2, 4)), sd.regular_semaphores((2, 2))]),
        {"mosaic": OK},
        twin=lambda: local(
            three_d_raw,
            [pltpu.SemaphoreType.DMA((2, 2, 4)), pltpu.SemaphoreType.REGULAR((2, 2))],
            checked=False,
        ),
    ),
    Case(
        "a_row_of_a_2d_array_for_one_semaphore",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(a_row_for_one_semaphore, _DMA_2x3),
        {
            "trace": Raises(
                "^SemaphoreShapeError$",
                says=("sems.at[1, pl.ds(0, 3)]", "shape (2, 3)", "Select one with sems.at[i, j]"),
                line=False,
            )
        },
    ),
    _outside_case("column", lambda s: s.at[1, 3], "index 3"),
    _outside_case("row", lambda s: s.at[2, 0], "index 2"),
    _outside_case("negative", lambda s: s.at[-1, 0], "index -1"),
    _outside_case("chained", lambda s: s.at[1].at[5], "index 5"),
    # The check adds something: jax alone lowers the raw kernel with the bad index.
    Case(
        "raw_static_index_outside_a_2d_array",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(raw_outside, [pltpu.SemaphoreType.DMA((2, 3))], checked=False),
        {"trace": OK},
    ),
    Case(
        "traced_indices_into_2d_arrays",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(traced_indices, [*_DMA_2x3, sd.regular_semaphores((2, 2))], grid=(2,)),
        {"trace": OK},
    ),
    Case(
        "signal_outside_a_2d_regular_array",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(signal_outside, [sd.regular_semaphores((2, 2))]),
        {"trace": Raises("^SemaphoreIndexError$", says=("signal",), line=False)},
    ),
    Case(
        "reshape_and_bitcast_views",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(views, [sd.vmem((16, 256), jnp.int32), sd.dma_semaphore()]),
        {"mosaic": OK},
        twin=lambda: local(
            views_raw,
            [pltpu.VMEM((16, 256), jnp.int32), pltpu.SemaphoreType.DMA(())],
            checked=False,
        ),
    ),
    Case(
        "view_of_another_shape",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(view_of_another_shape, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]),
        {"trace": Raises("^CopyShapeMismatchError$", says=("(16, 256)", "(32, 128)"), line=False)},
    ),
    Case(
        "bitcast_of_another_dtype",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(
            bitcast_of_another_dtype, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]
        ),
        {"trace": Raises("^CopyDtypeMismatchError$", says=("int32", "float32"), line=False)},
    ),
    Case(
        "views_of_the_right_size",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(views_of_the_right_size, [sd.vmem((64, 64), jnp.uint32), sd.dma_semaphore()]),
        {"trace": OK},
    ),
    Case(
        "select_ref_of_refs_and_semaphores",
        "semaphore_arrays",
        "jax's Pallas TPU tests (pl.select_ref), written for this suite",
        lambda: local(
            select,
            [
                sd.vmem((32, 128), jnp.float32),
                sd.vmem((32, 128), jnp.float32),
                sd.dma_semaphores(2),
            ],
            grid=(2,),
        ),
        {"mosaic": OK},
        twin=lambda: local(
            select_raw,
            [
                pltpu.VMEM((32, 128), jnp.float32),
                pltpu.VMEM((32, 128), jnp.float32),
                pltpu.SemaphoreType.DMA((2,)),
            ],
            checked=False,
            grid=(2,),
        ),
    ),
    Case(
        "select_ref_of_mixed_kinds",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(
            select_of_mixed_kinds, [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()], grid=(2,)
        ),
        {"trace": Raises("^SemaphoreKindError$", says=("one kind",), line=False)},
    ),
    Case(
        "select_ref_of_two_shapes",
        "semaphore_arrays",
        _IN_KERNEL,
        lambda: local(
            select_of_two_shapes,
            [sd.vmem((32, 128), jnp.float32), sd.vmem((8, 128), jnp.float32)],
            grid=(2,),
        ),
        {"trace": Raises("^CopyShapeMismatchError$", says=("one shape",), line=False)},
    ),
]


# ---------------------------------------------------------------- jax's ragged paged attention


def ragged_paged_attention_inputs() -> tuple[jax.Array, ...]:
    """q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs: 2 sequences of 8 queries."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((16, 8, 128)), jnp.float32)
    kv = jnp.asarray(rng.standard_normal((8, 16, 2, 128)), jnp.float32)
    kv_lens = jnp.array([20, 40], jnp.int32)
    indices = jnp.array([[3, 1, 0, 5], [2, 4, 6, 7]], jnp.int32)
    cu_q_lens = jnp.array([0, 8, 16], jnp.int32)
    num_seqs = jnp.array([2], jnp.int32)
    return q, kv, kv_lens, indices, cu_q_lens, num_seqs


def ragged_paged_attention_module() -> Any:
    import importlib

    return importlib.import_module("jax.experimental.pallas.ops.tpu.ragged_paged_attention.kernel")


def ragged_paged_attention() -> Program:
    from tests.corpus._seeding import unjitted

    fn = functools.partial(
        unjitted(ragged_paged_attention_module().ragged_paged_attention),
        num_kv_pages_per_block=2,
        num_queries_per_block=8,
    )
    return Program(fn, ragged_paged_attention_inputs())


def _copies_each_waited(report: Any, program: Program) -> None:
    """Its copies are proved, and waited (some waits cover several copies)."""
    assert report.dmas > 0 and 0 < report.waits <= report.dmas, report


CASES += [
    # Its copies go through ref .reshape views, which jax's interpreter cannot run.
    Case(
        "jax_ragged_paged_attention",
        "semaphore_arrays",
        "jax ops/tpu ragged_paged_attention",
        ragged_paged_attention,
        {
            "verify": Ok(check=_copies_each_waited),
            "simulate": Unsupported(r"construct it does not implement"),
        },
        slow=("simulate",),
    ),
]
