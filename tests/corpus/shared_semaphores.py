"""Aggregate waits on a shared semaphore: several copies on one DMA semaphore, waited one
by one (each wait may count another copy's bytes) or once by their total.

* R9, two same-sized local copies on one semaphore, each waited before its chunk is
  read; the fix waits both at once (written for this suite);
* copies of different sizes on one semaphore (4 KiB and 8 KiB): the small copy's wait
  released by the big one's bytes before its buffer is read, the small copy waited
  twice (8 of 12 KiB: a count left at exit), the big one waited twice (more than ever
  lands: a hang); each message names both copies' lines and sizes (written for this
  suite);
* the early wait of MoE all-to-alls: one semaphore counts a local fetch and the left
  neighbour's incoming copy, so the local wait can return on the neighbour's bytes (the
  protocol of vLLM tpu-inference's and tokamax's fused MoE);
* the MoE all-to-all itself: every device sends one block to every other device and
  copies its own block locally, all on one DMA semaphore, waited by total size in two
  waits; a block read between them, and a second wait one block short;
* ``wait_copies`` and ``wait_bytes`` (a self-descriptor wait on the raw side) and their
  argument checks;
* copies counted on a REGULAR semaphore (``CountedCopy``, ``wait_counted``);
* pytorch/xla's paged attention: a step's K and V pages on one semaphore, the next
  step's prefetched before this one's are waited; a V page read before a wait that
  covers it is a race (simulate).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
    AXIS,
    HBM,
    RACE,
    Pair,
    block,
    caught,
    chunks,
    dma,
    first,
    neighbour,
    read_chunks,
    sanitized,
    second,
    write_out,
)
from tests.corpus._calls import local, on_ring
from tests.corpus._case import OK, Case, Ok, Program, Raises, ring

D = sd.DataRef
S = sd.SemRef

# ---------------------------------------------------------------- R9: shared semaphore


def r9_shared_sem_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """Two same-sized copies on one semaphore; the bug's first wait may count the second's
    bytes, the fix waits both at once before either chunk is read."""
    a = pltpu.make_async_copy(first(x_ref), bufs.at[0], sem)
    b = pltpu.make_async_copy(second(x_ref), bufs.at[1], sem)
    a.start()
    b.start()
    if bug:
        read_chunks(a.wait, b.wait, bufs, res)
    else:
        read_chunks(pltpu.make_async_copy(bufs, bufs, sem).wait, lambda: None, bufs, res)
    write_out(res, o_ref, out_sem)


def r9_shared_sem_safedma(
    x_ref: D, o_ref: D, bufs: D, res: D, sem: S, out_sem: S, *, bug: bool
) -> None:
    a = sd.LocalCopy(first(x_ref), bufs.at[0], sem).start()
    b = sd.LocalCopy(second(x_ref), bufs.at[1], sem).start()
    if bug:  # two same-sized copies on one semaphore: a's wait may count b's bytes
        read_chunks(a.wait, b.wait, bufs, res)
    else:
        read_chunks(lambda: sd.wait_all_into(bufs, sem), lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


# ---------------------------------------------------------------- the early wait


def early_wait_pltpu(
    x_ref: Any, o_ref: Any, bufs: Any, res: Any, send: Any, sem: Any, out_sem: Any, *, bug: bool
) -> None:
    """``sem`` counts a local fetch and the left neighbour's incoming copy (MoE style).

    The bug's local wait returns as soon as 4 KiB arrived: the neighbour's bytes
    satisfy it as well as the local copy's. The fix waits the total first.
    """
    local = pltpu.make_async_copy(first(x_ref), bufs.at[0], sem)
    local.start()
    remote = pltpu.make_async_remote_copy(
        second(x_ref), bufs.at[1], send, sem, device_id=neighbour(1)
    )
    remote.start()

    def both() -> None:
        pltpu.make_async_copy(bufs, bufs, sem).wait()
        remote.wait_send()

    if bug:
        read_chunks(local.wait, remote.wait, bufs, res)
    else:
        read_chunks(both, lambda: None, bufs, res)
    write_out(res, o_ref, out_sem)


def early_wait_safedma(
    x_ref: D, o_ref: D, bufs: D, res: D, send: S, sem: S, out_sem: S, *, bug: bool
) -> None:
    local = sd.LocalCopy(first(x_ref), bufs.at[0], sem).start()
    remote = (
        sd.RemoteCopy(second(x_ref), bufs.at[1], sem)
        .with_send_sem(send)
        .to(sd.neighbour(AXIS))
        .start()
    )

    def both() -> None:  # the local fetch and the neighbour's copy: all 8 KiB
        sd.wait_all_into(bufs, sem)
        remote.wait_send()

    if bug:  # sem counts both copies: the local wait returns on the neighbour's bytes
        read_chunks(local.wait, remote.wait, bufs, res)
    else:
        read_chunks(both, lambda: None, bufs, res)
    sd.LocalCopy(res, o_ref, out_sem).start().wait()


_SHARED_FIX = r"(?i)wait_all_into|separate|own semaphore|total|all"

PAIRS = (
    Pair(
        "r9_shared_sem",
        "R9",
        "silent",
        lambda: [chunks(), block(), *dma(2)],
        r9_shared_sem_safedma,
        r9_shared_sem_pltpu,
        caught(RACE, r"(?i)race|not ordered|before", ALL, ("bufs", "sem"), _SHARED_FIX),
    ),
    # Depends on the schedule under simulate: it orders a wait after the signals it
    # consumes in arrival order, so the bug is seen only when the neighbour's copy lands
    # before the local one (device threads race for that).
    Pair(
        "early_wait",
        "R9",
        "silent",
        lambda: [chunks(), block(), *dma(3)],
        early_wait_safedma,
        early_wait_pltpu,
        caught(RACE, r"(?i)race|not ordered|before", ALL, ("bufs", "sem"), _SHARED_FIX),
        provenance="vLLM tpu-inference and tokamax fused MoE (a local fetch and a neighbour's copy on one semaphore)",
        simulate_bug=None,
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("shared_semaphores")]


# ---------------------------------------------------------------- MoE all-to-all


def _moe_start(x_ref: D, o_ref: D, sem: S) -> None:
    n = sd.axis_size(AXIS)
    me = sd.my_index(AXIS)
    rows = x_ref.shape[0] // n
    mine = o_ref.at[pl.ds(me * rows, rows)]
    sd.LocalCopy(x_ref.at[pl.ds(me * rows, rows)], mine, sem).start()
    for shift in range(1, n):
        peer = (me + shift) % n
        copy = sd.RemoteCopy(x_ref.at[pl.ds(peer * rows, rows)], mine, sem)
        copy.with_send_sem(sem).to(sd.device({AXIS: peer})).start()


def moe_all_to_all(x_ref: D, o_ref: D, sem: S) -> None:
    """Every device sends one block to every other device and copies its own block
    locally, all on ONE DMA semaphore, then waits by total size."""
    _moe_start(x_ref, o_ref, sem)
    # The semaphore counted the local block and n - 1 received blocks (o_ref's
    # size) and n - 1 sent blocks: two waits by size.
    n = sd.axis_size(AXIS)
    sd.wait_bytes(sem, o_ref)
    sd.wait_bytes(sem, o_ref.at[pl.ds(0, (n - 1) * (o_ref.shape[0] // n))])


def moe_all_to_all_raw(x_ref: Any, o_ref: Any, sem: Any) -> None:
    n = lax.axis_size(AXIS)
    me = lax.axis_index(AXIS)
    rows = x_ref.shape[0] // n
    mine = o_ref.at[pl.ds(me * rows, rows)]
    pltpu.make_async_copy(x_ref.at[pl.ds(me * rows, rows)], mine, sem).start()
    for shift in range(1, n):
        peer = (me + shift) % n
        pltpu.make_async_remote_copy(
            x_ref.at[pl.ds(peer * rows, rows)], mine, sem, sem, device_id={AXIS: peer}
        ).start()
    pltpu.make_async_copy(o_ref, o_ref, sem).wait()
    part = o_ref.at[pl.ds(0, (n - 1) * rows)]
    pltpu.make_async_copy(part, part, sem).wait()


def own_block(me: jax.Array, n: int) -> jax.Array:
    return me


def received_block(me: jax.Array, n: int) -> jax.Array:
    return (me + 1) % n


def moe_then_read(block: Callable[[jax.Array, int], jax.Array], early: bool) -> Callable[..., None]:
    """The all-to-all, then block ``block(me, n)`` of the result copied into VMEM:
    after both waits (correct) or between them (``early``: a seeded bug, the first
    wait is satisfied by any n blocks of the 2n - 1 the semaphore counts)."""

    def kernel(x_ref: D, o_ref: D, buf: D, sem: S, copy_sem: S) -> None:
        n = sd.axis_size(AXIS)
        me = sd.my_index(AXIS)
        rows = o_ref.shape[0] // n
        _moe_start(x_ref, o_ref, sem)
        sd.wait_bytes(sem, o_ref)

        def read() -> None:
            start = block(me, n) * rows
            sd.LocalCopy(o_ref.at[pl.ds(start, rows)], buf, copy_sem).start().wait()

        if early:
            read()  # fix: moe_own_block_read_between_the_waits moe_received_block_read_between_the_waits
        sd.wait_bytes(sem, o_ref.at[pl.ds(0, (n - 1) * rows)])
        if not early:
            read()

    return kernel


def moe_one_block_short(x_ref: D, o_ref: D, sem: S) -> None:
    """Seeded bug: the second wait is one block short (a sent block is never waited)."""
    _moe_start(x_ref, o_ref, sem)
    n = sd.axis_size(AXIS)
    sd.wait_bytes(sem, o_ref)
    sd.wait_bytes(  # fix: moe_second_wait_one_block_short
        sem, o_ref.at[pl.ds(0, (n - 2) * (o_ref.shape[0] // n))]
    )


def moe_without_the_size_waits(x: D, o: D, sem: S) -> None:
    me = sd.my_index("x")
    copy = sd.RemoteCopy(x.at[pl.ds(0, 8)], o.at[pl.ds(me * 8, 8)], sem)
    copy.with_send_sem(sem).to(sd.neighbour("x")).start()
    sd.LocalCopy(x.at[pl.ds(8, 8)], o.at[pl.ds(8, 8)], sem).start()


def moe_program(
    kernel: Callable[..., None],
    devices: int = 4,
    *,
    safe: bool = True,
    scratch: Callable[[], list[Any]] | None = None,
) -> Program:
    """``kernel(x_ref, o_ref, *scratch)`` per device on a ring of ``devices``, 8 rows per
    block (one block per device), in HBM."""
    pallas = sd.pallas_call if safe else pl.pallas_call

    def per_device(x: jax.Array) -> jax.Array:
        result: jax.Array = pallas(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())] if scratch is None else scratch(),
        )(x)
        return result

    x = jax.ShapeDtypeStruct((devices * devices * 8, 128), jnp.float32)
    return Program(per_device, (x,), ring(devices, AXIS))


def moe_read_scratch() -> list[Any]:
    return [sd.vmem((8, 128), jnp.float32), sd.dma_semaphore(), sd.dma_semaphore()]


# ---------------------------------------------------------------- waits by size and count


def gather_then_wait_copies(x: D, o: D, buf: D, sem: S) -> None:
    one = sd.LocalCopy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem)
    two = sd.LocalCopy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem)
    one.start()
    two.start()
    sd.wait_copies(sem, one, two)
    sd.LocalCopy(buf, o, sem).start().wait()


def gather_raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
    pltpu.make_async_copy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
    pltpu.make_async_copy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
    for part in (buf.at[pl.ds(0, 16)], buf.at[pl.ds(16, 16)]):
        pltpu.make_async_copy(part, part, sem).wait()
    c = pltpu.make_async_copy(buf, o, sem)
    c.start()
    c.wait()


def halves_waited_by_size(x: D, o: D, buf: D, sem: S) -> None:
    sd.LocalCopy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
    sd.LocalCopy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
    sd.wait_bytes(sem, buf)


def halves_waited_by_size_raw(x: Any, o: Any, buf: Any, sem: Any) -> None:
    pltpu.make_async_copy(x.at[pl.ds(0, 16)], buf.at[pl.ds(0, 16)], sem).start()
    pltpu.make_async_copy(x.at[pl.ds(16, 16)], buf.at[pl.ds(16, 16)], sem).start()
    pltpu.make_async_copy(buf, buf, sem).wait()


def wait_before_the_start_in_trace_order(x: D, o: D, buf: D, sem: S) -> None:
    """Pipelined loops wait the previous step's copies before starting the next."""

    @pl.when(pl.program_id(0) > 0)
    def _() -> None:
        sd.wait_bytes(sem, buf)

    sd.LocalCopy(x, buf, sem).start()


def wait_copies_of_a_copy_on_another_semaphore(x: D, o: D, buf: D, sem: S, other: S) -> None:
    copy = sd.LocalCopy(x, buf, other)
    copy.start()
    sd.wait_copies(sem, copy)  # fix: wait_copies_of_a_copy_on_another_semaphore


def wait_bytes_of_a_buffer_by_a_semaphore(x: Any, o: Any, buf: Any, sem: Any) -> None:
    sd.wait_bytes(buf, sem)  # fix: wait_bytes_arguments_swapped


SCRATCH = [sd.vmem((32, 128), jnp.float32), sd.dma_semaphore()]
RAW_SCRATCH = [pltpu.VMEM((32, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]
MOE = "vLLM tpu-inference and tokamax fused MoE all-to-all, written for this suite"


def _moe_clean(devices: int) -> Case:
    """One DMA semaphore counts the local block, the n - 1 sent and the n - 1 received
    blocks; two waits by size (n blocks, then n - 1) cover all 2n - 1. The first wait
    guarantees no block in particular (any n of them may release it); the second
    guarantees them all, and nothing reads a block in between."""
    expect: dict[str, Any] = {
        "verify": Ok(report={"dmas": devices * devices, "waits": 2 * devices}),
        "sanitize": OK,
    }
    if devices == 4:
        expect["mosaic"] = OK
    return Case(
        f"moe_all_to_all_waited_by_size_on_{devices}",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_all_to_all, devices),
        expect,
        twin=lambda: moe_program(moe_all_to_all_raw, devices, safe=False),
    )


CASES += [
    *(_moe_clean(n) for n in (2, 4, 8)),
    Case(
        "moe_own_block_read_after_the_total_wait",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_then_read(own_block, early=False), scratch=moe_read_scratch),
        {"sanitize": OK, "verify": Ok(report={"dmas": 20})},
    ),
    Case(
        "moe_received_block_read_after_the_total_wait",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_then_read(received_block, early=False), scratch=moe_read_scratch),
        {"sanitize": OK, "verify": Ok(report={"dmas": 20})},
    ),
    # The first wait (4 blocks of the 7 the semaphore counts) may be released by the 3
    # sent blocks and a received one, so the local block is not guaranteed there. The
    # schedule verify walks first runs the wait before any receive arrives; the replay
    # that counts the early receives at the wait catches it.
    Case(
        "moe_own_block_read_between_the_waits",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_then_read(own_block, early=True), scratch=moe_read_scratch),
        {
            "verify": Raises(
                "RaceDetectedError",
                says=("o_ref", "shared_semaphores.py", "whichever land first"),
            )
        },
    ),
    # The block from the left neighbour read between the waits. In the walked order that
    # device has not even started its copy (R6); in others it is in flight (R1).
    Case(
        "moe_received_block_read_between_the_waits",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_then_read(received_block, early=True), scratch=moe_read_scratch),
        {
            "verify": Raises(
                "RaceDetectedError|UnwrittenReadError",
                says=("o_ref", "shared_semaphores.py"),
            )
        },
    ),
    # 2n - 2 blocks waited of the 2n - 1 counted. A device may then return its output
    # before the last receive landed (the copy that lands after its target returned,
    # R8, or the output read at the return) or leave a block on the semaphore.
    Case(
        "moe_second_wait_one_block_short",
        "shared_semaphores",
        MOE,
        lambda: moe_program(moe_one_block_short),
        {
            "verify": Raises(
                "LeftoverSemaphoreError|UnwrittenReadError|RaceDetectedError|SignalAfterExitError",
                one_of=(("o_ref", "sem"),),
            ),
            # The block the second wait leaves out stays on sem at kernel exit.
            "sanitize": sanitized(
                "LeftoverSemaphoreError", tuple(f"x={i}" for i in range(4)), ("sem",), line=False
            ),
        },
    ),
    Case(
        "moe_without_the_size_waits",
        "shared_semaphores",
        MOE,
        lambda: on_ring(moe_without_the_size_waits, [sd.dma_semaphore()]),
        {"trace": Raises("^CopyNeverWaitedError$", says=("2 copies",), line=False)},
    ),
    Case(
        "halves_waited_by_wait_copies",
        "shared_semaphores",
        "written for this suite",
        lambda: local(gather_then_wait_copies, SCRATCH),
        {"mosaic": OK},
        twin=lambda: local(gather_raw, RAW_SCRATCH, checked=False),
    ),
    Case(
        "halves_waited_by_size",
        "shared_semaphores",
        "written for this suite",
        lambda: local(halves_waited_by_size, SCRATCH),
        {"mosaic": OK},
        twin=lambda: local(halves_waited_by_size_raw, RAW_SCRATCH, checked=False),
    ),
    Case(
        "wait_by_size_before_the_start_in_trace_order",
        "shared_semaphores",
        "pipelined loops (the previous step's copies waited first), written for this suite",
        lambda: local(wait_before_the_start_in_trace_order, SCRATCH, grid=(3,)),
        {"trace": OK},
    ),
    Case(
        "wait_copies_of_a_copy_on_another_semaphore",
        "shared_semaphores",
        "written for this suite",
        lambda: local(wait_copies_of_a_copy_on_another_semaphore, [*SCRATCH, sd.dma_semaphore()]),
        {
            "trace": Raises(
                "^SemaphoreKindError$", says=("does not signal the waited semaphore",), line=False
            )
        },
    ),
    Case(
        "wait_bytes_arguments_swapped",
        "shared_semaphores",
        "written for this suite",
        lambda: local(wait_bytes_of_a_buffer_by_a_semaphore, SCRATCH),
        {"trace": Raises("^SemaphoreKindError$", line=False)},
    ),
]


# ---------------------------------------------------------------- copies counted on a REGULAR semaphore


def counted(x: D, o: D, flag: sd.RegularSem) -> None:
    sd.CountedCopy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], flag).start().wait()
    sd.CountedCopy(x.at[pl.ds(16, 8)], o.at[pl.ds(16, 8)], flag).start()
    sd.CountedCopy(x.at[pl.ds(24, 8)], o.at[pl.ds(24, 8)], flag).start(priority=1)
    sd.wait_counted(flag, 2)


def counted_raw(x: Any, o: Any, flag: Any) -> None:
    pltpu.make_async_copy(x.at[pl.ds(0, 16)], o.at[pl.ds(0, 16)], flag).start()
    pl.semaphore_wait(flag, 1)
    pltpu.make_async_copy(x.at[pl.ds(16, 8)], o.at[pl.ds(16, 8)], flag).start()
    pltpu.make_async_copy(x.at[pl.ds(24, 8)], o.at[pl.ds(24, 8)], flag).start(priority=1)
    pl.semaphore_wait(flag, 2)


def counted_copy_never_waited(x: D, o: D, flag: sd.RegularSem) -> None:
    sd.CountedCopy(x, o, flag).start()  # fix: counted_copy_never_waited


def counted_copy_on_a_dma_semaphore(x: Any, o: Any, sem: Any) -> None:
    sd.CountedCopy(x, o, sem).start().wait()  # fix: counted_copy_on_a_dma_semaphore


CASES += [
    Case(
        "copies_counted_on_a_regular_semaphore",
        "shared_semaphores",
        "DMA counted on a REGULAR semaphore (written for this suite)",
        lambda: local(counted, [sd.regular_semaphore()]),
        {"mosaic": OK},
        twin=lambda: local(counted_raw, [pltpu.SemaphoreType.REGULAR(())], checked=False),
    ),
    Case(
        "counted_copy_never_waited",
        "shared_semaphores",
        "written for this suite",
        lambda: local(counted_copy_never_waited, [sd.regular_semaphore()]),
        {"trace": Raises("^CopyNeverWaitedError$", says=("CountedCopy",), line=False)},
    ),
    Case(
        "counted_copy_on_a_dma_semaphore",
        "shared_semaphores",
        "written for this suite",
        lambda: local(counted_copy_on_a_dma_semaphore, [sd.dma_semaphore()]),
        {"trace": Raises("^SemaphoreKindError$", says=("REGULAR",), line=False)},
    ),
]


# ---------------------------------------------------------------- K and V pages on one semaphore

KV_ROWS = 8  # rows of one page
KV_PAGES = 6  # pages of the cache
KV_STEPS = 4  # grid steps: one page of K and one of V each
KV_TABLE = (4, 1, 5, 2)  # page of each step


def paged_kv(
    table: Any,
    k_hbm: Any,
    v_hbm: Any,
    o_ref: Any,
    k_buf: Any,
    v_buf: Any,
    sem: Any,
    *,
    variant: str,
) -> None:
    # pytorch/xla's multi-query paged attention: the K copy and the V copy of a
    # step share one DMA semaphore, and the next step's pages are started before
    # this step's are waited. A wait releases when ITS byte count has landed on
    # the semaphore, whichever copy brought them: after the K wait only the
    # copies issued first are certain. Before: jax's interpreter ordered a wait
    # after every signal so far, so a V page read after the K wait alone ran clean.
    i = pl.program_id(0)
    slot = i % 2

    def copies(step: Any, at: Any) -> tuple[Any, Any]:
        k = pltpu.make_async_copy(k_hbm.at[table[step]], k_buf.at[at], sem)
        v = pltpu.make_async_copy(v_hbm.at[table[step]], v_buf.at[at], sem)
        return k, v

    @pl.when(i == 0)
    def _() -> None:
        k0, v0 = copies(0, 0)
        k0.start()  # fix: kv_pages_on_one_semaphore_correct kv_pages_on_one_semaphore_waits_swapped
        v0.start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        k1, v1 = copies(i + 1, 1 - slot)
        k1.start()
        v1.start()

    k, v = copies(i, slot)
    if variant == "correct":
        k.wait()
        v.wait()
        o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]
    elif variant == "v_wait_dropped":
        k.wait()
        # the V page is still in flight: its wait belongs before this read
        out = k_buf[slot] + 2.0 * v_buf[slot]  # fix: kv_pages_on_one_semaphore_v_wait_dropped
        o_ref[...] = out
    elif variant == "waits_swapped_read_between":
        v.wait()  # releases on the K page's bytes: K landed first
        # the V page is still in flight: read it after the second wait
        v_part = 2.0 * v_buf[slot]  # fix: kv_pages_on_one_semaphore_waits_swapped_read_between
        k.wait()
        o_ref[...] = k_buf[slot] + v_part
    else:  # waits_swapped: both waited before any read, clean
        v.wait()
        k.wait()
        o_ref[...] = k_buf[slot] + 2.0 * v_buf[slot]


def paged_kv_program(variant: str) -> Program:
    def kernel(*refs: Any) -> None:
        paged_kv(*refs, variant=variant)

    def call(table: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((KV_STEPS * KV_ROWS, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(KV_STEPS,),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
                out_specs=pl.BlockSpec((KV_ROWS, 128), lambda i, table: (i, 0)),
                scratch_shapes=[
                    pltpu.VMEM((2, KV_ROWS, 128), jnp.float32),
                    pltpu.VMEM((2, KV_ROWS, 128), jnp.float32),
                    pltpu.SemaphoreType.DMA,
                ],
            ),
        )(table, k, v)
        return out

    k = jnp.arange(KV_PAGES * KV_ROWS * 128, dtype=jnp.float32).reshape(KV_PAGES, KV_ROWS, 128)
    return Program(call, (jnp.asarray(KV_TABLE, jnp.int32), k, 1000.0 + k))


def _kv_pages_read(out: Any, program: Program) -> None:
    table, k, v = program.args
    pages = np.asarray(KV_TABLE)
    expected = (np.asarray(k)[pages] + 2.0 * np.asarray(v)[pages]).reshape(KV_STEPS * KV_ROWS, 128)
    np.testing.assert_array_equal(np.asarray(out), expected)


def _v_page_race(read: str) -> Callable[[BaseException], None]:
    def names_the_read_and_the_start(error: BaseException) -> None:
        from tests.support.simulation import assert_clean_afterwards, line_of

        message = str(error)
        assert f"at {line_of(paged_kv, read)} " in message, message
        assert line_of(paged_kv, "v0.start()") in message, message  # the copy's start
        assert_clean_afterwards()

    return names_the_read_and_the_start


XLA_PAGED = "pytorch/xla multi-query paged attention, written for this suite"

CASES += [
    *(
        Case(
            f"kv_pages_on_one_semaphore_{variant}",
            "shared_semaphores",
            XLA_PAGED,
            functools.partial(paged_kv_program, variant),
            # Runs right in interpret mode, yet K, V and the next step's prefetch share
            # one DMA semaphore: a wait for K's bytes may be met by V's (R9).
            {
                "simulate": Ok(check=_kv_pages_read),
                "verify": Raises(r"^RaceDetectedError$", says=("R7/R9",)),
                "sanitize": OK,
            },
        )
        for variant in ("correct", "waits_swapped")
    ),
    Case(
        "kv_pages_on_one_semaphore_v_wait_dropped",
        "shared_semaphores",
        XLA_PAGED,
        lambda: paged_kv_program("v_wait_dropped"),
        {
            "simulate": Raises(
                "RaceDetectedError",
                check=_v_page_race("out = k_buf[slot] + 2.0 * v_buf[slot]"),
            ),
            # The race is not the sanitizer's to see; the V page's copy, never waited,
            # is: left on the shared semaphore (the kernel's refs[6]) at kernel exit.
            "sanitize": Raises(
                "LeftoverSemaphoreError",
                exact=True,
                matches=(r"^\[safedma sanitizer\]", r"holds 16384 bytes at kernel exit"),
                one_of=(("refs",),),
                line=False,
            ),
        },
    ),
    Case(
        "kv_pages_on_one_semaphore_waits_swapped_read_between",
        "shared_semaphores",
        XLA_PAGED,
        lambda: paged_kv_program("waits_swapped_read_between"),
        {"simulate": Raises("RaceDetectedError", check=_v_page_race("v_part = 2.0 * v_buf[slot]"))},
    ),
]


# ---------------------------------------------------------------- copies of different sizes


def mixed_sizes_pltpu(
    x_ref: Any, o_ref: Any, head: Any, whole: Any, sem: Any, out_sem: Any, *, mistake: str
) -> None:
    """A 4 KiB copy (the first chunk into ``head``) and an 8 KiB copy (the whole block
    into ``whole``) on one DMA semaphore. ``read``: the small copy's wait, released by the
    big copy's bytes as well, before ``head`` is read; ``short``: the small copy waited
    twice (8 of the 12 KiB: ``head`` is not read, and 4 KiB stay on the semaphore);
    ``over``: the big copy waited twice (16 KiB, more than ever lands); ``""``: each copy
    waited once before anything is read."""
    small = pltpu.make_async_copy(first(x_ref), head, sem)
    big = pltpu.make_async_copy(x_ref, whole, sem)
    small.start()  # fix: mixed_sizes_read mixed_sizes_short mixed_sizes_over
    big.start()  # fix: mixed_sizes_read mixed_sizes_short mixed_sizes_over
    if mistake == "over":
        big.wait()
    else:
        small.wait()
    if mistake == "read":
        head[...] = head[...] * 2.0
    if mistake == "short":
        small.wait()
    else:
        big.wait()
    if not mistake:
        head[...] = head[...] * 2.0
    write_out(whole, o_ref, out_sem)


def mixed_sizes_safedma(
    x_ref: D, o_ref: D, head: D, whole: D, sem: S, out_sem: S, *, mistake: str
) -> None:
    small = sd.LocalCopy(first(x_ref), head, sem).start()  # fix: mixed_sizes_read
    big = sd.LocalCopy(x_ref, whole, sem).start()  # fix: mixed_sizes_read
    small.wait()
    if mistake == "read":  # the small copy's wait may have counted the big copy's bytes
        head[...] = head[...] * 2.0
    big.wait()
    if mistake != "read":
        head[...] = head[...] * 2.0
    sd.LocalCopy(whole, o_ref, out_sem).start().wait()


def _mixed_sizes(kernel: Any, *, safedma: bool, mistake: str) -> Program:
    from tests.corpus._blocks import BLOCK, CHUNK, F32, RING, kernel_call

    body = functools.partial(kernel, mistake=mistake)
    functools.update_wrapper(body, kernel)
    per_device = kernel_call(
        body,
        lambda: [pltpu.VMEM((CHUNK, BLOCK[1]), F32), block(), *dma(2)],
        name=f"mixed_sizes_{mistake or 'fix'}",
        safedma=safedma,
    )
    spec = jax.ShapeDtypeStruct((BLOCK[0] * RING, BLOCK[1]), F32)
    return Program(per_device, (spec,), ring(RING, AXIS))


def _both_sizes(error: str, *says: str) -> Raises:
    """verify names both copies sharing the semaphore, each by its line and size."""
    return Raises(
        error,
        says=("copies of different sizes", *says),
        matches=(
            r"started at \S+:\d+ \([^)]*\) \(4096 bytes\)",
            r"started at \S+:\d+ \([^)]*\) \(8192 bytes\)",
        ),
        one_of=(ALL, ("sem",)),
        kind="SimulationError",
    )


_MIXED = {
    "read": _both_sizes("RaceDetectedError", "whichever land first"),
    "short": _both_sizes("LeftoverSemaphoreError", "holds 4096 bytes"),
    "over": _both_sizes("UnsatisfiableWaitError", "for 8192 bytes"),
}

CASES += [
    Case(
        f"mixed_sizes_{mistake}-bug-pltpu",
        "shared_semaphores",
        "written for this suite",
        functools.partial(_mixed_sizes, mixed_sizes_pltpu, safedma=False, mistake=mistake),
        {"verify": verdict},
        fix=f"mixed_sizes_{mistake}",
        tags=frozenset({"mixed_sizes", "pltpu", "bug"}),
    )
    for mistake, verdict in _MIXED.items()
]
CASES += [
    Case(
        "mixed_sizes_read-bug-safedma",
        "shared_semaphores",
        "written for this suite",
        functools.partial(_mixed_sizes, mixed_sizes_safedma, safedma=True, mistake="read"),
        {"verify": _MIXED["read"]},
        fix="mixed_sizes_read",
        tags=frozenset({"mixed_sizes", "safedma", "bug"}),
    ),
    *(
        Case(
            f"mixed_sizes-fix-{flavour}",
            "shared_semaphores",
            "written for this suite",
            functools.partial(
                _mixed_sizes,
                mixed_sizes_safedma if flavour == "safedma" else mixed_sizes_pltpu,
                safedma=flavour == "safedma",
                mistake="",
            ),
            {"verify": Ok(report={"devices": 4, "dmas": 12})},
            tags=frozenset({"mixed_sizes", flavour, "fix"}),
        )
        for flavour in ("pltpu", "safedma")
    ),
]
