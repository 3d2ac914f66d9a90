"""Double buffering: copies into two slots, each waited on its own slot's semaphore, and
write-backs waited one step later.

* R7, a wait rebuilt on the other slot: the byte counts balance, chunk 0 is read
  unguarded (written for this suite);
* R4, a copy on slot 1 that a wait rebuilt on slot 0 must not discharge (the per-slot
  leak; written for this suite);
* a write-back pipeline that waits step i - 1's copy through a rebuilt descriptor and its
  own handle at the last step, which the bug forgets (a correct kernel the trace-time
  checks once rejected; the protocol of pipelined reductions' output write-backs);
* pages started by one helper (paged-attention descriptors): the broken twin reuses the
  buffer for the second page while the first is in flight; simulate names the helper's
  line and the line that called it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import (
    ALL,
    CHUNK,
    LEFTOVER,
    RACE,
    Pair,
    block,
    caught,
    sanitized,
    chunks,
    dma,
    first,
    read_chunks,
    second,
    write_out,
)
from tests.corpus._case import OK, Case, Ok, Program, Raises

D = sd.DataRef
S = sd.SemRef

# ---------------------------------------------------------------- R7: wrong slot


def r7_wrong_slot_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, sems: Any, out_sem: Any, *, bug: bool
) -> None:
    """The bug waits chunk 0 on slot 1: the counts balance, chunk 0 is read unguarded."""
    pltpu.make_async_copy(first(x_ref), bufs.at[0], sems.at[0]).start()
    pltpu.make_async_copy(second(x_ref), bufs.at[1], sems.at[1]).start()
    other = 1 if bug else 0
    one = pltpu.make_async_copy(first(x_ref), bufs.at[0], sems.at[other])
    two = pltpu.make_async_copy(second(x_ref), bufs.at[1], sems.at[1 - other])
    read_chunks(one.wait, two.wait, bufs, res)
    write_out(res, o_ref, out_sem)


def r7_wrong_slot_safedma(
    x_ref: D, o_ref: D, bufs: D, res: D, sems: sd.SemArray, out_sem: S, *, bug: bool
) -> None:
    one = sd.LocalCopy(first(x_ref), bufs.at[0], sems.at[0]).start()
    two = sd.LocalCopy(second(x_ref), bufs.at[1], sems.at[1]).start()
    if bug:  # each wait rebuilt on the other slot: the counts balance, chunk 0 is unguarded
        one = sd.LocalCopy(first(x_ref), bufs.at[0], sems.at[1]).started_elsewhere()
        two = sd.LocalCopy(second(x_ref), bufs.at[1], sems.at[0]).started_elsewhere()
    read_chunks(one.wait, two.wait, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


# ---------------------------------------------------------------- R4: a per-slot leak


def per_slot_leak_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, sems: Any, out_sem: Any, *, bug: bool
) -> None:
    """The bug waits slot 0 only; the fetch on slot 1 is never waited."""
    pltpu.make_async_copy(first(x_ref), bufs.at[0], sems.at[0]).start()
    pltpu.make_async_copy(second(x_ref), bufs.at[1], sems.at[1]).start()  # fix: per_slot_leak
    pltpu.make_async_copy(first(x_ref), bufs.at[0], sems.at[0]).wait()
    if not bug:
        pltpu.make_async_copy(second(x_ref), bufs.at[1], sems.at[1]).wait()
    write_out(x_ref, o_ref, out_sem)


def per_slot_leak_safedma(
    x_ref: D, o_ref: D, bufs: D, sems: sd.SemArray, out_sem: S, *, bug: bool
) -> None:
    one = sd.LocalCopy(first(x_ref), bufs.at[0], sems.at[0]).start()
    two = sd.LocalCopy(second(x_ref), bufs.at[1], sems.at[1]).start()  # fix: per_slot_leak
    if bug:  # the wait on slot 0 is rebuilt; the copy on slot 1 is never waited
        sd.LocalCopy(first(x_ref), bufs.at[0], sems.at[0]).started_elsewhere().wait()
    else:
        one.wait()
        two.wait()
    sd.LocalCopy(x_ref, o_ref, out_sem).start().wait()


# ---------------------------------------------------------------- write-backs


def writeback_pltpu(x_ref: Any, o_ref: Any, bufs: Any, sems: Any, *, bug: bool) -> None:
    """``x_ref`` in VMEM; step i writes chunk i back through slot i % 2.

    Step i waits step i - 1's write-back (a descriptor rebuilt for a copy
    started one iteration earlier); the last step waits its own handle, which
    the bug forgets.
    """
    steps = x_ref.shape[0] // CHUNK

    def write_back(step: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            bufs.at[slot], o_ref.at[pl.ds(step * CHUNK, CHUNK)], sems.at[slot]
        )

    def body(step: Any, carry: None) -> None:
        slot = step % 2

        @pl.when(step > 0)
        def _previous() -> None:
            write_back(step - 1, 1 - slot).wait()

        bufs[slot] = x_ref[pl.ds(step * CHUNK, CHUNK)] * 2.0
        own = write_back(step, slot)
        own.start()  # fix: writeback
        if not bug:

            @pl.when(step == steps - 1)
            def _last() -> None:
                own.wait()

        return carry

    lax.fori_loop(0, steps, body, None)


def writeback_safedma(x_ref: D, o_ref: D, bufs: D, sems: sd.SemArray, *, bug: bool) -> None:
    steps = x_ref.shape[0] // CHUNK

    def write_back(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        return sd.LocalCopy(bufs.at[slot], o_ref.at[pl.ds(step * CHUNK, CHUNK)], sems.at[slot])

    def body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step > 0)
        def _previous() -> None:
            write_back(step - 1, 1 - slot).started_elsewhere().wait()

        bufs[slot] = x_ref[pl.ds(step * CHUNK, CHUNK)] * 2.0
        own = write_back(step, slot).start()  # fix: writeback
        if not bug:  # the bug never waits the last step's own write-back

            @pl.when(step == steps - 1)
            def _last() -> None:
                own.wait()

        return carry

    lax.fori_loop(0, steps, body, None)


PAIRS = (
    # The race detector's vector clocks see this one: the wait on slot 1 orders
    # nothing with the copy into slot 0.
    Pair(
        "r7_wrong_slot",
        "R7",
        "silent",
        lambda: [chunks(), block(), pltpu.SemaphoreType.DMA((2,)), *dma()],
        r7_wrong_slot_safedma,
        r7_wrong_slot_pltpu,
        caught(RACE, r"(?i)race|not ordered|before", ALL, ("bufs",), r"(?i)wait"),
        simulate_bug="RaceDetectedError",
    ),
    Pair(
        "per_slot_leak",
        "R4",
        "leak",
        lambda: [chunks(), pltpu.SemaphoreType.DMA((2,)), *dma()],
        per_slot_leak_safedma,
        per_slot_leak_pltpu,
        caught(
            LEFTOVER, r"(?i)not back to zero|leftover|never waited", ALL, ("sems",), r"(?i)wait"
        ),
        simulate_bug="LeftoverSemaphoreError",
        sanitize_bug=sanitized("LeftoverSemaphoreError", ALL, ("sems",), line=False),
        # The rebuilt wait on sems.at[0] cannot stand for the copy on sems.at[1]: no
        # path waits it (per-slot matching of the trace-time checks).
        trace_bug=Raises(
            "^CopyNeverWaitedError$",
            matches=(r"double_buffering\.py:\d+: wait\(\) never",),
            exact=True,
        ),
        # The raw twin alike: its jaxpr waits sems.at[0] only (raw copies paired per slot).
        trace_raw_bug=Raises(
            "^CopyNeverWaitedError$", says=("sems[1]", "raw pltpu copy"), exact=True
        ),
    ),
    Pair(
        "writeback",
        "R4",
        "false_alarm",
        lambda: [chunks(), pltpu.SemaphoreType.DMA((2,))],
        writeback_safedma,
        writeback_pltpu,
        caught(
            r"Leftover|Race",
            r"(?i)not back to zero|never waited|race",
            ALL,
            ("sems", "o_ref"),
            r"(?i)wait",
        ),
        provenance="written for this suite (pipelined reductions' output write-backs)",
        x_in_vmem=True,
        rows=4 * CHUNK,
        simulate_bug="RaceDetectedError",
        slow_simulate=True,
        sanitize_bug=sanitized("LeftoverSemaphoreError", ALL, ("sems",), line=False),
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("double_buffering")]


# ---------------------------------------------------------------- pages started by one helper

PAGE_ROWS = 8


def start_page(src: Any, dst: Any, sem: Any) -> Any:
    copy = pltpu.make_async_copy(src, dst, sem)
    copy.start()  # the same line for every page: the caller's tells them apart
    return copy


def two_pages(x_ref: Any, o_ref: Any, buf: Any, sems: Any, *, wait_first: bool) -> None:
    # Paged-attention descriptors start every copy from one method; the broken twin
    # reuses the buffer for the second page while the first is in flight.
    one = start_page(x_ref.at[pl.ds(0, PAGE_ROWS)], buf, sems.at[0])
    if wait_first:
        one.wait()
        o_ref[pl.ds(0, PAGE_ROWS), :] = buf[...]
    two = start_page(  # fix: buffer_reused_while_a_helpers_copy_is_in_flight
        x_ref.at[pl.ds(PAGE_ROWS, PAGE_ROWS)], buf, sems.at[1]
    )  # the second page
    two.wait()
    o_ref[pl.ds(PAGE_ROWS, PAGE_ROWS), :] = buf[...]
    if not wait_first:
        one.wait()
        o_ref[pl.ds(0, PAGE_ROWS), :] = x_ref[pl.ds(0, PAGE_ROWS), :]


def two_pages_program(wait_first: bool) -> Program:
    def kernel(*refs: Any) -> None:
        two_pages(*refs, wait_first=wait_first)

    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((2 * PAGE_ROWS, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((PAGE_ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    return Program(call, (jax.ShapeDtypeStruct((2 * PAGE_ROWS, 128), jnp.float32),))


def _copied_through(out: Any, program: Program) -> None:
    np.testing.assert_array_equal(np.asarray(out), np.asarray(program.concrete_args()[0]))


def _names_the_callers_line(error: BaseException) -> None:
    from tests.support.simulation import line_of

    message = str(error)
    helper = line_of(start_page, "copy.start()")
    caller = line_of(two_pages, "# fix: buffer_reused").rsplit(":", 1)[1]
    # verify's rule: the kernel lines that called the helper, innermost first
    here = "double_buffering.py"
    called = f"called at {here}:{caller} in two_pages, {here}:"
    made = line_of(start_page, "copy = ").rsplit(":", 1)[1]
    assert f"{helper} (start_page, descriptor made at {here}:{made}, {called}" in message, message


CASES += [
    Case(
        "pages_started_by_one_helper_and_waited",
        "double_buffering",
        "pytorch/xla paged attention's copy descriptors, written for this suite",
        lambda: two_pages_program(True),
        {"sanitize": OK, "simulate": Ok(check=_copied_through)},
    ),
    Case(
        "buffer_reused_while_a_helpers_copy_is_in_flight",
        "double_buffering",
        "pytorch/xla paged attention's copy descriptors, written for this suite",
        lambda: two_pages_program(False),
        {"simulate": Raises("RaceDetectedError", check=_names_the_callers_line)},
    ),
]
