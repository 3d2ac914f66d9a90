"""The catalogue's DMA mistakes as raw pltpu kernels one TPU chip can run, each with its fix.

Each :class:`ChipCase` is one row of docs/catalogue.md written the way a
raw-pltpu author would write the mistake (``bug``) and the correct kernel
(``fix``), both copying a ``(rows, 128)`` float32 array from HBM to an HBM
output of the same shape, so the reference output is always the input.
``benchmarks/chip_mistakes.py`` runs them on a chip (each risky case in a
process of its own, under a timeout) and records what the chip does;
``safedma_spelling`` is the same mistake written with safedma, traced on the
CPU to show where safedma stops it.

The data cases copy a few MiB, so a read that races a copy reads memory the
copy has not reached yet; every call gets distinct input values, so a value
left in VMEM by an earlier call counts as wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

LANES = 128
F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
TILE = 8  # rows of a float32 VMEM tile

Fn = Callable[[jax.Array], jax.Array]


# ---------------------------------------------------------------- what a run can show

TRACE_ERROR = "trace error"
LOWERING_ERROR = "lowering error"
COMPILE_ERROR = "compile error"
HANG = "hang"
CRASH = "crash"
WRONG = "wrong data"
RIGHT = "right"
RIGHT_BY_LUCK = "right by luck"
OUTCOMES = (TRACE_ERROR, LOWERING_ERROR, COMPILE_ERROR, HANG, CRASH, WRONG, RIGHT, RIGHT_BY_LUCK)
# The most telling outcome first: a bug run at several sizes is summed up by the first seen.
SEVERITY = (CRASH, HANG, WRONG, COMPILE_ERROR, LOWERING_ERROR, TRACE_ERROR, RIGHT, RIGHT_BY_LUCK)
RAN = frozenset({WRONG, RIGHT_BY_LUCK})  # a race: the catalogue promises no error, only risk


@dataclasses.dataclass(frozen=True)
class ChipCase:
    """One catalogue row on one chip.

    ``build(variant, rows)`` returns the single-device function for
    ``variant`` ``"bug"`` or ``"fix"``. ``bug_rows`` are the sizes the bug
    runs at (``rows`` of 128 float32 lanes), ``trials`` the calls per size.
    ``alone``: the bug may hang, crash or leave the chip's semaphores
    non-zero, so it gets a process of its own. ``catalogue_says``: the
    outcomes docs/catalogue.md predicts for raw pltpu on a TPU.
    ``safedma_spelling(rows)``: the same mistake written with safedma (None
    where safedma's types leave no way to write it); ``safedma_static``: what
    the type checkers say, from the type-test corpus.
    """

    name: str
    row: str
    title: str
    mistake: str
    build: Callable[[str, int], Fn]
    bug_rows: tuple[int, ...]
    catalogue_says: frozenset[str]
    alone: bool = False
    trials: int = 3
    safedma_spelling: Callable[[int], Fn] | None = None
    safedma_static: str = "-"
    lane_only: bool = False  # not a catalogue row: a pattern the TPU lane checks this way

    @property
    def fix_rows(self) -> int:
        return self.bug_rows[0]


def example(rows: int, call: int = 0) -> np.ndarray:
    """Distinct values per element and per call (exact in float32 for call < 16)."""
    base = np.arange(rows * LANES, dtype=np.float32).reshape(rows, LANES)
    return base + np.float32(call * 2**20)


def wrong_fraction(out: np.ndarray, want: np.ndarray) -> float:
    """Elements whose bits differ from the reference (a NaN counts as wrong)."""
    got = np.asarray(out)
    if got.shape != want.shape or got.dtype.itemsize != want.dtype.itemsize:
        return 1.0
    bad = got.view(np.uint32) != want.view(np.uint32)
    return float(np.count_nonzero(bad)) / want.size


# ---------------------------------------------------------------- building blocks


def _call(kernel: Callable[..., None], scratch: Sequence[Any], **options: Any) -> Fn:
    def run(x: jax.Array) -> jax.Array:
        result: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=list(scratch),
            name=getattr(kernel, "__name__", "kernel"),
            **options,
        )(x)
        return result

    run.__name__ = getattr(kernel, "__name__", "kernel")
    return run


def _sd_call(kernel: Callable[..., None], scratch: Sequence[Any]) -> Fn:
    def run(x: jax.Array) -> jax.Array:
        return sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=list(scratch),
        )(x)

    run.__name__ = kernel.__name__
    return run


def vector_copy(src: Any, dst: Any) -> None:
    """``dst[...] = src[...]`` one VMEM tile at a time (a vector read of every row)."""

    def tile(i: jax.Array, carry: None) -> None:
        r = pl.multiple_of(i * TILE, TILE)
        dst[pl.ds(r, TILE), :] = src[pl.ds(r, TILE), :]
        return carry

    lax.fori_loop(0, src.shape[0] // TILE, tile, None)


def _copy(src: Any, dst: Any, sem: Any) -> None:
    c = pltpu.make_async_copy(src, dst, sem)
    c.start()
    c.wait()


def _vmem(rows: int) -> Any:
    return pltpu.VMEM((rows, LANES), F32)


def _halves(rows: int) -> Any:
    return pltpu.VMEM((2, rows // 2, LANES), F32)


DMA = pltpu.SemaphoreType.DMA
REGULAR = pltpu.SemaphoreType.REGULAR


# ---------------------------------------------------------------- S2: array for one semaphore


def _s2(variant: str, rows: int) -> Fn:
    def s2_semaphore_array_waited(x: Any, o: Any, sems: Any) -> None:
        pltpu.make_async_copy(x, o, sems.at[0]).start()
        waited = sems if variant == "bug" else sems.at[0]  # the bug forgot .at[0]
        pltpu.make_async_copy(x, o, waited).wait()

    return _call(s2_semaphore_array_waited, [DMA((2,))])


def _s2_sd(rows: int) -> Fn:
    def s2_semaphore_array_waited(x: sd.DataRef, o: sd.DataRef, sems: Any) -> None:
        sd.LocalCopy(x, o, sems.at[0]).start()
        sd.LocalCopy(x, o, sems).started_elsewhere().wait()

    return _sd_call(s2_semaphore_array_waited, [sd.dma_semaphores(2)])


# ---------------------------------------------------------------- S3: REGULAR semaphore for a DMA


def _s3(variant: str, rows: int) -> Fn:
    def s3_dma_on_regular_semaphore(x: Any, o: Any, sem: Any) -> None:
        pltpu.make_async_copy(x, o, sem).start()
        if variant == "bug":  # counted as one copy, as a TPU v6 counts it
            pl.semaphore_wait(sem, 1)
        else:
            pltpu.make_async_copy(x, o, sem).wait()

    return _call(s3_dma_on_regular_semaphore, [REGULAR if variant == "bug" else DMA])


def _s3_sd(rows: int) -> Fn:
    def s3_dma_on_regular_semaphore(x: sd.DataRef, o: sd.DataRef, flag: Any) -> None:
        sd.LocalCopy(x, o, flag).start().wait()

    return _sd_call(s3_dma_on_regular_semaphore, [sd.regular_semaphore()])


def _counted(variant: str, rows: int) -> Fn:
    """safedma's CountedCopy (a DMA that adds 1 to a REGULAR semaphore; TPU v6 and later);
    the control (``fix``) makes the same two copies on a DMA semaphore."""
    half = rows // 2
    first, second = pl.ds(0, half), pl.ds(half, half)

    def counted_copies(x: sd.DataRef, o: sd.DataRef, flag: sd.RegularSem) -> None:
        sd.CountedCopy(x.at[first], o.at[first], flag).start().wait()
        sd.CountedCopy(x.at[second], o.at[second], flag).start()
        sd.wait_counted(flag, 1)

    def same_copies_on_a_dma_semaphore(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x.at[first], o.at[first], sem).start().wait()
        sd.LocalCopy(x.at[second], o.at[second], sem).start().wait()

    if variant == "bug":
        return _sd_call(counted_copies, [sd.regular_semaphore()])
    return _sd_call(same_copies_on_a_dma_semaphore, [sd.dma_semaphore()])


# ---------------------------------------------------------------- S9: a rebuilt wait


def _s9(variant: str, rows: int) -> Fn:
    def s9_wait_of_a_copy_never_started(x: Any, o: Any, bufs: Any, sem: Any) -> None:
        pltpu.make_async_copy(x, bufs.at[0], sem).start()
        # The bug rebuilds the descriptor with the other buffer: same size, same
        # semaphore, so the wait returns; bufs[1] was never written.
        read = 1 if variant == "bug" else 0
        pltpu.make_async_copy(x, bufs.at[read], sem).wait()
        _copy(bufs.at[read], o, sem)

    return _call(s9_wait_of_a_copy_never_started, [pltpu.VMEM((2, rows, LANES), F32), DMA])


def _s9_sd(rows: int) -> Fn:
    def s9_wait_of_a_copy_never_started(
        x: sd.DataRef, o: sd.DataRef, bufs: sd.DataRef, sem: sd.SemRef
    ) -> None:
        sd.LocalCopy(x, bufs.at[0], sem).start()
        landed = sd.LocalCopy(x, bufs.at[1], sem).started_elsewhere().wait()
        sd.LocalCopy(landed, o, sem).start().wait()

    return _sd_call(
        s9_wait_of_a_copy_never_started, [sd.vmem((2, rows, LANES), F32), sd.dma_semaphore()]
    )


# ---------------------------------------------------------------- T1, T2, T4, T5


def _t1(variant: str, rows: int) -> Fn:
    short = rows // 2 if variant == "bug" else rows

    def t1_shape_mismatch(x: Any, o: Any, buf: Any, sem: Any) -> None:
        _copy(x.at[pl.ds(0, rows)], buf, sem)  # the bug's buffer has half the rows
        _copy(buf, o.at[pl.ds(0, short)], sem)

    return _call(t1_shape_mismatch, [_vmem(short), DMA])


def _t1_sd(rows: int) -> Fn:
    def t1_shape_mismatch(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, buf, sem).start().wait()

    return _sd_call(t1_shape_mismatch, [sd.vmem((rows // 2, LANES), F32), sd.dma_semaphore()])


def _t2(variant: str, rows: int) -> Fn:
    dtype = jnp.int32 if variant == "bug" else F32

    def t2_dtype_mismatch(x: Any, o: Any, buf: Any, sem: Any) -> None:
        _copy(x, buf, sem)  # the bug's buffer is int32
        _copy(buf, o, sem)

    return _call(t2_dtype_mismatch, [pltpu.VMEM((rows, LANES), dtype), DMA])


def _t2_sd(rows: int) -> Fn:
    def t2_dtype_mismatch(x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, buf, sem).start().wait()

    return _sd_call(t2_dtype_mismatch, [sd.vmem((rows, LANES), jnp.int32), sd.dma_semaphore()])


def _t4(variant: str, rows: int) -> Fn:
    level = 2 if variant == "bug" else 1

    def t4_priority_out_of_range(x: Any, o: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, o, sem)
        c.start(priority=level)
        c.wait()

    return _call(t4_priority_out_of_range, [DMA])


def _t4_sd(rows: int) -> Fn:
    def t4_priority_out_of_range(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        level: Any = 2
        sd.LocalCopy(x, o, sem).start(priority=level).wait()

    return _sd_call(t4_priority_out_of_range, [sd.dma_semaphore()])


def _t5(variant: str, rows: int) -> Fn:
    def t5_dma_accumulate(x: Any, o: Any, sem: Any) -> None:
        if variant == "bug":
            pltpu.async_copy(x, o, sem, add=True).wait()  # no TensorCore lowering
        else:
            _copy(x, o, sem)

    return _call(t5_dma_accumulate, [DMA])


def _t5_sd(rows: int) -> Fn:
    def t5_dma_accumulate(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, o, sem).start(add=True).wait()

    return _sd_call(t5_dma_accumulate, [sd.dma_semaphore()])


# ---------------------------------------------------------------- T7, T8


def _t7(variant: str, rows: int) -> Fn:
    def t7_copy_never_waited(x: Any, o: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, o, sem)
        c.start()
        if variant == "fix":
            c.wait()

    return _call(t7_copy_never_waited, [DMA])


def _t7_sd(rows: int) -> Fn:
    def t7_copy_never_waited(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x, o, sem).start()

    return _sd_call(t7_copy_never_waited, [sd.dma_semaphore()])


def _t8(variant: str, rows: int) -> Fn:
    def t8_waited_twice(x: Any, o: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, o, sem)
        c.start()
        c.wait()
        if variant == "bug":
            c.wait()

    return _call(t8_waited_twice, [DMA])


def _t8_sd(rows: int) -> Fn:
    def t8_waited_twice(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
        handle = sd.LocalCopy(x, o, sem).start()
        handle.wait()
        handle.wait()

    return _sd_call(t8_waited_twice, [sd.dma_semaphore()])


# ---------------------------------------------------------------- R1: read before wait


def _r1(variant: str, rows: int) -> Fn:
    def r1_read_before_wait(x: Any, o: Any, buf: Any, res: Any, sem: Any) -> None:
        c = pltpu.make_async_copy(x, buf, sem)
        c.start()
        if variant == "bug":
            vector_copy(buf, res)  # reads buf while the copy is still writing it
            c.wait()
        else:
            c.wait()
            vector_copy(buf, res)
        _copy(res, o, sem)

    return _call(r1_read_before_wait, [_vmem(rows), _vmem(rows), DMA])


def _r1_sd(rows: int) -> Fn:
    def r1_read_before_wait(
        x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, res: sd.DataRef, sem: sd.SemRef
    ) -> None:
        handle = sd.LocalCopy(x, buf, sem).start()
        vector_copy(buf, res)
        handle.wait()
        sd.LocalCopy(res, o, sem).start().wait()

    return _sd_call(r1_read_before_wait, [sd.vmem((rows, LANES), F32)] * 2 + [sd.dma_semaphore()])


# ---------------------------------------------------------------- R2, R3: REGULAR semaphores


def _r2(variant: str, rows: int) -> Fn:
    def r2_semaphore_left_nonzero(x: Any, o: Any, sem: Any, flag: Any) -> None:
        _copy(x, o, sem)
        pl.semaphore_signal(flag, 1)
        if variant == "fix":
            pl.semaphore_wait(flag, 1)

    return _call(r2_semaphore_left_nonzero, [DMA, REGULAR])


def _r2_sd(rows: int) -> Fn:
    def r2_semaphore_left_nonzero(
        x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef, flag: sd.RegularSem
    ) -> None:
        sd.LocalCopy(x, o, sem).start().wait()
        sd.signal(flag)

    return _sd_call(r2_semaphore_left_nonzero, [sd.dma_semaphore(), sd.regular_semaphore()])


def _r3(variant: str, rows: int) -> Fn:
    def r3_wait_nobody_signals(x: Any, o: Any, sem: Any, flag: Any) -> None:
        _copy(x, o, sem)
        if variant == "fix":
            pl.semaphore_signal(flag, 1)
        pl.semaphore_wait(flag, 1)

    return _call(r3_wait_nobody_signals, [DMA, REGULAR])


def _r3_sd(rows: int) -> Fn:
    def r3_wait_nobody_signals(
        x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef, flag: sd.RegularSem
    ) -> None:
        sd.LocalCopy(x, o, sem).start().wait()
        sd.wait(flag)

    return _sd_call(r3_wait_nobody_signals, [sd.dma_semaphore(), sd.regular_semaphore()])


# ---------------------------------------------------------------- R4: in flight across iterations

R4_CHUNKS = 8


def _r4(variant: str, rows: int) -> Fn:
    chunk = rows // R4_CHUNKS

    def r4_copy_in_flight_after_loop(x: Any, o: Any, sems: Any) -> None:
        def copy(i: Any) -> Any:
            rows_i = pl.ds(i * chunk, chunk)
            return pltpu.make_async_copy(x.at[rows_i], o.at[rows_i], sems.at[i % 2])

        def step(i: jax.Array, carry: None) -> None:
            copy(i).start()

            @pl.when(i >= 1)
            def _() -> None:
                copy(i - 1).wait()  # the previous iteration's copy

            return carry

        lax.fori_loop(0, R4_CHUNKS, step, None)
        if variant == "fix":
            copy(R4_CHUNKS - 1).wait()  # the bug leaves the last copy in flight

    return _call(r4_copy_in_flight_after_loop, [DMA((2,))])


def _r4_sd(rows: int) -> Fn:
    chunk = rows // R4_CHUNKS

    def r4_copy_in_flight_after_loop(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray) -> None:
        def copy(i: Any) -> sd.LocalCopy:
            rows_i = pl.ds(i * chunk, chunk)
            return sd.LocalCopy(x.at[rows_i], o.at[rows_i], sems.at[i % 2])

        def step(i: jax.Array, carry: None) -> None:
            copy(i).start()

            @pl.when(i >= 1)
            def _() -> None:
                copy(i - 1).started_elsewhere().wait()

            return carry

        lax.fori_loop(0, R4_CHUNKS, step, None)

    return _sd_call(r4_copy_in_flight_after_loop, [sd.dma_semaphores(2)])


# ---------------------------------------------------------------- R5: index out of range


def _r5(variant: str, rows: int) -> Fn:
    half = rows // 2
    index = 2 if variant == "bug" else 1

    def r5_semaphore_index_out_of_range(
        x: Any, o: Any, bufs: Any, res: Any, sems: Any, other: Any
    ) -> None:
        # Two copies in flight: the first on ``other``, the second on sems[index]
        # (sems holds two semaphores: index 2 is past its end).
        b = pltpu.make_async_copy(x.at[pl.ds(half, half)], bufs.at[1], other)
        a = pltpu.make_async_copy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[index])
        b.start()
        a.start()
        a.wait()
        vector_copy(bufs.at[0], res.at[pl.ds(0, half)])
        b.wait()
        vector_copy(bufs.at[1], res.at[pl.ds(half, half)])
        _copy(res, o, other)

    return _call(r5_semaphore_index_out_of_range, [_halves(rows), _vmem(rows), DMA((2,)), DMA])


def _r5_sd(rows: int) -> Fn:
    def r5_semaphore_index_out_of_range(x: sd.DataRef, o: sd.DataRef, sems: sd.SemArray) -> None:
        sd.LocalCopy(x, o, sems.at[2]).start().wait()

    return _sd_call(r5_semaphore_index_out_of_range, [sd.dma_semaphores(2)])


# ---------------------------------------------------------------- R6: unwritten data


def _r6(variant: str, rows: int) -> Fn:
    def r6_read_of_unwritten_buffer(x: Any, o: Any, buf: Any, sem: Any) -> None:
        if variant == "fix":  # the bug forgot to fill the staging buffer
            _copy(x, buf, sem)
        _copy(buf, o, sem)

    return _call(r6_read_of_unwritten_buffer, [_vmem(rows), DMA])


def _r6_sd(rows: int) -> Fn:
    def r6_read_of_unwritten_buffer(
        x: sd.DataRef, o: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef
    ) -> None:
        sd.LocalCopy(buf, o, sem).start().wait()

    return _sd_call(r6_read_of_unwritten_buffer, [sd.vmem((rows, LANES), F32), sd.dma_semaphore()])


# ---------------------------------------------------------------- R7, R9: waits that guard the wrong copy


def _two_chunks(
    name: str, rows: int, waits: Callable[[Any, Any, Any, Any], tuple[Callable[[], None], ...]]
) -> Fn:
    """Copy the two halves of x into two VMEM slots (the second half started first), wait,
    read each slot with the vector unit, write the result out. ``waits`` gives the two
    waits: the first guards the read of slot 0, the second that of slot 1."""
    half = rows // 2

    def kernel(x: Any, o: Any, bufs: Any, res: Any, sems: Any, out_sem: Any) -> None:
        second = pltpu.make_async_copy(x.at[pl.ds(half, half)], bufs.at[1], sems.at[1])
        first = pltpu.make_async_copy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[0])
        second.start()
        first.start()
        wait_first, wait_second = waits(x, bufs, sems, half)
        wait_first()
        vector_copy(bufs.at[0], res.at[pl.ds(0, half)])
        wait_second()
        vector_copy(bufs.at[1], res.at[pl.ds(half, half)])
        _copy(res, o, out_sem)

    kernel.__name__ = name
    return _call(kernel, [_halves(rows), _vmem(rows), DMA((2,)), DMA])


def _chunk_copy(x: Any, bufs: Any, sem: Any, half: int, slot: int) -> Callable[[], None]:
    return pltpu.make_async_copy(x.at[pl.ds(slot * half, half)], bufs.at[slot], sem).wait


def _r7(variant: str, rows: int) -> Fn:
    def waits(x: Any, bufs: Any, sems: Any, half: int) -> tuple[Callable[[], None], ...]:
        # The bug waits each chunk on the other slot's semaphore: the byte counts
        # balance, but the read of slot 0 is guarded by slot 1's copy.
        a, b = (1, 0) if variant == "bug" else (0, 1)
        return (
            _chunk_copy(x, bufs, sems.at[a], half, 0),
            _chunk_copy(x, bufs, sems.at[b], half, 1),
        )

    return _two_chunks("r7_wait_on_the_wrong_slot", rows, waits)


def _r7_sd(rows: int) -> Fn:
    half = rows // 2

    def r7_wait_on_the_wrong_slot(
        x: sd.DataRef,
        o: sd.DataRef,
        bufs: sd.DataRef,
        res: sd.DataRef,
        sems: sd.SemArray,
        out_sem: sd.SemRef,
    ) -> None:
        sd.LocalCopy(x.at[pl.ds(half, half)], bufs.at[1], sems.at[1]).start()
        sd.LocalCopy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[0]).start()
        sd.LocalCopy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[1]).started_elsewhere().wait()
        vector_copy(bufs.at[0], res.at[pl.ds(0, half)])
        sd.LocalCopy(x.at[pl.ds(half, half)], bufs.at[1], sems.at[0]).started_elsewhere().wait()
        vector_copy(bufs.at[1], res.at[pl.ds(half, half)])
        sd.LocalCopy(res, o, out_sem).start().wait()

    return _sd_call(
        r7_wait_on_the_wrong_slot,
        [
            sd.vmem((2, half, LANES), F32),
            sd.vmem((rows, LANES), F32),
            sd.dma_semaphores(2),
            sd.dma_semaphore(),
        ],
    )


def _r9(variant: str, rows: int) -> Fn:
    def waits(x: Any, bufs: Any, sems: Any, half: int) -> tuple[Callable[[], None], ...]:
        shared = sems.at[0]
        if variant == "bug":
            # Both copies signal one semaphore: the first wait returns as soon as
            # half the bytes landed, whichever copy they came from.
            return (
                _chunk_copy(x, bufs, shared, half, 0),
                _chunk_copy(x, bufs, shared, half, 1),
            )
        return (pltpu.make_async_copy(bufs, bufs, shared).wait, lambda: None)  # both at once

    return _two_chunks_shared("r9_shared_semaphore_early_read", rows, waits)


def _two_chunks_shared(
    name: str, rows: int, waits: Callable[[Any, Any, Any, Any], tuple[Callable[[], None], ...]]
) -> Fn:
    """As :func:`_two_chunks`, both copies on one semaphore ``sems.at[0]``."""
    half = rows // 2

    def kernel(x: Any, o: Any, bufs: Any, res: Any, sems: Any, out_sem: Any) -> None:
        pltpu.make_async_copy(x.at[pl.ds(half, half)], bufs.at[1], sems.at[0]).start()
        pltpu.make_async_copy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[0]).start()
        wait_first, wait_second = waits(x, bufs, sems, half)
        wait_first()
        vector_copy(bufs.at[0], res.at[pl.ds(0, half)])
        wait_second()
        vector_copy(bufs.at[1], res.at[pl.ds(half, half)])
        _copy(res, o, out_sem)

    kernel.__name__ = name
    return _call(kernel, [_halves(rows), _vmem(rows), DMA((2,)), DMA])


def _r9_sd(rows: int) -> Fn:
    half = rows // 2

    def r9_shared_semaphore_early_read(
        x: sd.DataRef,
        o: sd.DataRef,
        bufs: sd.DataRef,
        res: sd.DataRef,
        sems: sd.SemArray,
        out_sem: sd.SemRef,
    ) -> None:
        second = sd.LocalCopy(x.at[pl.ds(half, half)], bufs.at[1], sems.at[0]).start()
        first = sd.LocalCopy(x.at[pl.ds(0, half)], bufs.at[0], sems.at[0]).start()
        first.wait()
        vector_copy(bufs.at[0], res.at[pl.ds(0, half)])
        second.wait()
        vector_copy(bufs.at[1], res.at[pl.ds(half, half)])
        sd.LocalCopy(res, o, out_sem).start().wait()

    return _sd_call(
        r9_shared_semaphore_early_read,
        [
            sd.vmem((2, half, LANES), F32),
            sd.vmem((rows, LANES), F32),
            sd.dma_semaphores(2),
            sd.dma_semaphore(),
        ],
    )


# ---------------------------------------------------------------- the registry

SMALL, LARGE = 64, 4096  # 32 KiB and 2 MiB of float32
ANY_ERROR = frozenset({TRACE_ERROR, LOWERING_ERROR, COMPILE_ERROR})

CASES: tuple[ChipCase, ...] = (
    ChipCase(
        "s2_semaphore_array_waited",
        "S2",
        "a semaphore array where one semaphore belongs",
        "the wait is given the whole DMA semaphore array (`sems`, not `sems.at[0]`)",
        _s2,
        (SMALL,),
        ANY_ERROR,
        safedma_spelling=_s2_sd,
        safedma_static="SemArray is not SemRef ([arg-type])",
    ),
    ChipCase(
        "s3_dma_on_regular_semaphore",
        "S3",
        "the wrong kind of semaphore",
        "a DMA signals a REGULAR semaphore, waited with `pl.semaphore_wait(sem, 1)` "
        "(the TPU v6 counted-copy protocol, on a v5e)",
        _s3,
        (SMALL,),
        # Measured on a v5e (jax 0.10.2): it compiles and halts the core; safedma's
        # CountedCopy is refused at trace time on chips before v6 instead.
        ANY_ERROR | {RIGHT_BY_LUCK, CRASH},
        alone=True,
        trials=1,
        safedma_spelling=_s3_sd,
        safedma_static="RegularSem is not SemRef ([arg-type])",
    ),
    ChipCase(
        "s9_wait_of_a_copy_never_started",
        "S9",
        "waiting a copy that was never started",
        "the wait rebuilds the descriptor with another buffer of the same size and "
        "semaphore, then reads that buffer",
        _s9,
        (SMALL, LARGE),
        RAN,
        safedma_spelling=_s9_sd,
        safedma_static="only handles wait; a rebuilt wait must say started_elsewhere()",
    ),
    ChipCase(
        "t1_shape_mismatch",
        "T1",
        "source and destination differ in shape",
        "a (rows, 128) source copied into a (rows/2, 128) VMEM buffer",
        _t1,
        (SMALL,),
        ANY_ERROR,
        safedma_spelling=_t1_sd,
    ),
    ChipCase(
        "t2_dtype_mismatch",
        "T2",
        "source and destination differ in dtype",
        "a float32 source copied into an int32 VMEM buffer",
        _t2,
        (SMALL,),
        ANY_ERROR,
        safedma_spelling=_t2_sd,
    ),
    ChipCase(
        "t4_priority_out_of_range",
        "T4",
        "a DMA priority outside {0, 1}",
        "`start(priority=2)`",
        _t4,
        (SMALL,),
        ANY_ERROR,
        safedma_spelling=_t4_sd,
        safedma_static="priority is Literal[0, 1] ([arg-type])",
    ),
    ChipCase(
        "t5_dma_accumulate",
        "T5",
        "DMA accumulate (`add=True`) on a TensorCore",
        "`pltpu.async_copy(x, o, sem, add=True)` in a TensorCore kernel",
        _t5,
        (SMALL,),
        ANY_ERROR,
        safedma_spelling=_t5_sd,
    ),
    ChipCase(
        "t7_copy_never_waited",
        "T7",
        "a copy started and never waited",
        "HBM->HBM copy started, the kernel returns without its wait",
        _t7,
        (LARGE,),
        frozenset({CRASH}),
        alone=True,
        trials=2,
        safedma_spelling=_t7_sd,
    ),
    ChipCase(
        "t8_waited_twice",
        "T8",
        "a copy waited twice",
        "`c.wait()` twice after one `c.start()`",
        _t8,
        (SMALL,),
        frozenset({HANG}),
        alone=True,
        trials=1,
        safedma_spelling=_t8_sd,
    ),
    ChipCase(
        "r1_read_before_wait",
        "R1",
        "a destination read before its copy is waited",
        "HBM->VMEM copy started, the VMEM buffer read by the vector unit, then the wait",
        _r1,
        (SMALL, LARGE),
        RAN,
        safedma_spelling=_r1_sd,
    ),
    ChipCase(
        "r2_semaphore_left_nonzero",
        "R2",
        "a semaphore not back to zero at kernel exit",
        "a REGULAR semaphore signalled once and never waited",
        _r2,
        (SMALL,),
        frozenset({CRASH}),
        alone=True,
        trials=2,
        safedma_spelling=_r2_sd,
    ),
    ChipCase(
        "r3_wait_nobody_signals",
        "R3",
        "a wait that can never be satisfied",
        "`pl.semaphore_wait(flag, 1)` on a REGULAR semaphore nothing signals",
        _r3,
        (SMALL,),
        frozenset({HANG}),
        alone=True,
        trials=1,
        safedma_spelling=_r3_sd,
    ),
    ChipCase(
        "r4_copy_in_flight_after_loop",
        "R4",
        "a copy left in flight across loop iterations",
        f"each of {R4_CHUNKS} iterations starts an HBM->HBM chunk and waits the previous "
        "one; the last chunk's copy is never waited",
        _r4,
        (LARGE,),
        frozenset({CRASH}),
        alone=True,
        trials=2,
        safedma_spelling=_r4_sd,
    ),
    ChipCase(
        "r5_semaphore_index_out_of_range",
        "R5",
        "a semaphore index outside its array",
        "`sems.at[2]` of two DMA semaphores, with another copy in flight on the next "
        "semaphore declared",
        _r5,
        (SMALL, LARGE),
        RAN | {CRASH, HANG},
        alone=True,
        safedma_spelling=_r5_sd,
    ),
    ChipCase(
        "r6_read_of_unwritten_buffer",
        "R6",
        "reading a buffer nothing wrote",
        "a VMEM staging buffer copied out that no copy filled",
        _r6,
        (SMALL, LARGE),
        RAN,
        safedma_spelling=_r6_sd,
    ),
    ChipCase(
        "r7_wait_on_the_wrong_slot",
        "R7",
        "a wait on the wrong slot whose byte counts balance",
        "two chunk copies on slots 0 and 1, each waited on the other slot's semaphore",
        _r7,
        (SMALL, LARGE),
        RAN,
        safedma_spelling=_r7_sd,
    ),
    ChipCase(
        "r9_shared_semaphore_early_read",
        "R9",
        "several copies on one semaphore, read after a wait another copy could satisfy",
        "two same-sized chunk copies on one semaphore; chunk 0 read after one chunk's wait",
        _r9,
        (SMALL, LARGE),
        RAN,
        safedma_spelling=_r9_sd,
    ),
    ChipCase(
        "counted_copy",
        "-",
        "safedma's CountedCopy (TPU v6 and later)",
        "two CountedCopy DMAs on a REGULAR semaphore, waited through the handle and wait_counted",
        _counted,
        (SMALL,),
        ANY_ERROR | {RIGHT},
        alone=True,
        trials=1,
        lane_only=True,
    ),
)
BY_NAME = {c.name: c for c in CASES}
CATALOGUE = tuple(c for c in CASES if not c.lane_only)
