"""What each checker says of a field program, as a small record that results.json keeps.

A verdict is ``clean``, ``finding`` (a checker's error: the class and the message's
first line), ``unsupported`` (verify's refusal) or ``crash`` (anything else: a defect of
the checker or of the driver, never an acceptable outcome).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

from safedma.testing import VerifyReport
from tests.corpus import _run
from tests.corpus._case import Program

_PACKAGE_ROOT = re.compile(r"/\S*?/(?:site-packages|\.venv/field/[^/\s]+)/")
"""Where this machine installed a package: cut from the stored headline, so results.json
names ``tpu_inference/kernels/...`` wherever the lane ran."""

VERIFY_TIMEOUT_S = 120.0
SIMULATE_TIMEOUT_S = 60.0
"""A walk still running after this is reported as a crash, never waited out."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str  # "clean" | "finding" | "unsupported" | "crash"
    error: str = ""  # the exception's class name
    message: str = ""  # the whole message (not stored; read for line numbers)
    seconds: float = 0.0
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def headline(self) -> str:
        """The message's first line, without run-specific numbers (stored)."""
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return _PACKAGE_ROOT.sub("", first)[:300]

    def names_line(self, filename: str, lines: tuple[int, int], follows: int = 0) -> bool:
        """The message names ``filename:LINE`` (as ``.../name.py:LINE``) for a line in
        ``lines`` (first, last), or, for a removed statement that followed line
        ``follows``, says it belongs ``after filename:follows``."""
        base = re.escape(filename.rsplit("/", 1)[-1])
        named = (int(n) for n in re.findall(rf"\b{base}:(\d+)\b", self.message))
        if any(lines[0] <= n <= lines[1] for n in named):
            return True
        after = (int(n) for n in re.findall(rf"\bafter (?:\S*/)?{base}:(\d+)\b", self.message))
        return follows > 0 and follows in after

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome}
        if self.error:
            out["error"] = self.error
        if self.outcome in ("finding", "unsupported", "crash"):
            out["says"] = self.headline
        out.update(self.detail)
        return out


def _timed(run: Callable[[], Any], classify: Callable[[BaseException], str]) -> Verdict:
    start = time.perf_counter()
    try:
        result = run()
    except Exception as err:  # every failure is a verdict here; the lane judges it
        seconds = time.perf_counter() - start
        return Verdict(classify(err), type(err).__name__, str(err), seconds)
    seconds = time.perf_counter() - start
    detail = {}
    if isinstance(result, VerifyReport):
        detail = {
            "devices": int(result.devices),
            "dmas": int(result.dmas),
            "waits": int(result.waits),
            "signals": int(result.signals),
        }
    return Verdict("clean", seconds=seconds, detail=detail)


def _verify_class(err: BaseException) -> str:
    from safedma.testing import (
        SimulationError,
        SimulationTimeoutError,
        SimulationUnsupportedError,
        VerificationUnsupportedError,
    )

    if isinstance(err, (VerificationUnsupportedError, SimulationUnsupportedError)):
        return "unsupported"
    if isinstance(err, SimulationTimeoutError):
        return "crash"
    if isinstance(err, SimulationError):
        return "finding"
    return "crash"


def _trace_class(err: BaseException) -> str:
    from safedma import SafeDmaError

    return "finding" if isinstance(err, SafeDmaError) else "crash"


def verify(program: Program) -> Verdict:
    """``safedma.testing.verify`` on the program's device-free mesh."""
    from safedma.testing import verify as run

    mesh = None if program.mesh is None else program.mesh.abstract()

    def go() -> Any:
        return run(
            program.fn, *program.args, mesh=mesh, invocations=program.invocations,
            timeout_s=VERIFY_TIMEOUT_S, progress=False,
        )  # fmt: skip

    return _timed(go, _verify_class)


def trace(program: Program) -> Verdict:
    """The trace-time checks: every raw ``pl.pallas_call`` body traced under ``sd.checked``.

    jax's caches are emptied first: a kernel behind a nested ``jax.jit`` that an earlier
    checker traced would otherwise come from the cache, its body never traced again."""
    import jax

    def go() -> Any:
        jax.clear_caches()
        return _run.trace(program)

    return _timed(go, _trace_class)


def simulate(program: Program) -> Verdict:
    """``safedma.testing.simulate``: jax's TPU interpreter with race detection. A program
    whose wrapper asks for the TPU generation runs under the abstract mesh naming it."""
    import contextlib

    import jax

    chip = program.mesh is not None and not program.mesh.shape
    context = (
        jax.sharding.use_abstract_mesh(program.mesh.abstract())
        if chip
        else contextlib.nullcontext()
    )

    def go() -> Any:
        with context:
            return _run.simulate(program, timeout_s=SIMULATE_TIMEOUT_S)

    return _timed(go, _verify_class)


CHECKERS: dict[str, Callable[[Program], Verdict]] = {
    "verify": verify,
    "trace": trace,
    "simulate": simulate,
}
