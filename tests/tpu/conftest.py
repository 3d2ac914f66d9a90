"""The TPU lane: every test here runs kernels on a real TPU chip and is marked ``tpu``.

Run it on a TPU VM (one chip is enough), from the repository root::

    PYTHONPATH=$PWD JAX_PLATFORMS=tpu,cpu python3 -m pytest tests/tpu

or ``./dev tpu``. ``JAX_PLATFORMS=tpu,cpu``: the chip for the kernels, the host
CPU for ``safedma.testing.simulate`` (safedma's pytest plugin sets
``JAX_PLATFORMS=cpu`` only when the variable is unset). Without a TPU every
test skips with the reason ("no TPU: jax.devices()[0].platform is 'cpu'").

Only one process may hold the chip, and the first jax call that asks for a
device takes it for the rest of the process. The tests that run the chip in
child processes (the ``chip_run`` and ``counted_copy_run`` fixtures) therefore
run first; the others
take the chip in this process through the ``tpu`` fixture, which also arms a
watchdog: a test still running after ``WATCHDOG_S`` seconds (a hung kernel)
ends the whole pytest process with every thread's traceback on stderr.
"""

from __future__ import annotations

import faulthandler
from collections.abc import Iterator
from typing import Any

import pytest

from tests.tpu import _chip


CHILD_FIXTURES = ("chip_run", "counted_copy_run")


def _uses_children(item: pytest.Item) -> bool:
    return any(f in getattr(item, "fixturenames", ()) for f in CHILD_FIXTURES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The child-process tests before anything in this process takes the chip.
    first = [i for i in items if _uses_children(i)]
    if first:
        items[:] = first + [i for i in items if not _uses_children(i)]


@pytest.fixture(scope="session")
def tpu_device() -> Any:
    """The chip, taken by this process; skips the test when there is none."""
    reason = _chip.no_tpu_reason()
    if reason:
        pytest.skip(reason)
    import jax

    return jax.devices()[0]


@pytest.fixture
def tpu(tpu_device: Any) -> Iterator[Any]:
    """The chip, with the watchdog armed for this test."""
    faulthandler.dump_traceback_later(_chip.WATCHDOG_S, exit=True)
    try:
        yield tpu_device
    finally:
        faulthandler.cancel_dump_traceback_later()


def _in_children(names: list[str]) -> Any:
    if _chip.platforms_without_tpu():
        pytest.skip(_chip.no_tpu_reason())  # JAX_PLATFORMS has no tpu: asking is safe
    from benchmarks.chip_runner import run_on_chip

    run = run_on_chip(names, say=lambda line: print(line, flush=True))
    if run.platform != "tpu":
        pytest.skip(f"{run.no_tpu} (asked in a child process; one process at a time holds a chip)")
    return run


@pytest.fixture(scope="session")
def chip_run() -> Any:
    """The catalogue's cases of benchmarks/chip_cases.py, run on the chip in child
    processes (never in this one). About 4 minutes on a v5e."""
    from benchmarks.chip_cases import CATALOGUE

    return _in_children([c.name for c in CATALOGUE])


@pytest.fixture(scope="session")
def counted_copy_run() -> Any:
    """The CountedCopy case, on the chip in a child process (it may hang an older chip)."""
    return _in_children(["counted_copy"])
