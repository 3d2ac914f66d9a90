"""Barriers under verify: who a barrier hears from orders the copies after it, on devices
and between the cores of a ``pl.kernel``.

* an entry barrier that waits for a signal from the device that writes into it rather
  than from the device it writes to (a course lab): R10, saying which devices are known;
* a barrier semaphore taken outside any kernel: a clear unsupported error naming the line;
* the barrier semaphore inside a ``pl.kernel`` body over a TensorCoreMesh (jax's core_map
  guide): each core has its own, ``{'core': j}`` signals reach core j's; a ``pl.kernel``
  without a collective id and the device barrier it skips.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma import MissingCollectiveIdError
from safedma.testing import (
    LeftoverSemaphoreError,
    SignalAfterExitError,
    VerificationUnsupportedError,
    abstract_mesh,
    verify,
)

F32 = jnp.float32
HERE = r"test_barriers\.py:\d+"
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _with_collective_id(kernel: Any) -> Any:
    """``kernel(x_ref, o_ref)`` as a function of x, with ``collective_id=0``."""

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)

    return fn


# ----------------------------------------- a barrier that waits for the wrong peer

RING = 4


def _ring_push(*, signal_source: bool) -> Any:
    """Push ``x`` to the right neighbour behind a one-round barrier.

    Correct: tell the device that writes into me (my left) that I entered, and wait
    for my right neighbour to say the same. Broken (a course lab's shape): signal
    the device I write to and wait for one signal, which only says my *left*
    neighbour entered.
    """

    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me = jax.lax.axis_index("x")
        right = jax.lax.rem(me + 1, RING)
        left = jax.lax.rem(me + RING - 1, RING)
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id=(left if signal_source else right,))
        pl.semaphore_wait(barrier, 1)
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(right,))
        copy.start()
        copy.wait()

    def fn(x: Any) -> Any:
        return pl.pallas_call(
            kernel,
            in_specs=[ANY],
            out_specs=ANY,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)

    return fn


def test_a_barrier_that_hears_from_the_target_orders_the_push() -> None:
    mesh = abstract_mesh((RING,), ("x",))
    report = verify(_ring_push(signal_source=True), _s(RING * 8, 128), mesh=mesh, in_specs=P("x"))
    assert report.remote_dmas == RING


def test_a_barrier_that_hears_from_the_source_is_r10_and_says_who_is_known() -> None:
    mesh = abstract_mesh((RING,), ("x",))
    with pytest.raises(SignalAfterExitError, match=HERE) as err:
        verify(_ring_push(signal_source=False), _s(RING * 8, 128), mesh=mesh, in_specs=P("x"))
    assert "knows only that device" in str(err.value)


# ------------------------------------------- semaphores outside any kernel


def _handshake(*, wait: bool) -> None:
    other = jax.lax.rem(jax.lax.axis_index("x") + 1, 2)
    sem = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(sem, 1, device_id=(other,))
    if wait:
        pl.semaphore_wait(sem, 1)


def test_a_barrier_outside_any_kernel_is_unsupported_naming_the_line() -> None:
    def fn(x: Any) -> Any:
        _handshake(wait=True)  # jax's newer "pallas ops in jit" style, no pallas_call
        return x

    mesh = abstract_mesh((2,), ("x",))
    with pytest.raises(VerificationUnsupportedError, match=HERE) as err:
        verify(fn, _s(16, 128), mesh=mesh, in_specs=P("x"))
    assert "outside any Pallas kernel" in str(err.value)


@pytest.mark.parametrize("wait", [True, False])
def test_the_same_handshake_inside_a_kernel_is_checked(wait: bool) -> None:
    def kernel(x_ref: Any, o_ref: Any) -> None:
        _handshake(wait=wait)
        o_ref[...] = x_ref[...]

    fn = _with_collective_id(kernel)
    mesh = abstract_mesh((2,), ("x",))
    if wait:
        assert verify(fn, _s(16, 128), mesh=mesh, in_specs=P("x")).signals == 2
    else:
        with pytest.raises(SignalAfterExitError, match=HERE):  # R8: lands after exit
            verify(fn, _s(16, 128), mesh=mesh, in_specs=P("x"))


# -------------------------------------- a barrier between the cores of pl.kernel


def _core_swap(*, wait: bool, collective_id: int | None = 0) -> Any:
    """Each core copies its half to VMEM and sends it to the other core behind the
    barrier semaphore (the shape of jax's core_map guide), then writes it back."""
    tc = (
        pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
        if hasattr(pltpu, "TensorCoreMesh")
        and "num_cores" in str(getattr(pltpu.TensorCoreMesh, "__dataclass_fields__", ""))
        else pltpu.create_tensorcore_mesh("core", num_cores=2)
    )

    def kernel(x: Any, o: Any, mine: Any, theirs: Any, sem: Any, send: Any, recv: Any) -> None:
        core = jax.lax.axis_index("core")
        half = pl.ds(core * 128, 128)
        pltpu.async_copy(x.at[:, half], mine, sem).wait()
        barrier = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(barrier, 1, device_id={"core": 1 - core})
        if wait:
            pl.semaphore_wait(barrier, 1)
        swap = pltpu.make_async_remote_copy(mine, theirs, send, recv, device_id={"core": 1 - core})
        swap.start()
        swap.wait()
        pltpu.async_copy(theirs, o.at[:, half], sem).wait()

    def fn(x: Any) -> Any:
        return pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=tc,
            scratch_types=[pltpu.VMEM((8, 128), F32)] * 2 + [pltpu.SemaphoreType.DMA] * 3,
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(x)

    return fn


@pytest.mark.parametrize("invocations", [1, 2])
def test_a_barrier_between_the_cores_of_a_pl_kernel_orders_the_swap(invocations: int) -> None:
    report = verify(_core_swap(wait=True), _s(8, 256), invocations=invocations)
    assert report.remote_dmas == 2 * invocations


def test_the_core_swap_without_its_barrier_wait_is_caught() -> None:
    with pytest.raises(SignalAfterExitError, match=HERE) as err:
        verify(_core_swap(wait=False), _s(8, 256))
    assert "synchronise the cores first" in str(err.value)


def test_the_core_swap_without_a_collective_id_names_pl_kernel_in_the_fix() -> None:
    with pytest.raises(MissingCollectiveIdError, match=HERE) as err:
        verify(_core_swap(wait=True, collective_id=None), _s(8, 256))
    assert "to the pl.kernel (T9)" in str(err.value)


def _device_swap(**params: Any) -> Any:
    """A one-core pl.kernel on each of two devices that sends its block to the other
    device, with no barrier of its own: Mosaic's default device barrier orders it."""

    def body(x_ref: Any, o_ref: Any, sems: Any) -> None:
        peer = 1 - jax.lax.axis_index("x")
        copy = pltpu.make_async_remote_copy(
            x_ref, o_ref, sems.at[0], sems.at[1], device_id=(peer,),
            device_id_type=pl.DeviceIdType.MESH,
        )  # fmt: skip
        copy.start()
        copy.wait()

    out = jax.ShapeDtypeStruct((8, 128), F32)
    sems = [pltpu.SemaphoreType.DMA((2,))]
    shapes: dict[str, Any] = (
        {"out_type": out, "scratch_types": sems}  # jax 0.12
        if "out_type" in inspect.signature(pl.kernel).parameters
        else {"out_shape": out, "scratch_shapes": sems}  # jax 0.10
    )
    return pl.kernel(
        body,
        mesh=pltpu.create_tensorcore_mesh("core", num_cores=1),
        compiler_params=pltpu.CompilerParams(**params),
        **shapes,
    )


def test_a_pl_kernel_without_a_collective_id_is_behind_the_device_barrier() -> None:
    report = verify(
        _device_swap(),
        _s(16, 128),
        mesh=abstract_mesh((2,), ("x",)),
        in_specs=P("x"),
        out_specs=P("x"),
    )
    assert report.remote_dmas == 2


def test_a_pl_kernel_that_skips_the_device_barrier_is_r10() -> None:
    with pytest.raises(SignalAfterExitError, match="before it has entered"):
        verify(
            _device_swap(skip_device_barrier=True),
            _s(16, 128),
            mesh=abstract_mesh((2,), ("x",)),
            in_specs=P("x"),
            out_specs=P("x"),
        )


def test_a_barrier_signalled_twice_names_the_signals_left_over() -> None:
    def kernel(x_ref: Any, o_ref: Any) -> None:
        other = jax.lax.rem(jax.lax.axis_index("x") + 1, 2)
        sem = pltpu.get_barrier_semaphore()
        pl.semaphore_signal(sem, 1, device_id=(other,))
        pl.semaphore_signal(sem, 1, device_id=(other,))  # one too many
        pl.semaphore_wait(sem, 1)
        o_ref[...] = x_ref[...]

    fn = _with_collective_id(kernel)
    with pytest.raises(LeftoverSemaphoreError, match=HERE):
        verify(fn, _s(16, 128), mesh=abstract_mesh((2,), ("x",)), in_specs=P("x"))
