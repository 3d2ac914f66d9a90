"""A context-parallel ring rotation (the construct of vLLM tpu-inference's
``rpa_v3_cp`` cache phase), written here in safedma and in raw pltpu.

Each device holds one block; over ``N`` rounds every device computes on the
block in its current slot while sending it to the next device's other slot.
Before sending again a device waits for the receiver's word that the slot it
will overwrite has been read (a REGULAR semaphore signalled upstream); the
first round needs no word, and the last round sends nothing. The send and the
receive are started in one ``pl.when`` block and waited in another, so the
safedma kernel waits through ``started_elsewhere()``.

Checked: the safedma kernel traces with no trace-time error, lowers to the raw
kernel's Mosaic, and both verify clean on 2, 4 and 8 devices, twice in a row;
the raw kernel's seeded mistakes (no wait for the word, one word too many, the
send into the slot being read) are caught by verify.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import RaceDetectedError, SimulationError, abstract_mesh, assert_same_mosaic
from safedma.testing import verify
from tests.support.ring_twins import ring_blocks, sharded

ROWS = 8
ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)


def _safe_kernel(n: int) -> Callable[..., None]:
    def kernel(
        x_ref: sd.DataRef,
        o_ref: sd.DataRef,
        buf: sd.DataRef,
        load_sem: sd.SemRef,
        sems: sd.SemArray,
        slot_free: sd.RegularSem,
    ) -> None:
        sd.LocalCopy(x_ref, buf.at[0], load_sem).start().wait()
        o_ref[...] = jnp.zeros_like(o_ref)

        def rotate(cur: jax.Array) -> sd.RemoteCopy[sd.Given, sd.Given]:
            return (
                sd.RemoteCopy(buf.at[cur], buf.at[1 - cur], sems.at[1])
                .with_send_sem(sems.at[0])
                .to(sd.neighbour("x"))
            )

        def round_(r: jax.Array, carry: None) -> None:
            cur = r % 2
            last = r == n - 1

            @pl.when(jnp.logical_and(r > 0, jnp.logical_not(last)))
            def _wait_for_the_slot() -> None:
                sd.wait(slot_free, 1)

            @pl.when(jnp.logical_not(last))
            def _send() -> None:
                rotate(cur).start()

            o_ref[...] += buf[cur]

            @pl.when(jnp.logical_not(last))
            def _finish() -> None:
                rotate(cur).started_elsewhere().wait()

                @pl.when(r < n - 2)
                def _free_the_slot() -> None:
                    sd.signal(slot_free, 1, device=sd.neighbour("x", -1))

            return carry

        jax.lax.fori_loop(0, n, round_, None)

    return kernel


def _raw_kernel(n: int, seed: str | None = None) -> Callable[..., None]:
    def kernel(x_ref: Any, o_ref: Any, buf: Any, load_sem: Any, sems: Any, slot_free: Any) -> None:
        load = pltpu.make_async_copy(x_ref, buf.at[0], load_sem)
        load.start()
        load.wait()
        o_ref[...] = jnp.zeros_like(o_ref)

        def rotate(cur: jax.Array) -> Any:
            dst = cur if seed == "send_into_the_slot_being_read" else 1 - cur
            nxt = {"x": (jax.lax.axis_index("x") + 1) % n}
            return pltpu.make_async_remote_copy(
                buf.at[cur], buf.at[dst], sems.at[0], sems.at[1], device_id=nxt
            )

        def round_(r: jax.Array, carry: None) -> None:
            cur = r % 2
            last = r == n - 1

            @pl.when(jnp.logical_and(r > 0, jnp.logical_not(last)))
            def _wait_for_the_slot() -> None:
                if seed != "no_wait_for_the_slot":
                    pl.semaphore_wait(slot_free, 1)

            @pl.when(jnp.logical_not(last))
            def _send() -> None:
                rotate(cur).start()

            o_ref[...] += buf[cur]

            @pl.when(jnp.logical_not(last))
            def _finish() -> None:
                rotate(cur).wait()
                bound = n - 1 if seed == "one_word_too_many" else n - 2

                @pl.when(r < bound)
                def _free_the_slot() -> None:
                    prv = {"x": (jax.lax.axis_index("x") + (n - 1)) % n}
                    pl.semaphore_signal(slot_free, 1, device_id=prv)

            return carry

        jax.lax.fori_loop(0, n, round_, None)

    return kernel


def _scratch() -> list[Any]:
    return [
        pltpu.VMEM((2, ROWS, 128), jnp.float32),
        pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.REGULAR(()),
    ]


def _per_device(kernel: Callable[..., None], safe: bool) -> Callable[[jax.Array], jax.Array]:
    def fn(x: jax.Array) -> jax.Array:
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=VMEM,
            scratch_shapes=_scratch(),
        )(x)
        return out

    return fn


def _x(n: int, mesh: Any = None) -> jax.ShapeDtypeStruct:
    return ring_blocks(n, ROWS, mesh)


def test_the_safedma_rotation_lowers_to_the_raw_kernels_mosaic() -> None:
    n = 4
    mesh = abstract_mesh((n,), ("x",))

    def twin(safe: bool) -> Any:
        kernel = _safe_kernel(n) if safe else _raw_kernel(n)
        return sharded(_per_device(kernel, safe), mesh)

    assert_same_mosaic(twin(True), twin(False), _x(n, mesh), mesh=mesh)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("safe", [True, False], ids=["safedma", "raw"])
def test_the_rotation_verifies_clean_twice_in_a_row(n: int, safe: bool) -> None:
    kernel = _safe_kernel(n) if safe else _raw_kernel(n)
    report = verify(
        _per_device(kernel, safe), _x(n), mesh=abstract_mesh((n,), ("x",)), invocations=2
    )
    assert report.devices == n
    assert report.dmas == 2 * n * n  # a load and n - 1 sends per device, twice


@pytest.mark.parametrize(
    "seed", ["no_wait_for_the_slot", "one_word_too_many", "send_into_the_slot_being_read"]
)
def test_the_raw_rotations_seeded_mistakes_are_caught(seed: str) -> None:
    n = 4
    with pytest.raises(SimulationError, match="test_ring_rotation.py") as caught:
        verify(_per_device(_raw_kernel(n, seed), False), _x(n), mesh=abstract_mesh((n,), ("x",)))
    if seed != "one_word_too_many":
        assert isinstance(caught.value, RaceDetectedError), caught.value
