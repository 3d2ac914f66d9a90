"""The progress line of verify, simulate and ./dev: late, rate-limited, erased, opt-in off a tty.

The reporter is driven by a fake clock (no thread) for its timing rules, once with its
thread for real (delays of milliseconds), and verify and simulate are checked for
what they tell it by a recording reporter, so nothing here waits the two seconds a
person would.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import _progress, abstract_mesh, simulate, verify
from tests.support.simulation import BLOCK, dma, example, hbm_call

REPO = Path(__file__).resolve().parents[2]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(written: str) -> str:
    """What a terminal shows of one line after ``written`` (``\\r`` returns to column 0)."""
    line: list[str] = []
    column = 0
    for ch in written:
        if ch == "\r":
            column = 0
            continue
        if column < len(line):
            line[column] = ch
        else:
            line.append(ch)
        column += 1
    return "".join(line).rstrip()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _line(stream: io.StringIO, clock: Clock, **kwargs: Any) -> _progress.Progress:
    line = _progress.Progress("job", stream=stream, clock=clock, thread=False, **kwargs)
    line.start()
    return line


def test_the_line_waits_for_the_delay_then_redraws_no_faster_than_the_interval() -> None:
    out, clock = Tty(), Clock()
    line = _line(out, clock, enabled=True, delay_s=2.0, interval_s=0.5)
    line.status("step one of many")
    clock.now += 1.9
    assert not line.tick() and out.getvalue() == ""
    clock.now += 0.2
    assert line.tick()
    assert screen(out.getvalue()) == "job: step one of many (2 s)"
    clock.now += 0.3
    assert not line.tick()  # within the interval
    line.status("two")
    clock.now += 0.3
    assert line.tick()
    assert screen(out.getvalue()) == "job: two (3 s)"  # the longer text is overwritten
    line.close()
    assert out.getvalue().endswith("\r")
    assert screen(out.getvalue()) == ""
    written = out.getvalue()
    assert not line.tick() and out.getvalue() == written  # nothing after close


def test_a_quick_job_writes_nothing_at_all() -> None:
    out, clock = Tty(), Clock()
    with _line(out, clock, enabled=True) as line:
        line.status("fast")
        clock.now += 1.0
        line.tick()
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("enabled", "stream", "shown"),
    [
        (None, Tty(), True),
        (None, io.StringIO(), False),
        (False, Tty(), False),
        (True, io.StringIO(), True),
    ],
)
def test_shown_on_a_terminal_or_when_asked_never_when_refused(
    enabled: bool | None, stream: io.StringIO, shown: bool
) -> None:
    clock = Clock()
    line = _line(stream, clock, enabled=enabled, delay_s=0.0)
    line.status("x")
    clock.now += 1
    assert line.tick() is shown
    assert (stream.getvalue() != "") is shown


def test_a_status_function_is_read_at_each_redraw_and_may_fail() -> None:
    out, clock = Tty(), Clock()
    line = _line(out, clock, enabled=True, delay_s=0.0, interval_s=0.0)
    done = [0]
    line.status(lambda: f"{done[0]} done")
    done[0] = 7
    clock.now += 1
    line.tick()
    assert screen(out.getvalue()) == "job: 7 done (1 s)"

    def broken() -> str:
        raise KeyError("mid-update")

    line.status(broken)
    line.tick()
    assert screen(out.getvalue()) == "job: (KeyError) (1 s)"


def test_a_long_line_is_cut_to_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback: os.terminal_size((21, 5)))
    out, clock = Tty(), Clock()
    line = _line(out, clock, enabled=True, delay_s=0.0)
    line.status("a status far longer than the terminal")
    line.tick()
    assert screen(out.getvalue()) == "job: a status far..."


def test_the_thread_draws_while_the_work_blocks_and_the_line_is_erased_after() -> None:
    out = Tty()
    with _progress.Progress("sync", True, stream=out, delay_s=0.0, interval_s=0.005) as line:
        line.status("downloading")
        time.sleep(0.1)  # the work blocks (a subprocess, a compilation)
    assert "\rsync: downloading (0 s)" in out.getvalue()
    assert screen(out.getvalue()) == ""


# ------------------------------------------------------------ what verify and simulate say


class Recording(_progress.Progress):
    """A reporter that keeps every status it was given (functions read at close)."""

    made: list[Recording] = []

    def __init__(self, label: str, enabled: bool | None = None, **kwargs: Any) -> None:
        super().__init__(label, enabled, stream=io.StringIO(), thread=False)
        self.asked = enabled
        self.said: list[str | Callable[[], str]] = []
        Recording.made.append(self)

    def status(self, status: str | Callable[[], str]) -> None:
        self.said.append(status)
        super().status(status)

    def texts(self) -> list[str]:
        return [s() if callable(s) else s for s in self.said]


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> list[Recording]:
    Recording.made = []
    monkeypatch.setattr(_progress, "Progress", Recording)
    return Recording.made


def _ring(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(
        x_ref, o_ref, send, recv, device_id={"x": (me + 1) % jax.lax.axis_size("x")}
    )
    copy.start()
    copy.wait()


def _ring_call(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        _ring,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


def test_verify_says_which_pass_runs_and_how_far_the_walk_is(recording: list[Recording]) -> None:
    x = jax.ShapeDtypeStruct((8 * 8, 128), jnp.float32)
    verify(_ring_call, x, mesh=abstract_mesh((8,), ("x",)), lockstep="check", progress=True)
    (line,) = recording
    assert line.label == "safedma verify" and line.asked is True
    assert line.texts() == [
        "tracing the program",
        "proving the protocol in lockstep on 8 devices",
        "walking each device's program: 8 of 8 devices done",
    ]


@pytest.mark.parametrize("asked", [None, False])
def test_verify_off_a_terminal_shows_nothing_unless_asked(
    asked: bool | None, recording: list[Recording]
) -> None:
    x = jax.ShapeDtypeStruct((8 * 8, 128), jnp.float32)
    verify(_ring_call, x, mesh=abstract_mesh((8,), ("x",)), progress=asked)
    (line,) = recording
    assert line.asked is asked
    assert not line.enabled  # pytest's captured stderr is no terminal


def test_verify_draws_and_erases_its_line_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_progress, "DELAY_S", 0.0)
    monkeypatch.setattr(_progress, "INTERVAL_S", 0.001)
    x = jax.ShapeDtypeStruct((8 * 8, 128), jnp.float32)
    verify(_ring_call, x, mesh=abstract_mesh((8,), ("x",)), lockstep="off", progress=True)
    err = capsys.readouterr().err
    assert "\rsafedma verify: " in err
    assert screen(err) == ""


def simulate_lines(recording: list[Recording]) -> list[Recording]:
    """simulate's own lines (under ``pytest --safedma-verify`` the plugin verifies the run
    when simulate returns, and that verify has its own line)."""
    return [r for r in recording if r.label == "safedma simulate"]


def _copy(x_ref: Any, o_ref: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


def test_simulate_says_what_it_does_and_counts_the_run(recording: list[Recording]) -> None:
    simulate(hbm_call(_copy, dma()), example(BLOCK), progress=True)
    (line,) = simulate_lines(recording)
    assert line.label == "safedma simulate" and line.asked is True
    texts = line.texts()
    assert texts[:2] == [
        "preparing interpret mode",
        "tracing and compiling the program for interpret mode",
    ]
    assert texts[2] == (
        "running in interpret mode: copies started 1, semaphore signals 1, waits in "
        "progress 0, kernel exits 1"
    )


def test_simulate_off_a_terminal_shows_nothing(recording: list[Recording]) -> None:
    simulate(hbm_call(_copy, dma()), example(BLOCK))
    (line,) = simulate_lines(recording)
    assert line.asked is None and not line.enabled


# ------------------------------------------------------------ ./dev


def _dev(monkeypatch: pytest.MonkeyPatch) -> Any:
    loader = importlib.machinery.SourceFileLoader("_dev_script", str(REPO / "dev"))
    spec = importlib.util.spec_from_loader("_dev_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_dev_script", module)  # its dataclasses look it up
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("wanted", "tty", "shown"), [(True, True, True), (True, False, False), (False, True, False)]
)
def test_dev_shows_the_line_on_a_terminal_for_a_first_sync_only(
    wanted: bool, tty: bool, shown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", Tty() if tty else io.StringIO())
    line = _dev(monkeypatch).progress_line("[dev] py312", wanted)
    assert line.label == "[dev] py312"
    assert line.enabled is shown
