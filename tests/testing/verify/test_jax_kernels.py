"""verify on programs jax's interpreter cannot fully run, and on the kernels jax ships.

Each is verified clean, and each with a seeded bug is caught:

* DMA futures (a start ``pallas_call`` returning the semaphore and the
  in-flight buffer, a done ``pallas_call`` waiting it, in one jit): the
  interpreter stops at the semaphore output; seeded bug: a done kernel that
  forgets its wait.
* an ``emit_pipeline`` kernel with a manual DMA next to the pipeline; seeded
  bug: the manual DMA writes the output the pipeline writes (simulate's eager
  DMAs hide the race).
* jax's own raw-pltpu kernels from the installed package
  (``jax.experimental.pallas.ops.tpu``), called with small shapes: paged
  attention, ragged paged attention (ref ``.reshape`` views: the interpreter
  fails on them) and the all-gather; seeded bug: one DMA wait dropped through
  :class:`tests.support.jax_programs.DropWait` in place of the module's
  ``pltpu``.

jax's all-gather is clean on 2 devices. On 4 it is a race under the TPU
semantics verify models (issue 14: a wait of N bytes guarantees only the
copies whose bytes it cannot do without): a device may start its step-1
send as soon as its own step-0 copies are done, so two same-sized copies
from it are in flight on its right neighbour's ``recv_sem[1]``; the
neighbour's step-0 wait can be satisfied by the step-1 bytes, and it then
forwards the slot whose step-0 copy may not have landed. The kernel relies
on copies between two neighbours landing in order; safedma's ring kernels
bound the run-ahead with a capacity handshake instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    abstract_mesh,
    simulate,
    simulated_mesh,
    tpu_mesh,
    verify,
)
from tests.support import jax_programs as jp

X = jax.ShapeDtypeStruct((16, 128), jnp.float32)
PROGRAMS = Path(jp.__file__).name


def names_a_line_in(error: BaseException, *files: str) -> bool:
    text = str(error)
    return any(f"{name}:" in text for name in files)


def caught(error: BaseException, *files: str) -> None:
    """A verdict (not a crash of the engine) naming a line of one of ``files``."""
    assert isinstance(error, SimulationError), f"{type(error).__name__}: {error}"
    assert names_a_line_in(error, *files), f"no line of {files} named:\n{error}"


# ------------------------------------------------------------------ DMA futures


def test_dma_futures_across_pallas_calls_verify_clean() -> None:
    report = verify(jp.futures, X)
    # Two copies started in the start kernels, both waited in the done kernels.
    assert report.dmas == 2 and report.waits == 2, report


def test_a_future_never_waited_is_caught() -> None:
    with pytest.raises(Exception) as err:
        verify(jp.futures_never_waited, X)
    caught(err.value, PROGRAMS)
    assert (
        isinstance(err.value, (LeftoverSemaphoreError, RaceDetectedError))
        or "Unwritten" in type(err.value).__name__
    ), type(err.value).__name__


def test_simulate_cannot_run_dma_futures() -> None:
    """Why this is verify's job: jax's interpreter stops at the semaphore output."""
    with pytest.raises(Exception):  # noqa: B017 - whatever the interpreter raises
        simulate(jp.futures, jnp.ones(X.shape, X.dtype), timeout_s=10)


# ------------------------------------------------------------------ emit_pipeline


def _on_tpu_mesh(seeded_race: bool) -> Any:
    # emit_pipeline reads the TPU generation while tracing (jax 0.12): trace it
    # under a compile-only TPU mesh's abstract mesh.
    abstract = tpu_mesh("v5e:2x2").abstract_mesh

    def program(x: jax.Array) -> Any:
        with jax.sharding.use_abstract_mesh(abstract):
            return jp.emit_pipeline_call(x, seeded_race=seeded_race)

    return program


def test_emit_pipeline_with_a_manual_dma_verifies_clean() -> None:
    assert verify(_on_tpu_mesh(False), X) is not None


def test_a_manual_dma_into_the_pipelines_output_is_a_race() -> None:
    with pytest.raises(Exception) as err:
        verify(_on_tpu_mesh(True), X)
    caught(err.value, PROGRAMS)
    assert isinstance(err.value, RaceDetectedError), type(err.value).__name__


def test_simulate_also_catches_the_pipeline_race() -> None:
    """Eager DMAs land at their start, before the pipeline writes, so simulate once saw
    no race; with a clock entry per copy (session 5) the interpreter's race detector
    sees the pipeline's write-back is not ordered after the side copy, as verify does."""
    with pytest.raises(RaceDetectedError, match=r"jax_programs\.py:10[5-9]"):
        simulate(_on_tpu_mesh(True), jnp.ones(X.shape, X.dtype), timeout_s=30)


# ------------------------------------------------------------------ jax's kernels


def _paged_attention_module() -> Any:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel

    return paged_attention_kernel


def _ragged_module() -> Any:
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

    return kernel


def _all_gather_module() -> Any:
    from jax.experimental.pallas.ops.tpu import all_gather

    return all_gather


def test_paged_attention_verifies_clean() -> None:
    assert verify(jp.paged_attention_fn(), *jp.paged_attention_inputs()) is not None


def test_paged_attention_with_a_dropped_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _paged_attention_module()
    seeded = jp.DropWait(module.pltpu, drop=0)
    monkeypatch.setattr(module, "pltpu", seeded)
    with pytest.raises(Exception) as err:
        verify(jp.paged_attention_fn(), *jp.paged_attention_inputs())
    assert seeded.dropped
    caught(err.value, "paged_attention_kernel.py", "jax_programs.py")


def test_ragged_paged_attention_verifies_clean() -> None:
    assert verify(jp.ragged_paged_attention_fn(), *jp.ragged_paged_attention_inputs()) is not None


def test_ragged_paged_attention_with_a_dropped_wait_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _ragged_module()
    seeded = jp.DropWait(module.pltpu, drop=0)
    monkeypatch.setattr(module, "pltpu", seeded)
    with pytest.raises(Exception) as err:
        verify(jp.ragged_paged_attention_fn(), *jp.ragged_paged_attention_inputs())
    assert seeded.dropped
    caught(err.value, "kernel.py", "jax_programs.py")


def test_simulate_cannot_run_ragged_paged_attention() -> None:
    """Its copies go through ref .reshape views, which the interpreter cannot run."""
    with pytest.raises(SimulationError):
        simulate(jp.ragged_paged_attention_fn(), *jp.ragged_paged_attention_inputs(), timeout_s=30)


def _jax_all_gather(n: int, *, real_mesh: bool = False) -> tuple[Any, Any]:
    """jax's all-gather as a program with its own shard_map over ``n`` devices.

    Device-free: an abstract mesh and a ShapeDtypeStruct. Real: a simulated
    mesh and the input split over it, exactly as simulate takes it (the
    mesh's axes are Explicit in jax 0.12, so the input must be split).
    """
    module = _all_gather_module()
    shape = (n * 16, 128)
    mesh: Any
    x: Any
    if real_mesh:
        mesh = simulated_mesh(n, "x")
        x = jax.device_put(
            jnp.arange(shape[0] * shape[1], dtype=jnp.float32).reshape(shape),
            NamedSharding(mesh, P("x")),
        )
    else:
        mesh = abstract_mesh((n,), ("x",))
        x = jax.ShapeDtypeStruct(shape, jnp.float32)

    def program(x: jax.Array) -> jax.Array:
        out: jax.Array = jp.unjitted(module.all_gather)(x, mesh=mesh, axis_name="x")
        return out

    return program, x


def test_jax_all_gather_takes_simulates_calling_convention() -> None:
    """A real mesh and an input already split over it: what simulate runs as is."""
    program, x = _jax_all_gather(2, real_mesh=True)
    simulate(program, x, timeout_s=30)
    assert verify(program, x) is not None


def test_jax_all_gather_on_two_devices_verifies_clean() -> None:
    program, x = _jax_all_gather(2)
    assert verify(program, x) is not None


def test_jax_all_gather_on_four_devices_relies_on_in_order_delivery() -> None:
    """See the module docstring: two same-sized copies in flight on one receive semaphore."""
    program, x = _jax_all_gather(4)
    with pytest.raises(Exception) as err:
        verify(program, x)
    caught(err.value, "all_gather.py")
    assert isinstance(err.value, RaceDetectedError), type(err.value).__name__


def test_jax_all_gather_with_a_dropped_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _all_gather_module()
    seeded = jp.DropWait(module.pltpu, drop=0)  # the initial local copy's wait
    monkeypatch.setattr(module, "pltpu", seeded)
    program, x = _jax_all_gather(2)
    with pytest.raises(Exception) as err:
        verify(program, x)
    assert seeded.dropped
    caught(err.value, "all_gather.py", "jax_programs.py")
