"""verify on the protocols of jax's distributed Pallas TPU guide (docs/pallas/tpu/distributed.md).

The kernels here are written for this test from the guide's description of
each protocol (which copies, which semaphores, which waits, in which order);
none of the guide's code is copied. Each is a correct kernel verify must prove
clean, called once and twice back to back (barrier and collective_id reuse),
and each has a seeded mistake verify must catch:

* right permute: one remote copy to the right neighbour, start then wait;
* ring all-gather over a grid of n - 1 steps with one receive semaphore per
  step (the guide's remedy for copies in flight on a shared semaphore);
* all-reduce over a double-buffered HBM scratch with a REGULAR capacity
  semaphore (the receiver tells its left neighbour it may send) behind the
  double barrier of jax PR #27963;
* bidirectional reduce-scatter: two accumulators travelling left and right
  over a (step, phase) grid, each direction with its own capacity semaphore;
* from jax's note on decomposed async operations: a permute started by one
  ``pallas_call`` that returns its semaphores and output (a DMA future) and
  finished by another.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import SimulationError, abstract_mesh, verify

AXIS = "x"
ROWS = 8
F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
HERE = __file__.rsplit("/", 1)[-1]


def _neighbours() -> tuple[jax.Array, jax.Array, jax.Array, int]:
    n = lax.axis_size(AXIS)
    me = lax.axis_index(AXIS)
    return me, lax.rem(me + 1, n), lax.rem(me + n - 1, n), n


def _to(device: jax.Array) -> dict[str, jax.Array]:
    return {AXIS: device}


# ------------------------------------------------------------------ right permute


def permute_kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any, *, wait: bool = True) -> None:
    _, right, _, _ = _neighbours()
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=_to(right))
    copy.start()
    if wait:
        copy.wait()
    else:
        copy.wait_send()  # seeded: the incoming copy is never waited


def permute(x: jax.Array, *, wait: bool = True) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        functools.partial(permute_kernel, wait=wait),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())] * 2,
    )(x)
    return out


# ------------------------------------------------------------------ all-gather


def gather_kernel(
    x_ref: Any, o_ref: Any, local_sem: Any, send: Any, recvs: Any, *, shared: bool = False
) -> None:
    step = pl.program_id(0)
    me, right, _, n = _neighbours()

    @pl.when(step == 0)
    def _() -> None:
        local = pltpu.make_async_copy(x_ref, o_ref.at[me], local_sem)
        local.start()
        local.wait()

    # Forward the slot received last step (our own at step 0) to the right; the left
    # neighbour meanwhile fills the slot one lower.
    slot = lax.rem(me - step + n, n)
    recv = recvs.at[0] if shared else recvs.at[step]
    copy = pltpu.make_async_remote_copy(
        o_ref.at[slot], o_ref.at[slot], send, recv, device_id=_to(right)
    )
    copy.start()
    copy.wait()


def gather(x: jax.Array, *, shared: bool = False) -> jax.Array:
    n = lax.axis_size(AXIS)
    out: jax.Array = pl.pallas_call(
        functools.partial(gather_kernel, shared=shared),
        out_shape=jax.ShapeDtypeStruct((n, *x.shape), x.dtype),
        grid=(n - 1,),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((n - 1,)),
        ],
    )(x)
    return out.reshape(n * x.shape[0], *x.shape[1:])


# ------------------------------------------------------------------ barriers


def _round(sem: Any, left: jax.Array, right: jax.Array) -> None:
    for peer in (left, right):
        pl.semaphore_signal(sem, 1, device_id=_to(peer))
    pl.semaphore_wait(sem, 2)


def neighbour_barrier(left: jax.Array, right: jax.Array, *, double: bool = True) -> None:
    """One round on the barrier semaphore, then (double) a second on a scoped REGULAR one."""
    _round(pltpu.get_barrier_semaphore(), left, right)
    if double:
        pl.run_scoped(lambda second: _round(second, left, right), pltpu.SemaphoreType.REGULAR)


# ------------------------------------------------------------------ all-reduce


def reduce_kernel(
    x_ref: Any,
    o_ref: Any,
    hbm: Any,
    copy_sem: Any,
    recv: Any,
    send: Any,
    capacity: Any,
    staging: Any,
    *,
    credit: bool = True,
    double: bool = True,
) -> None:
    step = pl.program_id(0)
    working = lax.rem(step, 2)
    receiving = 1 - working
    _, right, left, _ = _neighbours()

    @pl.when(step == 0)
    def _() -> None:
        neighbour_barrier(left, right, double=double)
        o_ref[...] = jnp.zeros_like(o_ref)
        first = pltpu.make_async_remote_copy(
            x_ref, hbm.at[working], send, recv, device_id=_to(right)
        )
        first.start()
        first.wait()

    if credit:
        pl.semaphore_signal(capacity, 1, device_id=_to(left))  # our working slot is free
    local = pltpu.make_async_copy(hbm.at[working], staging, copy_sem)
    local.start()
    if credit:
        pl.semaphore_wait(capacity, 1)  # the right neighbour may receive
    onward = pltpu.make_async_remote_copy(
        hbm.at[working], hbm.at[receiving], send, recv, device_id=_to(right)
    )
    onward.start()
    local.wait()
    o_ref[...] += staging[...]
    onward.wait()


def all_reduce(
    x: jax.Array, *, credit: bool = True, double: bool = True
) -> tuple[jax.Array, jax.Array]:
    n = lax.axis_size(AXIS)
    out: tuple[jax.Array, jax.Array] = pl.pallas_call(
        functools.partial(reduce_kernel, credit=credit, double=double),
        out_shape=(
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct((2, *x.shape), x.dtype),
        ),
        grid=(n,),
        in_specs=[VMEM],
        out_specs=[VMEM, ANY],
        scratch_shapes=[
            *[pltpu.SemaphoreType.DMA(())] * 3,
            pltpu.SemaphoreType.REGULAR(()),
            pltpu.VMEM(x.shape, x.dtype),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)
    return out


# ------------------------------------------------------------------ reduce-scatter


def scatter_kernel(
    x_ref: Any,
    o_ref: Any,
    hbm: Any,
    copy_sem: Any,
    left_recv: Any,
    left_send: Any,
    right_recv: Any,
    right_send: Any,
    left_capacity: Any,
    right_capacity: Any,
    acc: Any,
    *,
    credit: bool = True,
) -> None:
    step, phase = pl.program_id(0), pl.program_id(1)
    start = jnp.logical_and(step == 0, phase == 0)
    last = step == pl.num_programs(0) - 1
    working = lax.rem(step, 2)
    receiving = 1 - working
    me, right, left, n = _neighbours()
    half = x_ref.shape[1] // 2
    halves = (pl.ds(0, half), pl.ds(half, half))  # travels left, travels right
    mine = pl.ds(phase * half, half)
    sources = (lax.rem(me + step + 1, n), lax.rem(me - step - 1 + n, n))

    def to_left(src: Any, dst: Any) -> Any:
        return pltpu.make_async_remote_copy(src, dst, left_send, left_recv, device_id=_to(left))

    def to_right(src: Any, dst: Any) -> Any:
        return pltpu.make_async_remote_copy(src, dst, right_send, right_recv, device_id=_to(right))

    first_left = to_left(x_ref.at[me, halves[0]], hbm.at[working, halves[0]])
    first_right = to_right(x_ref.at[me, halves[1]], hbm.at[working, halves[1]])
    # The rightward copy carries the previous step's result into the next step's slot.
    onward_left = to_left(hbm.at[working, halves[0]], hbm.at[receiving, halves[0]])
    onward_right = to_right(hbm.at[receiving, halves[1]], hbm.at[working, halves[1]])

    @pl.when(start)
    def _() -> None:
        neighbour_barrier(left, right)
        o_ref[...] = jnp.zeros_like(o_ref)
        first_left.start()
        first_left.wait()
        first_right.start()
        pl.semaphore_signal(right_capacity, 1, device_id=_to(left))
        pl.semaphore_signal(left_capacity, 1, device_id=_to(right))

    @pl.when(jnp.logical_not(start))
    def _() -> None:
        @pl.when(phase == 0)
        def _() -> None:
            if credit:
                pl.semaphore_wait(right_capacity, 1)
            onward_right.start()

        @pl.when(phase == 1)
        def _() -> None:
            pl.semaphore_wait(left_capacity, 1)
            onward_left.start()

    fetch = pltpu.make_async_copy(hbm.at[working, mine], acc, copy_sem)
    fetch.start()
    fetch.wait()

    @pl.when(jnp.logical_not(last))
    def _() -> None:
        @pl.when(phase == 0)
        def _() -> None:
            acc[...] += x_ref[sources[0], halves[0]]

        @pl.when(phase == 1)
        def _() -> None:
            acc[...] += x_ref[sources[1], halves[1]]

    store = pltpu.make_async_copy(acc, hbm.at[working, mine], copy_sem)
    store.start()
    store.wait()

    @pl.when(start)
    def _() -> None:
        first_right.wait()

    @pl.when(jnp.logical_not(start))
    def _() -> None:
        @pl.when(phase == 0)
        def _() -> None:
            onward_right.wait()
            pl.semaphore_signal(right_capacity, 1, device_id=_to(left))

        @pl.when(phase == 1)
        def _() -> None:
            onward_left.wait()
            pl.semaphore_signal(left_capacity, 1, device_id=_to(right))

    @pl.when(last)
    def _() -> None:
        @pl.when(phase == 0)
        def _() -> None:
            o_ref[halves[0], :] = acc[...]
            if credit:
                pl.semaphore_wait(right_capacity, 1)

        @pl.when(phase == 1)
        def _() -> None:
            o_ref[halves[1], :] = acc[...]
            pl.semaphore_wait(left_capacity, 1)


def reduce_scatter(x: jax.Array, *, credit: bool = True) -> jax.Array:
    n = lax.axis_size(AXIS)
    blocks = x.reshape(n, x.shape[0] // n, *x.shape[1:])
    rows = blocks.shape[1]
    out: tuple[jax.Array, jax.Array] = pl.pallas_call(
        functools.partial(scatter_kernel, credit=credit),
        out_shape=(
            jax.ShapeDtypeStruct((rows, x.shape[1]), x.dtype),
            jax.ShapeDtypeStruct((2, rows, x.shape[1]), x.dtype),
        ),
        grid=(n, 2),
        in_specs=[VMEM],
        out_specs=[VMEM, ANY],
        scratch_shapes=[
            *[pltpu.SemaphoreType.DMA(())] * 5,
            *[pltpu.SemaphoreType.REGULAR(())] * 2,
            pltpu.VMEM((rows // 2, x.shape[1]), x.dtype),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(blocks)
    return out[0]


# ------------------------------------------------------------------ the tests

Program = Callable[[jax.Array], Any]


def _run(program: Program, n: int, rows: int, invocations: int = 1) -> Any:
    mesh = abstract_mesh((n,), (AXIS,))
    x = jax.ShapeDtypeStruct((n * rows, 128), F32)

    def body(block: jax.Array) -> Any:
        return program(block)

    return verify(body, x, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), invocations=invocations)


CORRECT: dict[str, tuple[Program, int]] = {
    "right_permute": (permute, ROWS),
    "all_gather": (gather, ROWS),
    "all_reduce": (lambda x: all_reduce(x)[0], ROWS),
    "reduce_scatter": (reduce_scatter, 0),  # rows: n blocks of 16
}


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", sorted(CORRECT))
def test_the_guides_protocols_verify_clean(name: str, n: int, invocations: int) -> None:
    program, rows = CORRECT[name]
    report = _run(program, n, rows or 16 * n, invocations)
    assert report.devices == n and report.dmas > 0


def _caught(program: Program, n: int, rows: int, invocations: int = 1) -> SimulationError:
    with pytest.raises(SimulationError) as caught:
        _run(program, n, rows, invocations)
    assert f"{HERE}:" in str(caught.value), caught.value
    return caught.value


def test_a_permute_that_never_waits_its_receive_is_caught() -> None:
    """The output is returned while the left neighbour's copy into it may still be in flight
    (verify's walk reports that first), and ``recv`` is left holding its bytes."""
    error = _caught(functools.partial(permute, wait=False), 4, ROWS)
    assert "o_ref" in str(error) or "recv" in str(error), error


@pytest.mark.parametrize("n", [4, 8])
def test_the_all_reduce_with_a_single_barrier_round_is_safe_twice_in_a_row(n: int) -> None:
    """Why the guide's double barrier is not needed for this protocol: a left neighbour
    cannot finish a call (and signal the barrier again) before our credit, which we send
    after our barrier wait; a right neighbour cannot before our copy. So our barrier wait
    is never released by a neighbour's next call (compare test_engine_protocols.py's
    one-directional permute, which has no credit and races from five devices)."""
    _run(lambda x: all_reduce(x, double=False)[0], n, ROWS, invocations=2)


def test_a_gather_on_one_receive_semaphore_is_caught() -> None:
    """The guide's reason for a receive semaphore per step: with one, a left neighbour a
    step ahead has two copies in flight on it, and the wait meant for the first may be
    released by the second's bytes while the first still writes the slot forwarded next."""
    _caught(functools.partial(gather, shared=True), 4, ROWS)


def test_an_all_reduce_without_capacity_credits_is_caught() -> None:
    """Without the credit a left neighbour a step ahead writes our working slot while we
    still read it (the guide's run-ahead race)."""
    _caught(lambda x: all_reduce(x, credit=False)[0], 4, ROWS)


def test_a_reduce_scatter_without_its_rightward_credits_is_caught() -> None:
    _caught(functools.partial(reduce_scatter, credit=False), 4, 64)


# ------------------------------------------------------------------ async remote copy (futures)
# jax's "Pallas async operations" note: a start kernel meets its right neighbour on the
# barrier semaphore (signal left, wait one), starts a remote copy to the right and returns
# both semaphores, its aliased input (kept alive) and the output being written; a done
# kernel takes them and waits both sides.


def start_kernel(x_ref: Any, send: Any, recv: Any, x_alias: Any, o_ref: Any) -> None:
    del x_alias
    _, right, left, _ = _neighbours()
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id=_to(left))
    pl.semaphore_wait(barrier, 1)
    pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=_to(right)).start()


def done_kernel(
    x_ref: Any, o_ref: Any, send: Any, recv: Any, o_alias: Any, *, wait_recv: bool = True
) -> None:
    del x_ref, o_alias
    pltpu.make_async_copy(o_ref, o_ref, send).wait()
    if wait_recv:
        pltpu.make_async_copy(o_ref, o_ref, recv).wait()


SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)


def async_permute(x: jax.Array, *, wait_recv: bool = True) -> jax.Array:
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)
    send, recv, x2, out = pl.pallas_call(
        start_kernel,
        out_shape=(pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(()), like, like),
        in_specs=[ANY],
        out_specs=(SEM, SEM, ANY, ANY),
        input_output_aliases={0: 2},
        compiler_params=pltpu.CompilerParams(collective_id=0, has_side_effects=True),
    )(x)
    result: jax.Array = pl.pallas_call(
        functools.partial(done_kernel, wait_recv=wait_recv),
        out_shape=like,
        in_specs=[ANY, ANY, SEM, SEM],
        out_specs=ANY,
        input_output_aliases={1: 0},
        compiler_params=pltpu.CompilerParams(has_side_effects=True),
    )(x2, out, send, recv)
    return result


@pytest.mark.parametrize("n", [2, 4])
def test_an_async_remote_copy_started_and_done_in_two_kernels_is_clean(n: int) -> None:
    assert _run(async_permute, n, ROWS).remote_dmas == n


def test_an_async_remote_copy_whose_receive_is_never_waited_is_caught() -> None:
    _caught(functools.partial(async_permute, wait_recv=False), 4, ROWS)
