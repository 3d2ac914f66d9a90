"""DMA futures: a copy started by one ``pallas_call`` and waited by a later one (the
semaphore handed on as an output, source and destination aliased).

The pattern of jax's TPU async tests (tests/pallas/tpu_pallas_async_test.py) and of
vLLM's KV-cache transfer: ``sd.start_async`` / ``sd.finish_async`` build the raw pair of
calls, checked by ``@sd.checked_futures``. The raw spelling: two futures in flight
across kernel boundaries, and one whose done kernel forgets its wait (jax's interpreter
cannot run either: simulate refuses them).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma import DataRef, SemRef
from tests.corpus._calls import TPU, X
from tests.corpus._case import OK, Case, Ok, Program, Raises, Unsupported

HBM = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
DST = jax.ShapeDtypeStruct(X.shape, X.dtype)
JAX_ASYNC = "jax's Pallas TPU async tests (tpu_pallas_async_test.py)"

# ---------------------------------------------------------------- the halves


def future_start(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()


def future_done(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


def future_done_by_size(x: DataRef, o: DataRef, sem: SemRef) -> None:
    sd.wait_bytes(sem, o)


@sd.checked_futures
def copy_through_future(x: jax.Array) -> jax.Array:
    future = sd.start_async(future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    y = x * 2  # work overlapped with the copy
    del y
    return sd.finish_async(future_done, future)


def copy_through_future_raw(x: jax.Array) -> jax.Array:
    def start_kernel(x_ref: Any, aliased_x_ref: Any, o_ref: Any, sem: Any) -> None:
        del aliased_x_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    x, out, sem = pl.pallas_call(
        start_kernel,
        out_shape=(
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            pltpu.SemaphoreType.DMA(()),
        ),
        in_specs=[HBM],
        out_specs=(HBM, HBM, SEM),
        input_output_aliases={0: 0},
    )(x)

    def done_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o_ref: Any) -> None:
        del aliased_o_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    result: jax.Array = pl.pallas_call(
        done_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM, HBM, SEM],
        out_specs=HBM,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return result


def future_step(future: sd.DmaFuture) -> sd.DmaFuture:
    """Finish one future and start the next from its result (a staggered chain)."""
    y = sd.finish_async(future_done, future)
    return sd.start_async(future_start, y, dst=jax.ShapeDtypeStruct(y.shape, y.dtype))


@sd.checked_futures
def staggered_futures(x: jax.Array) -> jax.Array:
    future = sd.start_async(future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    for _ in range(3):
        future = future_step(future)
    return sd.finish_async(future_done, future)


@sd.checked_futures
def future_through_a_loop(x: jax.Array) -> jax.Array:
    first = sd.start_async(future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    last = jax.lax.fori_loop(0, 3, lambda _, f: future_step(f), first, unroll=2)
    return sd.finish_async(future_done, last)


@sd.checked_futures
def finished_by_size(x: jax.Array) -> jax.Array:
    return sd.finish_async(future_done_by_size, sd.start_async(future_start, x, dst=DST))


# ---------------------------------------------------------------- a VMEM destination


@sd.checked_futures
def into_vmem(x: jax.Array) -> jax.Array:
    dst = jax.ShapeDtypeStruct(x.shape, x.dtype)
    future = sd.start_async(future_start, x, dst=dst, dst_memory_space=pltpu.VMEM)
    return sd.finish_async(future_done, future)


def into_vmem_raw(x: jax.Array) -> jax.Array:
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)

    def start(x_ref, alias, o_ref, sem):  # type: ignore[no-untyped-def]
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    def done(x_ref, o_ref, sem, alias):  # type: ignore[no-untyped-def]
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    x, out, sem = pl.pallas_call(
        start,
        out_shape=(
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            pltpu.VMEM(x.shape, x.dtype),
            pltpu.SemaphoreType.DMA(()),
        ),
        in_specs=[HBM],
        out_specs=(HBM, vmem, SEM),
        input_output_aliases={0: 0},
    )(x)
    result: jax.Array = pl.pallas_call(
        done,
        out_shape=pltpu.VMEM(x.shape, x.dtype),
        in_specs=[HBM, vmem, SEM],
        out_specs=vmem,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return result


# ---------------------------------------------------------------- seeded mistakes


@sd.checked_futures
def dropped(x: jax.Array) -> jax.Array:
    sd.start_async(future_start, x, dst=DST)  # fix: future_dropped
    return x


@sd.checked_futures
def finished_twice(x: jax.Array) -> jax.Array:
    future = sd.start_async(future_start, x, dst=DST)
    sd.finish_async(future_done, future)
    return sd.finish_async(future_done, future)


def starts_nothing(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
    del x, o, sem


def waits_nothing(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
    del x, o, sem


def finished_by_a_kernel_that_waits_nothing(x: jax.Array) -> jax.Array:
    return sd.finish_async(waits_nothing, sd.start_async(future_start, x, dst=DST))


def start_of_a_row(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x_ref.at[0], o_ref, sem).start()


def start_leaking_a_scoped_copy(x: sd.DataRef, o: sd.DataRef, sem: sd.SemRef) -> None:
    """Only the future's semaphore is handed on: another copy left in flight is reported."""

    def body(other: sd.SemRef) -> None:
        sd.LocalCopy(x, o, other).start()

    sd.LocalCopy(x, o, sem).start()
    sd.run_scoped(body, sd.dma_semaphore())


def _started_by(kernel: Any) -> Program:
    return Program(lambda x: sd.start_async(kernel, x, dst=DST).buffer, (X,))


def _lowered(fn: Any) -> Program:
    return Program(fn, (X,), lower=True)


def _kernel_count(check: Any) -> Ok:
    return Ok(check=lambda kernels, program: check(len(kernels)))


def _waits_its_buffer_by_size(kernels: Any, program: Program) -> None:
    start, done = kernels
    assert "%arg1, %arg1" in done.module  # the self-descriptor wait on the buffer


def _is(n: int) -> Any:
    def check(count: int) -> None:
        assert count == n, count

    return check


def _even_and_at_least_4(count: int) -> None:
    assert count >= 4 and count % 2 == 0, count  # starts and dones pair up


# The sanitizer runs in jax's TPU interpreter, which cannot hand a semaphore from one
# pallas_call to the next: it refuses a future by kernel and semaphore.
FUTURE = Unsupported(r"kernel \w+ takes or returns the semaphore \w+ \(a DMA future")

CASES: list[Case] = [
    Case(
        "future_pair",
        "futures",
        JAX_ASYNC,
        lambda: Program(copy_through_future, (X,)),
        {"mosaic": OK, "verify": Ok(report={"dmas": 1}), "sanitize": FUTURE},
        twin=lambda: Program(copy_through_future_raw, (X,)),
    ),
    Case(
        "future_chain",
        "futures",
        "vLLM KV-cache transfer (staggered futures), written for this suite",
        lambda: _lowered(staggered_futures),
        {  # 4 starts, 4 dones
            "trace": _kernel_count(_is(8)),
            "verify": Ok(report={"dmas": 4}),
            "sanitize": FUTURE,
        },
    ),
    Case(
        "future_through_a_loop",
        "futures",
        "written for this suite",
        lambda: _lowered(future_through_a_loop),
        {"trace": _kernel_count(_even_and_at_least_4)},
    ),
    Case(
        "future_finished_by_size",
        "futures",
        JAX_ASYNC,
        lambda: _lowered(finished_by_size),
        {"trace": Ok(check=_waits_its_buffer_by_size)},
    ),
    Case(
        "future_into_vmem",
        "futures",
        JAX_ASYNC,
        lambda: Program(into_vmem, (jax.ShapeDtypeStruct((8, 128), jnp.float32),), TPU),
        {"mosaic": OK},
        twin=lambda: Program(into_vmem_raw, (jax.ShapeDtypeStruct((8, 128), jnp.float32),), TPU),
    ),
    Case(
        "future_dropped",
        "futures",
        "written for this suite",
        lambda: Program(dropped, (X,)),
        {"trace": Raises("^FutureDroppedError$", says=("future_start",))},
    ),
    Case(
        "future_finished_twice",
        "futures",
        "written for this suite",
        lambda: Program(finished_twice, (X,)),
        {
            "trace": Raises(
                "^FutureConsumedTwiceError$", matches=("finished at .* and again at",), line=False
            )
        },
    ),
    Case(
        "future_start_kernel_starts_nothing",
        "futures",
        "written for this suite",
        lambda: _started_by(starts_nothing),
        {
            "trace": Raises(
                "^FutureNotWaitedError$", says=("'starts_nothing' started no copy",), line=False
            )
        },
    ),
    Case(
        "future_done_kernel_waits_nothing",
        "futures",
        "written for this suite",
        lambda: Program(finished_by_a_kernel_that_waits_nothing, (X,)),
        {"trace": Raises("^FutureNotWaitedError$", says=("never waited",), line=False)},
    ),
    Case(
        "future_start_of_a_row_into_the_block",
        "futures",
        "written for this suite",
        lambda: _started_by(start_of_a_row),
        {
            "trace": Raises(
                "^CopyShapeMismatchError$", matches=(r"x_ref.at\[...\] float32\[128\]",), line=False
            )
        },
    ),
    Case(
        "future_start_kernel_leaks_another_copy",
        "futures",
        "written for this suite",
        lambda: _started_by(start_leaking_a_scoped_copy),
        {"trace": Raises("^CopyNeverWaitedError$", line=False)},
    ),
]


# ---------------------------------------------------------------- raw futures, two in flight

Future = tuple[jax.Array, jax.Array]
X16 = jax.ShapeDtypeStruct((16, 128), jnp.float32)


def _start_kernel(x_ref: Any, aliased_x: Any, o_ref: Any, sem: Any) -> None:
    del aliased_x  # x stays alive (and unwritten by XLA) until the copy is waited
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _done_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o: Any) -> None:
    del aliased_o
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def _done_without_wait_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o: Any) -> None:
    del x_ref, o_ref, sem, aliased_o  # seeded bug: the future is never waited


def copy_start(x: jax.Array) -> tuple[jax.Array, Future]:
    """Start copying ``x``; returns ``x`` (aliased, still being read) and the future."""
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, sem = pl.pallas_call(
        _start_kernel,
        out_shape=(shape, shape, pltpu.SemaphoreType.DMA(())),
        in_specs=[HBM],
        out_specs=(HBM, HBM, SEM),
        input_output_aliases={0: 0},
    )(x)
    return x, (out, sem)


def copy_done(x: jax.Array, future: Future, *, wait: bool = True) -> jax.Array:
    """Wait the future of ``copy_start(x)``; returns the copy (aliased to the in-flight buffer)."""
    out, sem = future
    kernel = _done_kernel if wait else _done_without_wait_kernel
    result: jax.Array = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM, HBM, SEM],
        out_specs=HBM,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return result


def two_futures(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two copies in flight across kernel boundaries, waited in a later kernel each."""
    x, first = copy_start(x)
    x2, second = copy_start(x)
    return copy_done(x, first), copy_done(x2, second)


def two_futures_one_never_waited(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Seeded bug: the second future's done kernel forgets its wait."""
    x, first = copy_start(x)
    x2, second = copy_start(x)
    return copy_done(x, first), copy_done(x2, second, wait=False)  # fix: raw_future_never_waited


# A line of this file (not of safedma's own _futures.py) is named.
THIS_FILE = r"(?<![\w])futures\.py:\d+"
ACROSS_CALLS = r"lives across pallas_calls"

CASES += [
    # Why this is verify's job: jax's interpreter stops at the semaphore output.
    Case(
        "two_raw_futures_across_pallas_calls",
        "futures",
        JAX_ASYNC,
        lambda: Program(two_futures, (X16,)),
        {
            # Two copies started in the start kernels, both waited in the done kernels.
            "verify": Ok(report={"dmas": 2, "waits": 2}),
            "simulate": Unsupported(ACROSS_CALLS),
            "sanitize": FUTURE,
        },
    ),
    Case(
        "raw_future_never_waited",
        "futures",
        JAX_ASYNC,
        lambda: Program(two_futures_one_never_waited, (X16,)),
        {
            "verify": Raises(
                "LeftoverSemaphoreError|RaceDetectedError|Unwritten",
                matches=(THIS_FILE,),
                kind="SimulationError",
            ),
            "sanitize": FUTURE,
        },
    ),
]


# ---------------------------------------------------------------- a start/wait split


def start_then_wait(wait: bool) -> Any:
    """A start call returns its semaphore with the copy in flight, a wait call waits it
    (google-deepmind/simply's ragged all-to-all). Seeded: the wait call forgets the wait
    and returns the output while the copy still writes it; the race names the wait
    call's line, not only the kernel's name."""
    any_ = pl.BlockSpec(memory_space=pl.ANY)

    def start_kernel(x_ref: Any, o_in: Any, o_ref: Any, sem: Any) -> None:
        del o_in  # aliased to o_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    def wait_kernel(x_ref: Any, o_in: Any, sem: Any, o_ref: Any) -> None:
        del o_in
        if wait:  # fix: wait_call_without_its_wait
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()  # fix: wait_call_without_its_wait

    def fn(x: Any, out: Any) -> Any:
        o, sem = pl.pallas_call(
            start_kernel,
            out_shape=[jax.ShapeDtypeStruct(out.shape, out.dtype), pltpu.SemaphoreType.DMA(())],
            in_specs=[any_, any_],
            out_specs=[any_, SEM],
            input_output_aliases={1: 0},
        )(x, out)
        return pl.pallas_call(
            wait_kernel,
            out_shape=jax.ShapeDtypeStruct(out.shape, out.dtype),
            in_specs=[any_, any_, SEM],
            out_specs=any_,
            input_output_aliases={1: 0},
        )(x, o, sem)

    return fn


SIMPLY = "google-deepmind/simply ragged all-to-all (a start/wait split), written for this suite"
X8 = jax.ShapeDtypeStruct((8, 128), jnp.float32)

CASES += [
    Case(
        "start_wait_split",
        "futures",
        SIMPLY,
        lambda: Program(start_then_wait(True), (X8, X8)),
        {"verify": Ok(report={"dmas": 1, "waits": 1}), "sanitize": FUTURE},
    ),
    Case(
        "wait_call_without_its_wait",
        "futures",
        SIMPLY,
        lambda: Program(start_then_wait(False), (X8, X8)),
        {
            "verify": Raises(
                "^RaceDetectedError$",
                matches=(r"end of kernel wait_kernel \([^)]*futures\.py:\d+",),
            ),
            "sanitize": FUTURE,
        },
    ),
]
