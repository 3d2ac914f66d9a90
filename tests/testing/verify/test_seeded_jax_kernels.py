"""verify on the kernels jax ships with a mistake seeded into them, and on jax's
all-gather under simulate's calling convention.

The kernels are read from the installed package (``jax.experimental.pallas.ops.tpu``),
never copied: tests/corpus/grids.py (paged attention), semaphore_arrays.py (ragged paged
attention) and ring_collectives.py (all-gather) build them, and the corpus drivers verify
them clean. Here one DMA wait of each is dropped at trace time through
:class:`tests.corpus._seeding.DropWait` in place of the module's ``pltpu``, and verify
must catch it, naming a line of the kernel.
"""

from __future__ import annotations

from typing import Any

import pytest

from safedma.testing import SimulationError, simulate, verify
from tests.corpus import _run
from tests.corpus._seeding import DropWait
from tests.corpus.grids import paged_attention, paged_attention_module
from tests.corpus.ring_collectives import jax_all_gather, jax_all_gather_module
from tests.corpus.semaphore_arrays import ragged_paged_attention, ragged_paged_attention_module


def names_a_line_in(error: BaseException, *files: str) -> bool:
    text = str(error)
    return any(f"{name}:" in text for name in files)


def caught(error: BaseException, *files: str) -> None:
    """A verdict (not a crash of the engine) naming a line of one of ``files``."""
    assert isinstance(error, SimulationError), f"{type(error).__name__}: {error}"
    assert names_a_line_in(error, *files), f"no line of {files} named:\n{error}"


def _seeded(monkeypatch: pytest.MonkeyPatch, module: Any) -> DropWait:
    seeded = DropWait(module.pltpu, drop=0)
    monkeypatch.setattr(module, "pltpu", seeded)
    return seeded


def test_paged_attention_with_a_dropped_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = _seeded(monkeypatch, paged_attention_module())
    with pytest.raises(Exception) as err:
        _run.verify(paged_attention())
    assert seeded.dropped
    caught(err.value, "paged_attention_kernel.py", "_seeding.py")


def test_ragged_paged_attention_with_a_dropped_wait_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeded = _seeded(monkeypatch, ragged_paged_attention_module())
    with pytest.raises(Exception) as err:
        _run.verify(ragged_paged_attention())
    assert seeded.dropped
    caught(err.value, "kernel.py", "_seeding.py")


def test_jax_all_gather_with_a_dropped_wait_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    seeded = _seeded(monkeypatch, jax_all_gather_module())  # the initial local copy's wait
    with pytest.raises(Exception) as err:
        _run.verify(jax_all_gather(2))
    assert seeded.dropped
    caught(err.value, "all_gather.py", "_seeding.py")


def test_jax_all_gather_takes_simulates_calling_convention() -> None:
    """A real mesh and an input already split over it: what simulate runs as is."""
    program = jax_all_gather(2, real_mesh=True)
    simulate(program.fn, *program.args, timeout_s=30)
    report = verify(program.fn, *program.args)
    assert report.devices == 2 and report.remote_dmas > 0, report
