"""A kernel half migrated to safedma: copies started with safedma, waited in raw pltpu.

The kernel-scope check (T7) pairs the waits made through safedma with their
starts, and reads the rest from the body's jaxpr: a raw
``pltpu.make_async_copy(...).wait()`` on the copy's semaphore slot waits it,
at the top of the body or inside ``pl.when``, ``fori_loop`` or
``run_scoped``. A raw wait on another slot does not, and safedma's own waits
are never mistaken for raw ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
Kernel = Callable[..., None]


def call(kernel: Kernel, scratch: Sequence[object]) -> Callable[[jax.Array], jax.Array]:
    return sd.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(X.shape, X.dtype),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=list(scratch),
        interpret=True,
    )


def trace(kernel: Kernel, scratch: Sequence[object]) -> None:
    jax.eval_shape(call(kernel, scratch), X)


def started_by_safedma_waited_raw(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def test_a_raw_wait_waits_a_safedma_copy_and_the_kernel_runs() -> None:
    out = call(started_by_safedma_waited_raw, [sd.dma_semaphore()])(X)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(X))


def test_a_raw_wait_under_pl_when_counts() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x_ref, o_ref, sem).start()

        @pl.when(jnp.int32(0) == 0)
        def _() -> None:
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    trace(kernel, [sd.dma_semaphore()])


def test_a_raw_wait_in_a_later_fori_loop_counts() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sems: sd.SemArray) -> None:
        for i in range(2):
            sd.LocalCopy(x_ref, o_ref, sems.at[i]).start()

        def wait(i: jax.Array, carry: None) -> None:
            pltpu.make_async_copy(x_ref, o_ref, sems.at[i]).wait()

        jax.lax.fori_loop(0, 2, wait, None)

    trace(kernel, [sd.dma_semaphores(2)])


def test_a_raw_wait_inside_run_scoped_counts() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef) -> None:
        def scoped(sem: sd.SemRef) -> None:
            sd.LocalCopy(x_ref, o_ref, sem).start()
            pltpu.make_async_copy(x_ref, o_ref, sem).wait()

        pl.run_scoped(scoped, pltpu.SemaphoreType.DMA(()))

    trace(kernel, [])


def test_a_raw_wait_on_another_slot_does_not_discharge_the_copy() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sems: sd.SemArray) -> None:
        sd.LocalCopy(x_ref, o_ref, sems.at[0]).start()  # never waited
        pltpu.make_async_copy(x_ref, o_ref, sems.at[1]).start()
        pltpu.make_async_copy(x_ref, o_ref, sems.at[1]).wait()

    with pytest.raises(sd.CopyNeverWaitedError, match=r"started at .*test_raw_waits.py"):
        trace(kernel, [sd.dma_semaphores(2)])


def test_safedmas_own_wait_is_not_taken_for_a_raw_one() -> None:
    """Two copies on one slot, one handle waited: the other is still a leak (T7)."""

    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sem: sd.SemRef) -> None:
        sd.LocalCopy(x_ref, o_ref, sem).start()  # never waited
        sd.LocalCopy(x_ref, o_ref, sem).start().wait()

    with pytest.raises(sd.CopyNeverWaitedError, match="1 copy was started and never waited"):
        trace(kernel, [sd.dma_semaphore()])


def test_safedmas_own_wait_in_a_branch_is_not_taken_for_a_raw_one() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sems: sd.SemArray) -> None:
        sd.LocalCopy(x_ref, o_ref, sems.at[0]).start()  # never waited
        handle = sd.LocalCopy(x_ref, o_ref, sems.at[1]).start()

        @pl.when(jnp.int32(0) == 0)
        def _() -> None:
            handle.wait()

        @pl.when(jnp.int32(0) != 0)
        def _() -> None:
            handle.wait()

    with pytest.raises(sd.CopyNeverWaitedError, match="1 copy was started and never waited"):
        trace(kernel, [sd.dma_semaphores(2)])


def test_a_raw_wait_in_a_block_discharges_only_the_semaphore_it_waits() -> None:
    # The block (a pl.when) receives both arrays; its raw wait is on `other` only. Before
    # Formerly every semaphore a block with a raw wait inside receives counted as waited,
    # so an emit_pipeline (whose own waits are raw) beside a copy hid a missing wait.
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sems: sd.SemArray, other: sd.SemArray) -> None:
        sd.LocalCopy(x_ref, o_ref, sems.at[0]).start()

        @pl.when(sd.read(other.at[1]) == 0)  # any traced condition
        def _block() -> None:
            sd.LocalCopy(x_ref, o_ref, sems.at[1]).start().wait()
            pltpu.make_async_copy(x_ref, o_ref, other.at[0]).start()
            pltpu.make_async_copy(x_ref, o_ref, other.at[0]).wait()

    with pytest.raises(sd.CopyNeverWaitedError, match=r"started at .*test_raw_waits.py"):
        trace(kernel, [sd.dma_semaphores(2), sd.dma_semaphores(2)])


def test_a_raw_wait_in_a_block_on_the_copys_array_still_counts() -> None:
    def kernel(x_ref: sd.DataRef, o_ref: sd.DataRef, sems: sd.SemArray, other: sd.SemArray) -> None:
        sd.LocalCopy(x_ref, o_ref, sems.at[0]).start()

        @pl.when(sd.read(other.at[1]) == 0)
        def _block() -> None:
            pltpu.make_async_copy(x_ref, o_ref, other.at[0]).start()
            pltpu.make_async_copy(x_ref, o_ref, other.at[0]).wait()
            pltpu.make_async_copy(x_ref, o_ref, sems.at[0]).wait()

    trace(kernel, [sd.dma_semaphores(2), sd.dma_semaphores(2)])
