"""Semaphores returned by one call and used by a later one under verify.

* a REGULAR semaphore returned by one call (after an all-device barrier) and signalled
  remotely by a later call with ``skip_device_barrier``: it exists from the call that
  returned it;
* a start/done split whose done call rebuilds the descriptor on its own scratch
  semaphore: the deadlock message points at the count the start left and says to return
  the semaphore.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import DeadlockError, SignalAfterExitError, abstract_mesh, verify

F32 = jnp.float32
HERE = r"test_returned_semaphores\.py:\d+"
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
X = jax.ShapeDtypeStruct((8, 128), F32)


# ------------------------------------- a returned semaphore signalled by a later call

N = 4


def _signal_returned_semaphore(*, barrier: bool) -> Any:
    """Call 1 returns a REGULAR semaphore (behind an all-device barrier when
    ``barrier``); call 2, without a device barrier, signals it on every device."""

    def alloc_kernel(sem_out: Any) -> None:
        del sem_out
        if barrier:
            b = pltpu.get_barrier_semaphore()
            for d in range(N):
                pl.semaphore_signal(b, device_id=d)
            pl.semaphore_wait(b, N)

    def use_kernel(x_ref: Any, sem: Any, o_ref: Any) -> None:
        for d in range(N):
            pl.semaphore_signal(sem, device_id=d)
        pl.semaphore_wait(sem, N)
        o_ref[...] = x_ref[...]

    def fn(x: Any) -> Any:
        sem = pl.pallas_call(
            alloc_kernel,
            in_specs=[],
            out_specs=SEM,
            out_shape=pltpu.SemaphoreType.REGULAR(()),
            compiler_params=pltpu.CompilerParams(collective_id=0)
            if barrier
            else pltpu.CompilerParams(skip_device_barrier=True),
        )()
        return pl.pallas_call(
            use_kernel,
            in_specs=[VMEM, SEM],
            out_specs=VMEM,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(skip_device_barrier=True),
        )(x, sem)

    return fn


def test_a_returned_semaphore_exists_from_the_call_that_returned_it() -> None:
    report = verify(_signal_returned_semaphore(barrier=True), X, mesh=abstract_mesh((N,), ("x",)))
    assert report.signals == 2 * N * N


def test_a_returned_semaphore_signalled_before_its_owner_entered_is_caught() -> None:
    with pytest.raises(SignalAfterExitError, match=HERE):
        verify(_signal_returned_semaphore(barrier=False), X, mesh=abstract_mesh((N,), ("x",)))


ANY = pl.BlockSpec(memory_space=pl.ANY)


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------ a start/done split that rebuilds its semaphore


def _start_done(*, future: bool) -> Any:
    """Start a copy in one call and wait for it in the next.

    Correct: the start call returns its semaphore (a DMA future) and the done call
    waits on it. Broken (a runtime gate in the wild): each call allocates its own
    scratch semaphore and the done call rebuilds the descriptor on it.
    """

    def start_kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    def done_kernel(x_ref: Any, d_ref: Any, sem: Any, o_ref: Any) -> None:
        del o_ref
        pltpu.make_async_copy(x_ref, d_ref, sem).wait()

    sem_spec = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)

    def fn(x: Any) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        if future:
            d, sem = pl.pallas_call(
                start_kernel,
                in_specs=[ANY],
                out_specs=(ANY, sem_spec),
                out_shape=(out, pltpu.SemaphoreType.DMA(())),
            )(x)
            return pl.pallas_call(
                done_kernel,
                in_specs=[ANY, ANY, sem_spec],
                out_specs=ANY,
                out_shape=out,
                input_output_aliases={1: 0},
            )(x, d, sem)
        d = pl.pallas_call(
            start_kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=out,
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        )(x)
        return pl.pallas_call(
            lambda x_ref, d_ref, o_ref, sem: done_kernel(x_ref, d_ref, sem, o_ref),
            in_specs=[ANY, ANY],
            out_specs=ANY,
            out_shape=out,
            scratch_shapes=[pltpu.SemaphoreType.DMA],
            input_output_aliases={1: 0},
        )(x, d)

    return fn


def test_a_start_done_split_through_a_returned_semaphore_verifies() -> None:
    report = verify(_start_done(future=True), _s(8, 128))
    assert (report.dmas, report.waits) == (1, 1)


def test_a_done_call_on_its_own_scratch_semaphore_hangs_and_says_why() -> None:
    with pytest.raises(DeadlockError, match=HERE) as err:
        verify(_start_done(future=False), _s(8, 128))
    assert "scratch semaphores do not outlive their call" in str(err.value)
