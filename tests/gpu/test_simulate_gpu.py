"""simulate_gpu: Pallas GPU kernels in jax's GPU interpreter, strictly, on a CPU.

Each mistake of the catalogue's GPU section that the interpreter can see is run once
and must come back as the named safedma error, with the user's line; correct kernels
(the typed example and its raw twin, in Python and fori_loop form) run clean and
compute the right numbers; a hang is stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from safedma.testing._gpu.jax_seam import interpret_available

_needs_interpreter = pytest.mark.skipif(
    not interpret_available(), reason="this jax has no Pallas GPU interpreter"
)

ROWS, COLS = 64, 128


def _kernel(body: Callable[..., None], *, num_arrivals: int = 1) -> Callable[[Any], Any]:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def run(x: Any) -> Any:
        return plgpu.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
            scratch_types=[
                plgpu.SMEM((2, ROWS, COLS), jnp.float32),
                plgpu.SMEM((2, ROWS, COLS), jnp.float32),
                plgpu.Barrier(num_arrivals=num_arrivals, num_barriers=2),
            ],
        )(x)

    return run


def _x() -> Any:
    import jax.numpy as jnp

    return jnp.arange(2 * ROWS * COLS, dtype=jnp.float32).reshape(2 * ROWS, COLS)


def _line_of(body: Callable[..., None], text: str) -> int:
    """The line of ``body``'s source file holding ``text`` (once, inside ``body``)."""
    import inspect

    lines, first = inspect.getsourcelines(body)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def _mistake(name: str) -> Callable[..., None]:
    """One kernel body per mistake: load block 0, double it, store it."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
        plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, ROWS)], smem_in.at[0], bars.at[0])  # load
        if name == "two loads, one arrival":
            plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(ROWS, ROWS)], smem_in.at[1], bars.at[0])
        if name != "read before the wait":
            plgpu.barrier_wait(bars.at[0])  # first wait
        if name == "waited twice":
            plgpu.barrier_wait(bars.at[0])  # second wait
        smem_out[0] = smem_in[0] * 2  # compute
        if name == "read before the wait":
            plgpu.barrier_wait(bars.at[0])
        if name != "no commit":
            plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[0], o_gmem.at[pl.ds(0, ROWS)])  # store
        if name == "overwrite under the store":
            smem_out[0] = smem_in[0] * 0  # overwrite
        if name != "store never waited":
            plgpu.wait_smem_to_gmem(0)

    return body


@_needs_interpreter
@pytest.mark.parametrize("form", ["python loop", "fori_loop"])
@pytest.mark.parametrize("layer", ["typed", "raw"])
def test_the_double_buffered_example_runs_clean_and_right(form: str, layer: str) -> None:
    import jax.numpy as jnp

    from examples import gpu_double_buffer as example
    from safedma.testing import simulate_gpu

    steps = example.STEPS if form == "python loop" else example.LOOP_STEPS
    body = {
        ("typed", "python loop"): example.typed_body,
        ("raw", "python loop"): example.raw_body,
        ("typed", "fori_loop"): example.typed_loop_body,
        ("raw", "fori_loop"): example.raw_loop_body,
    }[(layer, form)]
    x = jnp.arange(steps * example.ROWS * example.COLS, dtype=jnp.float32)
    x = x.reshape(steps * example.ROWS, example.COLS)
    out = simulate_gpu(example.kernel(body), x, timeout_s=120)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2)


@_needs_interpreter
def test_a_barrier_short_of_arrivals_is_stopped_at_once_naming_the_wait() -> None:
    from safedma.testing import BarrierNeverCompletesError, simulate_gpu

    body = _mistake("correct")
    started = time.monotonic()
    with pytest.raises(BarrierNeverCompletesError) as caught:
        simulate_gpu(_kernel(body, num_arrivals=2), _x(), timeout_s=60)
    assert time.monotonic() - started < 30  # found, not timed out
    (wait,) = caught.value.barrier_waits
    assert (wait.phase, wait.arrivals, wait.num_arrivals) == (0, 1, 2)
    assert wait.location is not None
    assert f"test_simulate_gpu.py:{_line_of(body, '# first wait')}" in wait.location
    assert caught.value.found_after_s is not None
    assert "1 arrival(s) short" in str(caught.value)
    assert "num_arrivals" in str(caught.value)


@_needs_interpreter
def test_a_barrier_waited_twice_names_the_second_wait() -> None:
    from safedma.testing import BarrierNeverCompletesError, UnsatisfiableWaitError, simulate_gpu

    body = _mistake("waited twice")
    with pytest.raises(BarrierNeverCompletesError) as caught:
        simulate_gpu(_kernel(body), _x(), timeout_s=60)
    assert isinstance(caught.value, UnsatisfiableWaitError)  # one except for both backends
    (wait,) = caught.value.barrier_waits
    assert (wait.phase, wait.arrivals) == (1, 0)
    assert wait.location is not None
    assert f":{_line_of(body, '# second wait')} " in wait.location
    assert "a second wait on one completion" in str(caught.value)


@_needs_interpreter
@pytest.mark.parametrize(
    ("name", "racing", "earlier"),
    [
        ("read before the wait", "# compute", "# load"),
        ("no commit", "# store", "# compute"),
        ("overwrite under the store", "# overwrite", "# store"),
    ],
)
def test_a_race_names_both_lines_and_the_gpu_fix(name: str, racing: str, earlier: str) -> None:
    from safedma.testing import GpuRaceDetectedError, RaceDetectedError, simulate_gpu

    body = _mistake(name)
    with pytest.raises(GpuRaceDetectedError) as caught:
        simulate_gpu(_kernel(body), _x(), timeout_s=60)
    assert isinstance(caught.value, RaceDetectedError)
    (race,) = caught.value.races
    assert race.location is not None and race.other_location is not None
    assert f"test_simulate_gpu.py:{_line_of(body, racing)}:" in race.location
    assert f"test_simulate_gpu.py:{_line_of(body, earlier)}:" in race.other_location
    text = str(caught.value)
    assert "barrier_wait" in text and "commit_smem" in text and "wait_smem_to_gmem" in text


@_needs_interpreter
def test_races_are_not_looked_for_when_detection_is_off() -> None:
    from safedma.testing import simulate_gpu

    out = simulate_gpu(_kernel(_mistake("no commit")), _x(), timeout_s=60, detect_races=False)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(_x())[:ROWS] * 2)


@_needs_interpreter
def test_a_store_never_waited_is_a_copy_in_flight_at_exit() -> None:
    from safedma.testing import CopyInFlightAtExitError, simulate_gpu

    with pytest.raises(CopyInFlightAtExitError, match=r"wait_smem_to_gmem\(0\)"):
        simulate_gpu(_kernel(_mistake("store never waited")), _x(), timeout_s=60)


@_needs_interpreter
def test_two_loads_on_a_one_arrival_barrier_fail_with_the_fix() -> None:
    from safedma.testing import KernelFailedError, simulate_gpu

    with pytest.raises(KernelFailedError, match="more copies arrive on it per phase"):
        simulate_gpu(_kernel(_mistake("two loads, one arrival")), _x(), timeout_s=60)


@_needs_interpreter
def test_a_hang_between_warpgroups_is_stopped_at_the_timeout() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from safedma.testing import BarrierNeverCompletesError, simulate_gpu

    def body(x_gmem: Any, o_gmem: Any, smem: Any, bars: Any) -> None:
        @pl.when(jax.lax.axis_index("wg") == 0)
        def _() -> None:
            plgpu.barrier_wait(bars.at[0])  # waits for warpgroup 1, which never arrives

    def run(x: Any) -> Any:
        return plgpu.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),
            scratch_types=[
                plgpu.SMEM((ROWS, COLS), jnp.float32),
                plgpu.Barrier(num_arrivals=1, num_barriers=1),
            ],
            num_threads=2,
            thread_name="wg",
        )(x)

    started = time.monotonic()
    with pytest.raises(BarrierNeverCompletesError) as caught:
        simulate_gpu(run, _x(), timeout_s=3)
    assert time.monotonic() - started < 30
    assert caught.value.found_after_s is None  # another warpgroup might have arrived
    (wait,) = caught.value.barrier_waits
    assert wait.location is not None
    assert f":{_line_of(body, 'never arrives')} " in wait.location


@_needs_interpreter
def test_a_run_after_a_failed_one_starts_clean() -> None:
    from safedma.testing import BarrierNeverCompletesError, simulate_gpu

    with pytest.raises(BarrierNeverCompletesError):
        simulate_gpu(_kernel(_mistake("waited twice")), _x(), timeout_s=60)
    out = simulate_gpu(_kernel(_mistake("correct")), _x(), timeout_s=60)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(_x())[:ROWS] * 2)


@_needs_interpreter
def test_an_error_while_tracing_propagates_unchanged() -> None:
    from safedma.testing import simulate_gpu

    def run(x: Any) -> Any:
        raise ZeroDivisionError("the user's own bug")

    with pytest.raises(ZeroDivisionError, match="the user's own bug"):
        simulate_gpu(run, _x())


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"timeout_s": 0}, ValueError, "timeout_s must be positive"),
        ({"timeout_s": True}, TypeError, "timeout_s must be a number"),
        ({"detect_races": "yes"}, TypeError, "detect_races must be True or False"),
        ({"uninitialized_memory": "garbage"}, ValueError, "'nan' or 'zero'"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    from safedma.testing import simulate_gpu

    with pytest.raises(error, match=says):
        simulate_gpu(lambda x: x, 1.0, **options)


@pytest.mark.skipif(interpret_available(), reason="this jax has the GPU interpreter")
def test_a_jax_without_the_gpu_interpreter_is_refused_naming_its_version() -> None:
    import jax

    from safedma.testing import SimulationUnsupportedError, simulate_gpu

    with pytest.raises(SimulationUnsupportedError, match=f"jax {jax.__version__}"):
        simulate_gpu(lambda x: x, 1.0)
