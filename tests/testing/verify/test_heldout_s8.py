"""Patterns of kernels from other authors that verify had never seen (session 8).

docs/held-out.md, "Kernels from other authors (session 8, verify)", lists the kernels
and verdicts. Each kernel here is written for this file in raw pltpu and keeps one
author's DMA/semaphore protocol with the compute reduced to nothing; each correct one
must verify clean and each seeded mistake must be caught, naming this file's line.

* a copy whose source nothing wrote (``emit_pipeline`` copies in an input block
  that is the kernel's own output, garbage at the first step, which the body
  overwrites without reading: tpu-inference's reduce-scatter matmul accumulates
  into HBM scratch outputs this way): garbage moves with the copy and is an error
  only where it is read, naming the copy that brought it;
* a bidirectional ring reduce-scatter over a ``(devices + 1, 2)`` grid whose two
  phases interleave the leftward and rightward rings, HBM scratch outputs in two
  slots, capacity credits on REGULAR semaphores behind a double barrier
  (tpu-inference ``kernels/collectives/reduce_scatter_matmul.py``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    RaceDetectedError,
    SignalAfterExitError,
    UnwrittenReadError,
    abstract_mesh,
    verify,
)

F32 = jnp.float32
HERE = r"test_heldout_s8\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)
MESH = pl.DeviceIdType.MESH


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ------------------------------------------------ a copy of a source nothing wrote


def _staged(after: str) -> Any:
    """Copy a staging buffer nothing wrote into ``buf``, then ``after`` with ``buf``.

    ``overwrite``: write all of ``buf`` before copying it out (the copied garbage is
    never used: clean). ``read``: copy ``buf`` out (R6 at the kernel's return, naming
    both copies). ``over_written``: ``buf`` was written first, and the garbage lands on
    it before it is copied out (R6 too).
    """

    def kernel(x_hbm: Any, o_hbm: Any, stage: Any, buf: Any, sem: Any) -> None:
        if after == "over_written":
            pltpu.sync_copy(x_hbm, buf)
        c = pltpu.make_async_copy(stage, buf, sem)  # stage: nothing wrote it
        c.start()
        c.wait()
        if after == "overwrite":
            pltpu.sync_copy(x_hbm, buf)
        pltpu.sync_copy(buf, o_hbm)

    return pl.pallas_call(
        kernel,
        out_shape=_s(16, 128),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((16, 128), F32), pltpu.VMEM((16, 128), F32)]
        + [pltpu.SemaphoreType.DMA],
    )


def test_a_copy_of_garbage_that_is_overwritten_unread_is_clean() -> None:
    assert verify(_staged("overwrite"), _s(16, 128)).dmas == 3


@pytest.mark.parametrize("after", ["read", "over_written"])
def test_garbage_a_copy_brought_is_reported_where_it_is_read(after: str) -> None:
    with pytest.raises(UnwrittenReadError) as err:
        verify(_staged(after), _s(16, 128))
    text = str(err.value)
    assert "the kernel returns output o_hbm[0:16, 0:128]" in text, text
    assert re.search(rf"the copy at \S*{HERE}.*filled it from buf\[0:16, 0:128\]", text), text
    assert "filled it from stage[0:16, 0:128], which nothing wrote" in text, text


# ------------------------------------ a bidirectional reduce-scatter ring with credits

LEFT, RIGHT = 0, 1


def _signal(sem: Any, to: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=(to,), device_id_type=MESH)


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
            barrier = pltpu.get_barrier_semaphore()
            _signal(barrier, left)
            _signal(barrier, right)
            pl.semaphore_wait(barrier, 2)

            def second(again: Any) -> None:
                _signal(again, left)
                _signal(again, right)
                pl.semaphore_wait(again, 2)

            pl.run_scoped(second, pltpu.SemaphoreType.REGULAR)
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
    assert text in message and "test_heldout_s8.py:" in message, message
    assert "device " in message, message
