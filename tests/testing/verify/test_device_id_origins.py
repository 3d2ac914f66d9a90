"""A copy sent to the wrong device is reported at the line that computed its device id.

The error shows where the bytes land (two copies in one device's buffer, a receive no
copy feeds); the message follows the kernel's data flow back from the copy's device id
to the user's arithmetic, whatever it is (``lax.rem``, ``%``, ``jnp.where``) and
through a ``pl.when``'s operands, a loop's carry and a scalar ref. Each kernel's wrong
line is marked ``# fix: <form>``; the same kernels with the right arithmetic verify
clean.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import SimulationError, abstract_mesh, verify
from tests.corpus._case import library_lines, marked_lines, names_line

HERE = Path(__file__)
HBM = pl.BlockSpec(memory_space=pl.ANY)
BLOCK = (8, 128)
RING = abstract_mesh((4,), ("x",))

# Every form sends each device's block to its right neighbour when ``wrong`` is False;
# when True, to ``(me + 1) mod (n - 1)`` or the like: device 1 (or 2) receives two
# copies and another device none.
Peer = Callable[[jax.Array, jax.Array, bool, Any], jax.Array]


def with_rem(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    return lax.rem(me + 1, n - 1 if wrong else n)  # fix: with_rem


def with_modulo(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    right = me + 1
    return right % (n - 1) if wrong else right % n  # fix: with_modulo


def with_where(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    return jnp.where(me == n - 1, 1 if wrong else 0, me + 1)  # fix: with_where


def through_a_loop(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    def step(i: jax.Array, peer: jax.Array) -> jax.Array:
        return lax.rem(peer + 1, n - 1 if wrong else n)  # fix: through_a_loop

    found: jax.Array = lax.fori_loop(0, 1, step, me)
    return found


def through_a_scalar_ref(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    slot[0] = lax.rem(me + 1, n - 1 if wrong else n)  # fix: through_a_scalar_ref
    peer: jax.Array = slot[0]
    return peer


FORMS: dict[str, Peer] = {
    f.__name__: f for f in (with_rem, with_modulo, with_where, through_a_loop, through_a_scalar_ref)
}


def send_kernel(peer_of: Peer, wrong: bool, *, under_when: bool) -> Any:
    """Send this device's block into its peer's ``buf``, wait, copy ``buf`` out; with
    ``under_when`` the copy is made inside a ``pl.when`` (the id is its operand)."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, slot: Any, send: Any, recv: Any) -> None:
        me = lax.axis_index("x")
        peer = peer_of(me, lax.axis_size("x"), wrong, slot)

        def copy() -> None:
            c = pltpu.make_async_remote_copy(x_ref, buf, send, recv, device_id={"x": peer})
            c.start()
            c.wait()

        if under_when:
            pl.when(me >= 0)(copy)
        else:
            copy()
        out = pltpu.make_async_copy(buf, o_ref, send)
        out.start()
        out.wait()

    return kernel


# A staging block, an SMEM slot for the peer, the send and receive semaphores.
SEND_SCRATCH = (
    pltpu.VMEM(BLOCK, jnp.float32),
    pltpu.SMEM((1,), jnp.int32),
    pltpu.SemaphoreType.DMA(()),
    pltpu.SemaphoreType.DMA(()),
)


def program(kernel: Any, scratch: tuple[Any, ...] = SEND_SCRATCH) -> Any:
    """Each device's ``kernel(x_hbm, o_hbm, *scratch)`` over its shard, in HBM."""

    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=list(scratch),
        )(x)
        return out

    return per_device


X = jax.ShapeDtypeStruct((BLOCK[0] * 4, BLOCK[1]), jnp.float32)


@pytest.mark.parametrize("under_when", [False, True], ids=["plain", "under_when"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_wrong_device_id_names_the_line_that_computed_it(form: str, under_when: bool) -> None:
    with pytest.raises(SimulationError) as caught:
        verify(program(send_kernel(FORMS[form], True, under_when=under_when)), X, mesh=RING)
    message = str(caught.value)
    assert "its device id is computed at" in message, message
    assert names_line(message, HERE, marked_lines(HERE, form)), message
    assert not library_lines(message), message


@pytest.mark.parametrize("under_when", [False, True], ids=["plain", "under_when"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_right_device_id_in_every_form_verifies(form: str, under_when: bool) -> None:
    report = verify(program(send_kernel(FORMS[form], False, under_when=under_when)), X, mesh=RING)
    assert report.devices == 4 and report.remote_dmas == 4, report


def test_self_send_says_the_copy_went_to_itself() -> None:
    """Device 0 sends to its own id where it meant device 1: device 1's receive wait
    never returns, and the message says where device 0's copy went and why."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, send: Any, recv: Any) -> None:
        me = lax.axis_index("x")
        peer = me * 1  # fix: self_send

        @pl.when(me == 0)
        def _() -> None:
            c = pltpu.make_async_remote_copy(x_ref, buf, send, recv, device_id={"x": peer})
            c.start()
            c.wait_send()

        @pl.when(me == 1)
        def _() -> None:
            pltpu.make_async_copy(x_ref, buf, recv).wait()

        out = pltpu.make_async_copy(x_ref, o_ref, send)
        out.start()
        out.wait()

    scratch = (
        pltpu.VMEM(BLOCK, jnp.float32),
        pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.DMA(()),
    )
    with pytest.raises(SimulationError) as caught:
        verify(program(kernel, scratch), X, mesh=RING)
    message = str(caught.value)
    assert "to itself" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "self_send")), message


@pytest.mark.filterwarnings("ignore:.*device_id_type.*:DeprecationWarning")
def test_a_logical_device_id_is_followed_too() -> None:
    """A LOGICAL id (one integer, not a mesh dict) is followed the same way."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, slot: Any, send: Any, recv: Any) -> None:
        me = lax.axis_index("x")
        peer = lax.rem(me + 1, lax.axis_size("x") - 1)  # fix: logical_id
        c = pltpu.make_async_remote_copy(
            x_ref, buf, send, recv, device_id=peer, device_id_type=pl.DeviceIdType.LOGICAL
        )
        c.start()
        c.wait()
        out = pltpu.make_async_copy(buf, o_ref, send)
        out.start()
        out.wait()

    with pytest.raises(SimulationError) as caught:
        verify(program(kernel), X, mesh=RING)
    message = str(caught.value)
    assert names_line(message, HERE, marked_lines(HERE, "logical_id")), message


def test_a_signal_to_the_wrong_device_names_the_line_that_computed_it() -> None:
    """Each device signals the flag of the device it meant to be its right neighbour and
    waits for its left neighbour's signal: with the wrong wraparound device 0 is never
    signalled and its wait never returns."""

    def kernel(x_ref: Any, o_ref: Any, flag: Any, sem: Any) -> None:
        me = lax.axis_index("x")
        n = lax.axis_size("x")
        right = jnp.where(me == n - 1, 1, me + 1)  # fix: signal_wraparound
        pl.semaphore_signal(flag, 1, device_id={"x": right})
        pl.semaphore_wait(flag, 1)
        out = pltpu.make_async_copy(x_ref, o_ref, sem)
        out.start()
        out.wait()

    scratch = (pltpu.SemaphoreType.REGULAR(()), pltpu.SemaphoreType.DMA(()))
    with pytest.raises(SimulationError) as caught:
        verify(program(kernel, scratch), X, mesh=RING)
    message = str(caught.value)
    assert "Nothing sent by device id was addressed to device 0 (x=0)" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "signal_wraparound")), message


def without_a_modulo(me: jax.Array, n: jax.Array, wrong: bool, slot: Any) -> jax.Array:
    return me + 1 if wrong else (me + 1) % n  # fix: without_a_modulo


@pytest.mark.parametrize("under_when", [False, True], ids=["plain", "under_when"])
def test_a_neighbour_past_the_last_device_is_off_the_mesh(under_when: bool) -> None:
    """Pallas turns a mesh coordinate into a device by the axes' strides, without wrapping
    around: the last device's ``me + 1`` is no device at all."""
    kernel = send_kernel(without_a_modulo, True, under_when=under_when)
    with pytest.raises(SimulationError) as caught:
        verify(program(kernel), X, mesh=RING)
    message = str(caught.value)
    assert "x=4 is outside the mesh" in message, message
    assert "% size" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "without_a_modulo")), message
    fixed = send_kernel(without_a_modulo, False, under_when=under_when)
    assert verify(program(fixed), X, mesh=RING).remote_dmas == 4


def test_a_signal_past_the_last_device_names_the_line_that_computed_its_id() -> None:
    """A barrier signal to ``me + 1`` without its modulo: the id is off the mesh on the
    last device, and the mistake is in the arithmetic, not in the signal's line."""

    def kernel(x_ref: Any, o_ref: Any, flag: Any, sem: Any) -> None:
        me = lax.axis_index("x")
        n = lax.axis_size("x")
        right = me + 1  # fix: signal_without_modulo
        left = lax.rem(me + n - 1, n)
        pl.semaphore_signal(flag, 1, device_id={"x": right})
        pl.semaphore_signal(flag, 1, device_id={"x": left})
        pl.semaphore_wait(flag, 2)
        out = pltpu.make_async_copy(x_ref, o_ref, sem)
        out.start()
        out.wait()

    scratch = (pltpu.SemaphoreType.REGULAR(()), pltpu.SemaphoreType.DMA(()))
    with pytest.raises(SimulationError) as caught:
        verify(program(kernel, scratch), X, mesh=RING)
    message = str(caught.value)
    assert "x=4 is outside the mesh" in message, message
    assert names_line(message, HERE, marked_lines(HERE, "signal_without_modulo")), message
