"""simulate names semaphores and buffers by the kernel's parameters, as verify does.

Interpret mode numbers semaphores (2000, 2001, ...) and keys buffers by id; simulate's
messages name them from the traced program instead: ``sems[1]``, ``flag``, ``buf``.
Each case checks the message of a leftover, an unsatisfiable wait or a race, and where
verify reports the same mistake, that verify uses the same name. Where the program
does not say which parameter it is (a semaphore ``pl.run_scoped`` allocates), the
number stays.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    UnsatisfiableWaitError,
    abstract_mesh,
    simulate,
    simulated_mesh,
    verify,
)

HBM = pl.BlockSpec(memory_space=pl.ANY)
X = jnp.zeros((8, 128), jnp.float32)


def _call(kernel: Callable[..., None], scratch: Sequence[Any]) -> Callable[[jax.Array], jax.Array]:
    def call(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=list(scratch),
        )(x)
        return out

    return call


def _message(error: type[SimulationError], run: Callable[[], object]) -> str:
    with pytest.raises(error) as caught:
        run()
    return str(caught.value)


def _leaves_a_copy_and_a_signal(x_ref: Any, o_ref: Any, buf: Any, sems: Any, flag: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[0])
    copy.start()
    copy.wait()
    pltpu.make_async_copy(x_ref, buf, sems.at[1]).start()  # never waited
    pl.semaphore_signal(flag, 1)  # never waited


LEFTOVER = _call(
    _leaves_a_copy_and_a_signal,
    [
        pltpu.VMEM((8, 128), jnp.float32),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.REGULAR,
    ],
)


def test_a_leftover_names_the_semaphore_element_and_parameter() -> None:
    text = _message(LeftoverSemaphoreError, lambda: simulate(LEFTOVER, X))
    assert "device 0: DMA semaphore sems[1] holds 4096 bytes" in text
    assert "device 0: REGULAR semaphore flag holds 1" in text
    assert not re.search(r"semaphore \d", text), text
    leftovers = {item.name for item in _leftovers(LEFTOVER)}
    assert leftovers == {"sems[1]", "flag"}
    # verify names the same semaphore the same way
    checked = _message(SimulationError, lambda: verify(LEFTOVER, X))
    assert "semaphore sems[1]" in checked


def _leftovers(fn: Callable[[jax.Array], jax.Array]) -> Sequence[Any]:
    with pytest.raises(LeftoverSemaphoreError) as caught:
        simulate(fn, X)
    return caught.value.leftovers


def _waits_a_copy_never_started(x_ref: Any, o_ref: Any, sems: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[0, 1])
    copy.start()
    copy.wait()
    pltpu.make_async_copy(x_ref, o_ref, sems.at[1, 0]).wait()  # nothing signals it


def test_an_unsatisfiable_wait_names_the_semaphore_it_waits_on() -> None:
    stuck = _call(_waits_a_copy_never_started, [pltpu.SemaphoreType.DMA((2, 2))])
    with pytest.raises(UnsatisfiableWaitError) as caught:
        simulate(stuck, X, timeout_s=20)
    assert [w.name for w in caught.value.waits] == ["sems[1, 0]"]
    assert "on DMA semaphore sems[1, 0] for 4096 bytes" in str(caught.value)
    assert "sems[1, 0]" in _message(SimulationError, lambda: verify(stuck, X))


def _reads_a_copy_destination_early(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, buf, sem)
    copy.start()
    buf[...] = buf[...] + 1  # the copy into buf is still in flight
    copy.wait()
    back = pltpu.make_async_copy(buf, o_ref, sem)
    back.start()
    back.wait()


def test_a_race_names_the_buffer_a_device_touched() -> None:
    racy = _call(
        _reads_a_copy_destination_early,
        [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
    )
    with pytest.raises(RaceDetectedError) as caught:
        simulate(racy, X)
    assert caught.value.races[0].name == "buf"
    assert str(caught.value).startswith("data race (R1): a read of VMEM buffer buf on device 0")
    assert "buffer buf" in _message(SimulationError, lambda: verify(racy, X))


def _copies_into_the_output_without_waiting(x_ref: Any, o_ref: Any, sem: Any) -> None:
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def test_a_race_with_the_output_copy_back_names_the_output() -> None:
    racy = _call(_copies_into_the_output_without_waiting, [pltpu.SemaphoreType.DMA(())])
    with pytest.raises(RaceDetectedError) as caught:
        simulate(racy, X)
    assert caught.value.races[0].name == "o_ref"
    assert "a read of HBM buffer o_ref on device 0" in str(caught.value)


def _plain(x_ref: Any, o_ref: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


def _second(x_ref: Any, o_ref: Any, flag: Any, sems: Any, buf: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[0])
    copy.start()
    copy.wait()
    pltpu.make_async_copy(x_ref, buf, sems.at[1]).start()  # never waited


def test_each_kernel_call_of_a_program_is_named_by_its_own_parameters() -> None:
    """Two kernels number their semaphores from the same start; the copy's line says
    which kernel the leftover is in (the first has one semaphore, named ``sem``)."""
    first = _call(_plain, [pltpu.SemaphoreType.DMA(())])
    second = _call(
        _second,
        [
            pltpu.SemaphoreType.REGULAR,
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM((8, 128), jnp.float32),
        ],
    )
    (item,) = _leftovers(lambda x: second(first(x)))
    assert (item.kernel, item.name) == (1, "sems[1]")


def _forwards_its_operands(*refs: Any) -> None:
    x_ref, o_ref, buf, sems = refs
    copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[0])
    copy.start()
    copy.wait()
    pltpu.make_async_copy(x_ref, buf, sems.at[1]).start()  # never waited


def test_a_kernel_of_star_args_names_its_semaphore_by_role_as_verify_does() -> None:
    fn = _call(
        _forwards_its_operands,
        [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    (item,) = _leftovers(fn)
    assert item.name is not None and item.name.startswith("scratch 1 (parameter 3: ")
    assert item.name.endswith("[1]")
    assert item.name in _message(SimulationError, lambda: verify(fn, X))


def _run_scoped_leftover(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()

    def body(scoped: Any) -> None:
        pltpu.make_async_copy(x_ref, buf, scoped).start()  # never waited

    pl.run_scoped(body, pltpu.SemaphoreType.DMA(()))


def test_a_semaphore_the_kernel_allocates_keeps_its_number() -> None:
    """Not a parameter: no name is better than a wrong one (``sem`` is the kernel's)."""
    fn = _call(
        _run_scoped_leftover, [pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA(())]
    )
    (item,) = _leftovers(fn)
    assert item.name is None
    assert f"DMA semaphore {item.semaphore_id} holds" in str(LeftoverSemaphoreError([item]))


def _ring(x_ref: Any, o_ref: Any, buf: Any, send_sem: Any, recv_sem: Any) -> None:
    me = jax.lax.axis_index("x")
    remote = pltpu.make_async_remote_copy(
        x_ref, buf, send_sem, recv_sem, device_id={"x": (me + 1) % jax.lax.axis_size("x")}
    )
    remote.start()
    remote.wait_send()  # the receiver never waits recv_sem
    local = pltpu.make_async_copy(x_ref, o_ref, send_sem)
    local.start()
    local.wait()


def test_a_leftover_on_every_device_of_a_ring_names_the_receive_semaphore() -> None:
    ring = _call(
        _ring,
        [
            pltpu.VMEM((8, 128), jnp.float32),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
        ],
    )
    x = jnp.zeros((4 * 8, 128), jnp.float32)
    with pytest.raises(LeftoverSemaphoreError) as caught:
        simulate(ring, x, mesh=simulated_mesh((4,), ("x",)), in_specs=P("x"), out_specs=P("x"))
    assert {item.name for item in caught.value.leftovers} == {"recv_sem"}
    assert len(caught.value.leftovers) == 4
    checked = _message(
        SimulationError,
        lambda: verify(
            ring,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=abstract_mesh((4,), ("x",)),
            in_specs=P("x"),
            out_specs=P("x"),
        ),
    )
    assert "recv_sem" in checked
