"""The exit drain of a DMA semaphore: a copy started and never waited is reported, then its
count is waited back to zero with DMA waits (the chip halts the core at exit on a DMA
semaphore left non-zero, and a DMA semaphore takes no ``pl.semaphore_wait``)."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.sanitize.helpers import started_never_waited
from safedma._sanitize import _jax
from safedma._sanitize._drain import BUFFER, drain_dma, pieces, settle
from safedma._sanitize._units import Backend, amount
from safedma.testing import LeftoverSemaphoreError, abstract_mesh, mosaic_text

from .helpers import HBM, example, hbm_call

F32 = jnp.float32


def test_drain_windows_halve_down_to_each_backends_smallest_count() -> None:
    assert [units for _, units in pieces(Backend.CHIP)] == [128, 64, 32, 16]
    assert [shape for shape, _ in pieces(Backend.CHIP)] == [(8, 128), (4, 128), (2, 128), (1, 128)]
    assert [units for _, units in pieces(Backend.TPU_INTERPRET)] == [4096 >> k for k in range(11)]
    assert [units for _, units in pieces(Backend.HLO_INTERPRET)] == [1024 >> k for k in range(11)]


@pytest.mark.parametrize(
    "shape,dtype",
    [
        ((8, 128), F32),
        ((1, 128), F32),
        ((3, 128), F32),
        ((8, 64), F32),
        ((8, 130), F32),
        ((8, 256), jnp.bfloat16),
        ((32, 128), jnp.int8),
        ((2, 8, 128), F32),
        ((4096, 1024), F32),
    ],
)
def test_every_measured_chip_count_is_a_sum_of_drain_windows(shape: Any, dtype: Any) -> None:
    """Greedy over the halving windows leaves nothing of any count the chip was measured
    to add (all multiples of the smallest window)."""
    left = amount(shape, np.dtype(dtype).itemsize, Backend.CHIP, remote=False)
    for _, units in pieces(Backend.CHIP):
        left -= (left // units) * units
    assert left == 0


def _drain_kernel(window: tuple[int, ...], dtype: Any, backend: Backend) -> Any:
    def kernel(x_hbm: Any, o_ref: Any, buf: Any, sem: Any, drain: Any) -> None:
        started_never_waited(
            pltpu.make_async_copy(x_hbm.at[tuple(pl.ds(0, d) for d in window)], buf, sem)
        )
        held = settle(sem, (), _jax.read_semaphore(sem, (), backend), backend, 100)
        o_ref[0] = held
        drain_dma(sem, held, drain, backend, 100)
        o_ref[1] = _jax.read_semaphore(sem, (), backend)

    return kernel


@pytest.mark.parametrize(
    "window,dtype",
    [
        ((8, 128), F32),
        ((3, 128), F32),
        ((5, 128), jnp.int8),
        ((2, 8, 128), F32),
        ((64, 128), F32),
        ((3, 8), jnp.int8),
        ((7,), jnp.int32),
    ],
)
@pytest.mark.parametrize("backend", [Backend.TPU_INTERPRET, Backend.HLO_INTERPRET])
def test_drain_waits_a_never_waited_copy_back_to_zero(
    window: tuple[int, ...], dtype: Any, backend: Backend
) -> None:
    if backend is Backend.TPU_INTERPRET:
        _jax.register_interpret_read()
        mode: Any = pltpu.InterpretParams()
    else:
        mode = True
    source = example({1: (64,), 2: (64, 128), 3: (4, 8, 128)}[len(window)], dtype)
    out = pl.pallas_call(
        _drain_kernel(window, dtype, backend),
        jax.ShapeDtypeStruct((2,), jnp.int32),
        in_specs=[HBM],
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        scratch_shapes=[
            pltpu.VMEM(window, dtype),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SMEM(BUFFER, jnp.int32),
        ],
        interpret=mode,
    )(source)
    held, after = (int(v) for v in np.asarray(out))
    assert held == amount(window, np.dtype(dtype).itemsize, backend, remote=False)
    assert after == 0


def _waits(text: str) -> list[str]:
    """The SMEM windows of the kernel's DMA waits, e.g. ``8x128xi32``."""
    found = []
    for line in text.splitlines():
        if re.search(r"tpu\.wait_dma2?\b", line):  # jax 0.10.2: wait_dma2; 0.12: wait_dma
            window = re.search(r"memref<([0-9x]+xi32), #tpu.memory_space<smem>>", line)
            if window:
                found.append(window.group(1))
    return found


def _sanitized_text(body: Any, scratch: list[Any]) -> str:
    fn = hbm_call(body, scratch, sanitize=True, mode=None)
    # a v5e mesh: jax 0.12 asks the TPU generation when it lowers a run_scoped
    return mosaic_text(
        fn, jax.ShapeDtypeStruct((64, 128), F32), mesh=abstract_mesh((), (), tpu="v5e")
    )


CHIP_WINDOWS = [f"{r}x128xi32" for r in (8, 4, 2, 1)]


def started(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem))


def started_on_slot(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[3]))


def started_in_scope(x_hbm: Any, o_hbm: Any) -> None:
    def body(buf: Any, scoped_sem: Any) -> None:
        started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, scoped_sem))

    pl.run_scoped(body, pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(()))


def test_chip_exit_drain_waits_each_window_on_the_dma_semaphore() -> None:
    text = _sanitized_text(started, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())])
    assert _waits(text) == CHIP_WINDOWS
    assert f"memref<{BUFFER[0]}x{BUFFER[1]}xi32, #tpu.memory_space<smem>>" in text
    assert "sem_wait" not in text  # a DMA semaphore takes DMA waits only


@pytest.mark.parametrize("slots", [4, 12])  # unrolled slots, and a loop over them
def test_chip_exit_drain_covers_every_slot_of_a_semaphore_array(slots: int) -> None:
    text = _sanitized_text(
        started_on_slot, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA((slots,))]
    )
    # one drain per slot when unrolled; else one for the first slot (read by the exit's
    # settle) and one inside the loop over the others
    assert _waits(text) == CHIP_WINDOWS * (slots if slots <= 8 else 2)


def test_chip_scope_end_drain_waits_the_run_scoped_dma_semaphore() -> None:
    text = _sanitized_text(started_in_scope, [])
    assert _waits(text) == CHIP_WINDOWS


def started_everywhere(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    def body(scoped_buf: Any, scoped_sem: Any) -> None:
        started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 3)], scoped_buf, scoped_sem))

    pl.run_scoped(body, pltpu.VMEM((3, 128), F32), pltpu.SemaphoreType.DMA(()))
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[2]))
    started_never_waited(pltpu.make_async_copy(x_hbm, o_hbm, sems.at[9]))


@pytest.mark.parametrize(
    "body,scratch,count",
    [
        (started, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())], 4096),
        (started_everywhere, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA((12,))], 1536),
    ],
    ids=["scratch", "scoped_and_array_slots"],
)
def test_a_reported_dma_leftover_is_drained_before_the_kernel_exits(
    body: Any, scratch: list[Any], count: int, capfd: pytest.CaptureFixture[str]
) -> None:
    """jax's TPU interpreter prints the semaphores a kernel leaves non-zero at exit (where
    the chip halts the core): after the sanitizer's report, there are none."""
    call = hbm_call(body, scratch)
    for _ in range(2):  # the same call again: nothing left from the first
        with pytest.raises(LeftoverSemaphoreError) as caught:
            call(example((64, 128)))
        assert caught.value.leftovers[0].count == count
    printed = capfd.readouterr()
    assert "non-zero count" not in printed.out + printed.err
