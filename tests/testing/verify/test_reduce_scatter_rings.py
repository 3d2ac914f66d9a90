"""Reduce-scatter rings with capacity credits under verify.

* a bidirectional ring over a ``(devices + 1, 2)`` grid whose two phases interleave the
  leftward and rightward rings, HBM scratch outputs in two slots, credits on REGULAR
  semaphores behind a double barrier (tpu-inference
  ``kernels/collectives/reduce_scatter_matmul.py``);
* ejkernel's bidirectional reduce-scatter matmul: every step credits both neighbours and
  waits both credits before both sends; only the pair makes it safe (interleaving them
  races from three devices).

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import RaceDetectedError, SignalAfterExitError, abstract_mesh, verify

F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)
MESH = pl.DeviceIdType.MESH


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------ a bidirectional reduce-scatter ring with credits

LEFT, RIGHT = 0, 1


def _signal(sem: Any, to: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=(to,), device_id_type=MESH)


def _double_barrier(left: Any, right: Any) -> None:
    """Both neighbours, twice (the second round on a scoped REGULAR semaphore)."""
    barrier = pltpu.get_barrier_semaphore()
    _signal(barrier, left)
    _signal(barrier, right)
    pl.semaphore_wait(barrier, 2)

    def again(second: Any) -> None:
        _signal(second, left)
        _signal(second, right)
        pl.semaphore_wait(second, 2)

    pl.run_scoped(again, pltpu.SemaphoreType.REGULAR)


def _rs_kernel(
    x_ref: Any,
    o_ref: Any,
    lsc: Any,
    rsc: Any,
    lrecv: Any,
    lsend: Any,
    rrecv: Any,
    rsend: Any,
    lcap: Any,
    rcap: Any,
    *,
    n: int,
    seed: str,
) -> None:
    """Grid (n + 1, 2): phase LEFT computes the leftward ring's partial sum into its
    working slot and forwards the rightward ring's, phase RIGHT the other way round;
    ``lsc``/``rsc`` are HBM outputs of two slots (working, receiving) used as scratch.
    """
    me = lax.axis_index("x")
    right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
    outer, phase = pl.program_id(0), pl.program_id(1)
    g = outer * 2 + phase
    steps = pl.num_programs(0) * 2
    first = g == 0
    last = g == steps - 1
    middle = jnp.logical_not(jnp.logical_or(first, last))
    lw = lax.rem(outer, 2)
    rw = lax.rem(outer if seed == "wrong_slot" else (g + 1) // 2, 2)
    m, h = lsc.shape[1], lsc.shape[2]
    lcopy = pltpu.make_async_remote_copy(
        lsc.at[lw], lsc.at[1 - lw], lsend, lrecv, device_id=(left,), device_id_type=MESH
    )
    rcopy = pltpu.make_async_remote_copy(
        rsc.at[rw], rsc.at[1 - rw], rsend, rrecv, device_id=(right,), device_id_type=MESH
    )

    @pl.when(first)
    def _() -> None:
        if seed != "no_barrier":
            _double_barrier(left, right)
        _signal(rcap, left)  # the left neighbour may send to us (rightwards)
        _signal(lcap, right)

    @pl.when(jnp.logical_and(middle, phase == LEFT))
    def _() -> None:
        if seed != "no_credit":
            pl.semaphore_wait(rcap, 1)
        rcopy.start()

    @pl.when(jnp.logical_and(middle, phase == RIGHT))
    def _() -> None:
        pl.semaphore_wait(lcap, 1)
        lcopy.start()

    def accumulate(x_blk: Any, prev_blk: Any, z_blk: Any) -> None:
        @pl.when(outer == 0)
        def _() -> None:
            z_blk[...] = x_blk[...]  # prev_blk is the output's garbage here: unread

        @pl.when(outer != 0)
        def _() -> None:
            z_blk[...] = prev_blk[...] + x_blk[...]

    spec = pl.BlockSpec((8, h), lambda i: (i, 0))
    acc = pltpu.emit_pipeline(accumulate, in_specs=[spec, spec], out_specs=spec, grid=(m // 8,))

    @pl.when(jnp.logical_and(g < steps - 2, phase == LEFT))
    def _() -> None:
        rows = x_ref.at[pl.ds(lax.rem(outer + me, n) * m, m), pl.ds(0, h)]
        acc(rows, lsc.at[lw], lsc.at[lw])

    @pl.when(jnp.logical_and(g < steps - 2, phase == RIGHT))
    def _() -> None:
        rows = x_ref.at[pl.ds(lax.rem(me - outer + n, n) * m, m), pl.ds(h, h)]
        acc(rows, rsc.at[rw], rsc.at[rw])

    def move(a: Any, b: Any) -> None:
        b[...] = a[...]

    save = pltpu.emit_pipeline(move, in_specs=[spec], out_specs=spec, grid=(m // 8,))

    @pl.when(jnp.logical_and(g >= steps - 2, phase == LEFT))
    def _() -> None:
        save(lsc.at[lw], o_ref.at[:, pl.ds(0, h)])

    @pl.when(jnp.logical_and(g >= steps - 2, phase == RIGHT))
    def _() -> None:
        save(rsc.at[rw], o_ref.at[:, pl.ds(h, h)])

    @pl.when(jnp.logical_and(middle, phase == LEFT))
    def _() -> None:
        if seed != "no_wait":
            rcopy.wait()
        _signal(rcap, left)

    @pl.when(jnp.logical_and(middle, phase == RIGHT))
    def _() -> None:
        lcopy.wait()
        _signal(lcap, right)

    @pl.when(jnp.logical_and(outer == pl.num_programs(0) - 1, phase == LEFT))
    def _() -> None:
        pl.semaphore_wait(rcap, 1)  # the last credit, so the semaphore ends at zero

    @pl.when(jnp.logical_and(outer == pl.num_programs(0) - 1, phase == RIGHT))
    def _() -> None:
        pl.semaphore_wait(lcap, 1)


def _reduce_scatter(x: jax.Array, *, n: int, seed: str) -> jax.Array:
    rows, k = x.shape
    m, h = rows // n, k // 2
    out: Any = pl.pallas_call(
        functools.partial(_rs_kernel, n=n, seed=seed),
        out_shape=(_s(m, k), _s(2, m, h), _s(2, m, h)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[ANY],
            out_specs=[ANY, ANY, ANY],
            grid=(n + 1, 2),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 4 + [pltpu.SemaphoreType.REGULAR] * 2,
        ),
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)
    return out[0]


def _verify_rs(n: int, seed: str = "", invocations: int = 1) -> Any:
    return verify(
        functools.partial(_reduce_scatter, n=n, seed=seed),
        _s(16 * n * n, 256),
        mesh=abstract_mesh((n,), ("x",), tpu="v5e"),  # emit_pipeline asks for the TPU
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=invocations,
    )


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_the_credit_ring_reduce_scatter_is_clean(n: int, invocations: int) -> None:
    report = _verify_rs(n, invocations=invocations)
    assert report.devices == n and report.dmas > 0


@pytest.mark.parametrize(
    ("seed", "error", "text"),
    [
        ("no_wait", RaceDetectedError, "data race"),
        ("wrong_slot", RaceDetectedError, "nothing orders the two"),
        ("no_credit", SignalAfterExitError, "after it left the kernel"),
        ("no_barrier", SignalAfterExitError, "before it has entered this kernel call"),
    ],
)
@pytest.mark.parametrize("n", [2, 4])
def test_seeded_mistakes_in_the_credit_ring_are_caught(
    seed: str, error: type[Exception], text: str, n: int
) -> None:
    with pytest.raises(error) as err:
        _verify_rs(n, seed)
    message = str(err.value)
    assert text in message and "test_reduce_scatter_rings.py:" in message, message
    assert "device " in message, message


# ------------- a reduce-scatter whose credits come from both neighbours before both sends


def _credit_pair_kernel(
    x_ref: Any,
    out_ref: Any,
    slots: Any,
    partial: Any,
    send_l: Any,
    recv_l: Any,
    send_r: Any,
    recv_r: Any,
    copy_sem: Any,
    lcap: Any,
    rcap: Any,
    *,
    n: int,
    half: int,
    seed: str,
) -> None:
    """ejkernel's bidirectional reduce-scatter (M split into top and bottom halves): each
    step signals a credit to each neighbour, waits both credits, then starts both sends.
    The credit for the leftward send comes from the right neighbour, so a send is safe only
    because the other credit (from the receiver) is waited before it too."""
    step = pl.program_id(0)
    me = lax.axis_index("x")
    left, right = lax.rem(me + n - 1, n), lax.rem(me + 1, n)
    lw = lax.rem(step, 2)
    rw = 2 + lax.rem(step, 2)

    def sync(src: Any, dst: Any) -> None:
        copy = pltpu.make_async_copy(src, dst, copy_sem)
        copy.start()
        copy.wait()

    def compute() -> None:  # the two half-block products, reduced to copies
        sync(x_ref.at[pl.ds(lax.rem(me + step + 1, n) * 2 * half, half)], partial.at[0])
        sync(
            x_ref.at[pl.ds(lax.rem(me - step - 1 + 2 * n, n) * 2 * half + half, half)],
            partial.at[1],
        )

    @pl.when(step == 0)
    def _() -> None:
        if seed != "no_barrier":
            _double_barrier(left, right)
        compute()
        sync(partial.at[0], slots.at[lw])
        sync(partial.at[1], slots.at[rw])

    @pl.when(step > 0)
    def _() -> None:
        _signal(lcap, left)
        _signal(rcap, right)
        to_left = pltpu.make_async_remote_copy(
            slots.at[1 - lw], slots.at[lw], send_l, recv_l, device_id=(left,), device_id_type=MESH
        )
        to_right = pltpu.make_async_remote_copy(
            slots.at[5 - rw], slots.at[rw], send_r, recv_r, device_id=(right,), device_id_type=MESH
        )
        if seed == "interleaved":  # each send behind the credit named after its direction
            pl.semaphore_wait(lcap, 1)
            to_left.start()
            pl.semaphore_wait(rcap, 1)
            to_right.start()
        else:
            pl.semaphore_wait(lcap, 1)
            pl.semaphore_wait(rcap, 1)
            to_left.start()
            to_right.start()
        compute()
        to_left.wait()
        to_right.wait()
        sync(partial.at[0], slots.at[lw])  # the accumulation, reduced to a copy
        sync(partial.at[1], slots.at[rw])

        @pl.when(step == pl.num_programs(0) - 1)
        def _() -> None:
            sync(slots.at[lw], out_ref.at[pl.ds(0, half)])
            sync(slots.at[rw], out_ref.at[pl.ds(half, half)])


def _verify_credit_pair(n: int, seed: str = "", invocations: int = 1) -> Any:
    def fn(x: jax.Array) -> Any:
        half = x.shape[0] // n // 2
        out, _, _ = pl.pallas_call(
            functools.partial(_credit_pair_kernel, n=n, half=half, seed=seed),
            out_shape=(_s(2 * half, 128), _s(4, half, 128), _s(2, half, 128)),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY],
                out_specs=[ANY, ANY, ANY],
                grid=(n,),
                scratch_shapes=[pltpu.SemaphoreType.DMA] * 5 + [pltpu.SemaphoreType.REGULAR] * 2,
            ),
            compiler_params=pltpu.CompilerParams(
                collective_id=0, dimension_semantics=("arbitrary",)
            ),
        )(x)
        return out

    return verify(
        fn,
        _s(n * n * 16, 128),
        mesh=abstract_mesh((n,), ("x",)),
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=invocations,
    )


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_both_credits_before_both_sends_is_clean(n: int, invocations: int) -> None:
    assert _verify_credit_pair(n, invocations=invocations).devices == n


def test_interleaved_credits_are_safe_on_two_devices_only() -> None:
    # On two devices the left and right neighbour are one device: its credit comes from
    # the receiver either way. From three, a send waits only the far neighbour's credit.
    assert _verify_credit_pair(2, "interleaved").devices == 2
    with pytest.raises(RaceDetectedError) as err:
        _verify_credit_pair(4, "interleaved")
    assert "test_reduce_scatter_rings.py:" in str(err.value), err.value


def test_the_credit_pair_without_its_barrier_is_caught() -> None:
    with pytest.raises(SignalAfterExitError, match="before it has entered"):
        _verify_credit_pair(4, "no_barrier")
