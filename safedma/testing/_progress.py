"""One status line on stderr while a person waits: verify and simulate on many devices,
``./dev``'s first environment sync.

Why: a walk over 256 devices or a first ``uv sync`` takes minutes with nothing on the
screen. The line appears only once the work has run for :data:`DELAY_S` seconds (a
quick call prints nothing), is redrawn at most every :data:`INTERVAL_S` seconds by a
background thread (so a phase that blocks, a compilation or a subprocess, still shows
its elapsed time), and is erased when the work ends, leaving the screen as it was.
It is drawn only on a terminal, unless asked for (``enabled=True``); never when
``enabled=False``.

The work sets what the line says with :meth:`Progress.status`: a string, or a
function the thread calls when it redraws (the work's own counters, read without
costing the work anything). Standard library only: ``./dev`` loads this file before
any environment exists.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

__all__ = ["DELAY_S", "INTERVAL_S", "Progress"]

DELAY_S = 2.0  # seconds of work before the line first appears
INTERVAL_S = 0.25  # the least time between two redraws

Status = str | Callable[[], str]


class Progress:
    """A progress line for one piece of work; use it as a context manager.

    ``enabled``: True draws the line, False never does, None (the default) draws it
    when ``stream`` (stderr unless given) is a terminal. ``clock`` and ``thread`` are
    for tests: a fake clock, and no thread (the test calls :meth:`tick` itself).
    """

    def __init__(
        self,
        label: str,
        enabled: bool | None = None,
        *,
        stream: TextIO | None = None,
        delay_s: float | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        thread: bool = True,
    ) -> None:
        self.label = label
        self.stream: TextIO = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty()) if callable(isatty) else False
        self.enabled = enabled
        self.delay_s = DELAY_S if delay_s is None else delay_s
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self._clock = clock
        self._use_thread = thread
        self._status: Status = ""
        self._started = clock()
        self._last_draw: float | None = None
        self._width = 0  # characters on the line now (0: nothing shown)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the work's side

    def status(self, status: Status) -> None:
        """What the line says from now on (a function is called at each redraw); drawn
        now if a redraw is due, so a short run still shows its line once the delay is
        over, whenever the redrawing thread gets to run."""
        self._status = status
        if self._thread is not None:
            self.tick()

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the clock (and the redrawing thread, when enabled)."""
        self._started = self._clock()
        if self.enabled and self._use_thread and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"safedma-progress-{self.label}", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop redrawing and erase the line, if one was drawn."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._lock:
            if self._width:
                self._write("\r" + " " * self._width + "\r")
                self._width = 0

    # ------------------------------------------------------------ drawing

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self, now: float | None = None) -> bool:
        """Redraw the line if it is due; whether it was drawn."""
        if not self.enabled or self._stop.is_set():
            return False
        now = self._clock() if now is None else now
        if now - self._started < self.delay_s:
            return False
        if self._last_draw is not None and now - self._last_draw < self.interval_s:
            return False
        line = self.render(now)
        with self._lock:
            if self._stop.is_set():
                return False
            pad = max(0, self._width - len(line))
            self._write("\r" + line + " " * pad)
            self._width = len(line)
            self._last_draw = now
        return True

    def render(self, now: float) -> str:
        """The line as it reads at time ``now``, cut to the terminal's width."""
        status = self._status
        try:
            text = status() if callable(status) else status
        except Exception as err:  # a counter read mid-update: say so, never fail the work
            text = f"({type(err).__name__})"
        elapsed = f"{now - self._started:.0f} s"
        line = f"{self.label}: {text} ({elapsed})" if text else f"{self.label} ({elapsed})"
        width = shutil.get_terminal_size((100, 24)).columns - 1
        return line if len(line) <= width else line[: max(0, width - 3)] + "..."

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream: the line is only a courtesy
            self.enabled = False
