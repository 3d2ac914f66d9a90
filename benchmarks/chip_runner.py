"""Run the chip cases of benchmarks/chip_cases.py on a TPU, in child processes under timeouts.

A mistake may hang the chip (a wait nobody satisfies) or crash the program,
and only one process may hold a TPU at a time, so the parent never starts
jax's TPU backend: it starts ``python -m benchmarks.chip_runner --child
CASE...``, which takes the chip, runs each case's ``fix`` then its ``bug``
and reports every stage as one line of JSON on stdout. The parent reads the
lines with deadlines. A child that stops reporting while a kernel runs is
killed (by its process id) after ``hang_s`` seconds: that case hung. A child
that dies, or whose kernel raises, crashed the case. Either way the cases it
had not reached start again in a fresh child, after ``pause_s`` seconds for
the chip to be released. Cases whose bug may hang, crash or leave semaphores
non-zero (``ChipCase.alone``) always get a child of their own; the others
share one.

The parent imports jax (through chip_cases) but never asks it for a device,
so it can run inside a pytest process that has not used the chip yet.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
MARK = "@@chip "  # prefixes the child's report lines, so stray prints cannot pass for one
STARTUP_S = 180.0  # python, jax and the TPU backend
COMPILE_S = 180.0  # tracing, lowering and compiling one variant
DEFAULT_HANG_S = 10.0  # a kernel of these sizes runs in well under a millisecond
DEFAULT_PAUSE_S = 4.0
SELF_TEST_VARIABLE = "SAFEDMA_CHIP_RUNNER_SELF_TEST"


# ------------------------------------------------------------------ results


@dataclasses.dataclass
class VariantResult:
    """What one variant (``fix`` or ``bug``) did at one size."""

    variant: str
    rows: int
    outcome: str  # one of chip_cases.OUTCOMES
    detail: str = ""
    wrong_fractions: list[float] = dataclasses.field(default_factory=list)
    seconds: float | None = None


@dataclasses.dataclass
class CaseResult:
    name: str
    fix: VariantResult | None = None
    bug: list[VariantResult] = dataclasses.field(default_factory=list)
    infrastructure: str = ""  # set when the case could not be run at all

    @property
    def bug_outcome(self) -> str:
        """The bug's outcome over its sizes: the most telling one seen."""
        from benchmarks.chip_cases import SEVERITY

        seen = [v.outcome for v in self.bug]
        if not seen:
            return "not run"
        return min(seen, key=lambda o: SEVERITY.index(o) if o in SEVERITY else len(SEVERITY))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fix": dataclasses.asdict(self.fix) if self.fix else None,
            "bug": [dataclasses.asdict(v) for v in self.bug],
            "bug_outcome": self.bug_outcome,
            "infrastructure": self.infrastructure,
        }


@dataclasses.dataclass
class ChipRun:
    """Everything the children reported."""

    platform: str | None = None  # None: no child got as far as asking jax
    device_kind: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    no_tpu: str = ""  # why no case ran on a TPU, when none did
    cases: dict[str, CaseResult] = dataclasses.field(default_factory=dict)
    children: int = 0
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "device_kind": self.device_kind,
            "versions": self.versions,
            "no_tpu": self.no_tpu,
            "children": self.children,
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
            "cases": {n: c.as_dict() for n, c in self.cases.items()},
        }


# ------------------------------------------------------------------ parent side


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The child needs the TPU; the parent may have pinned itself to the CPU.
    env["JAX_PLATFORMS"] = os.environ.get("SAFEDMA_CHIP_PLATFORMS", "tpu,cpu")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _reader(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith(MARK):
            lines.put(line[len(MARK) :])
    lines.put(None)  # end of output


def _last_lines(path: Path, n: int = 6) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith(("WARNING", "I0000", "W0000"))
    ]
    return " | ".join(keep[-n:])[:600]


class _Child:
    """One child process and its report lines."""

    def __init__(self, names: Sequence[str], hang_s: float) -> None:
        self.stderr_path = Path(tempfile.mkstemp(prefix="chip-child-", suffix=".err")[1])
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in close()
        cmd = [sys.executable, "-m", "benchmarks.chip_runner", "--child", *names]
        cmd += ["--hang-s", str(hang_s)]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=_reader, args=(self.proc.stdout, self.lines), daemon=True).start()

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next report, None at end of output; raises queue.Empty on timeout."""
        line = self.lines.get(timeout=timeout)
        return None if line is None else json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # this child only, by its pid
        self.proc.wait(timeout=60)

    def close(self) -> str:
        """Wait for the exit; the stderr tail when the exit was not clean."""
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        self._stderr.close()
        tail = _last_lines(self.stderr_path) if rc else ""
        self.stderr_path.unlink(missing_ok=True)
        return f"exit {rc}: {tail}" if rc else ""


def _groups(names: Sequence[str], isolate: bool) -> list[list[str]]:
    from benchmarks.chip_cases import BY_NAME

    if isolate:
        return [[n] for n in names]
    shared = [n for n in names if not BY_NAME[n].alone]
    alone = [[n] for n in names if BY_NAME[n].alone]
    return ([shared] if shared else []) + alone


def _variant(event: dict[str, Any], outcome: str, detail: str = "") -> VariantResult:
    return VariantResult(event["variant"], int(event["rows"]), outcome, detail)


def _drive(
    child: _Child, run: ChipRun, hang_s: float, say: Callable[[str], None]
) -> tuple[list[str], str | None]:
    """Follow one child to its end. Returns the cases it finished and, if it stopped
    early, the case it stopped in."""
    finished: list[str] = []
    stage: dict[str, Any] | None = None
    ready = False
    timeout = STARTUP_S
    started = time.monotonic()
    while True:
        try:
            event = child.next(timeout)
        except queue.Empty:
            child.kill()
            if stage is not None and stage["stage"] == "done":  # every case reported
                run.notes.append(f"a child did not exit within {timeout:.0f} s of its last case")
                return finished, None
            if stage is None:
                if not ready:
                    run.platform = None if run.platform != "tpu" else "none"
                    run.no_tpu = run.no_tpu or f"a child did not start within {STARTUP_S:.0f} s"
                else:
                    run.notes.append(f"a child stopped reporting after {', '.join(finished)}")
                return finished, None
            name = stage["case"]
            if stage["stage"] == "run":
                waited = time.monotonic() - started
                v = _variant(stage, "hang", f"killed after {waited:.0f} s without finishing")
            else:
                v = _variant(stage, "hang", f"{stage['stage']} did not finish in {timeout:.0f} s")
            _store(run, name, v)
            say(f"  {name} {stage['variant']} {stage['rows']} rows: {v.outcome} ({v.detail})")
            return finished, name
        if event is None:  # the child's output ended
            tail = child.close()
            if stage is not None and stage.get("stage") != "done":
                name = stage["case"]
                v = _variant(stage, "crash", f"the process died during {stage['stage']}: {tail}")
                _store(run, name, v)
                say(f"  {name}: crash ({v.detail[:200]})")
                return finished, name
            if tail and len(finished) > 1:
                run.notes.append(f"the child of {', '.join(finished)} then exited: {tail}")
            elif tail and finished:  # its one case reported, then the process failed
                last = finished[-1]
                v = VariantResult("bug", 0, "crash", f"after its runs, the process exited: {tail}")
                _store(run, last, v)
                say(f"  {last}: crash at exit ({tail[:200]})")
            elif tail and run.platform is None:
                run.no_tpu = run.no_tpu or f"the child failed before reporting: {tail}"
            return finished, None
        kind = event["event"]
        started = time.monotonic()
        if kind == "ready":
            ready = True
            run.platform = event["platform"]
            run.device_kind = event.get("device_kind", "")
            run.versions = event.get("versions", {})
            if event["platform"] != "tpu":
                run.no_tpu = event["reason"]
        elif kind == "stage":
            stage = event
            timeout = hang_s if event["stage"] == "run" else COMPILE_S
        elif kind == "result":
            v = _variant(event, event["outcome"], event.get("detail", ""))
            v.wrong_fractions = event.get("wrong_fractions", [])
            v.seconds = event.get("seconds")
            _store(run, event["case"], v)
            say(
                f"  {event['case']} {event['variant']} {event['rows']} rows: {v.outcome}"
                + (f" ({v.detail[:160]})" if v.detail else "")
                + (f" wrong {v.wrong_fractions}" if any(v.wrong_fractions) else "")
            )
            stage = {**event, "stage": "between variants"}
            timeout = COMPILE_S
        elif kind == "case done":
            finished.append(event["case"])
            stage = None
            timeout = COMPILE_S
        elif kind == "stopping":  # a run raised: the child leaves; the rest go to a new one
            child.close()
            return finished, event["case"]


def _store(run: ChipRun, name: str, v: VariantResult) -> None:
    case = run.cases.setdefault(name, CaseResult(name))
    if v.variant == "fix":
        case.fix = v
    else:
        case.bug.append(v)


def run_on_chip(
    names: Sequence[str],
    *,
    hang_s: float = DEFAULT_HANG_S,
    pause_s: float = DEFAULT_PAUSE_S,
    isolate: bool = False,
    say: Callable[[str], None] = print,
) -> ChipRun:
    """Run the named cases on the chip, in children; never takes the chip itself.

    ``isolate``: every case in a child of its own, not only the ``alone`` ones.
    """
    run = ChipRun()
    for n in names:
        run.cases[n] = CaseResult(n)
    began = time.monotonic()
    pending: list[list[str]] = _groups(names, isolate)
    retried = False
    while pending:
        group = pending.pop(0)
        if run.children:
            time.sleep(pause_s)  # let the previous child's chip be released
        run.children += 1
        say(f"[chip] child {run.children}: {', '.join(group)}")
        had_tpu = run.platform == "tpu"
        child = _Child(group, hang_s)
        try:
            finished, stopped = _drive(child, run, hang_s, say)
        finally:
            child.kill()
            child.close()
        if run.platform != "tpu":
            if had_tpu and not retried:  # the chip not yet released by a killed child
                say(f"[chip] the chip was not free ({run.no_tpu}); one more try")
                retried = True
                run.platform, run.no_tpu = "tpu", ""
                time.sleep(4 * pause_s)
                pending.insert(0, group)
                continue
            for n in names:
                if run.cases[n].fix is None and not run.cases[n].bug:
                    run.cases[n].infrastructure = run.no_tpu or "no child reached the chip"
            break
        rest = [n for n in group if n not in finished and n != stopped]
        if rest:
            pending.insert(0, rest)
    run.seconds = time.monotonic() - began
    return run


# ------------------------------------------------------------------ child side


def _emit(**event: Any) -> None:
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # Mosaic's verifier puts the useful part after a generic first sentence.
    for line in lines:
        if "Error details:" in line:
            return f"{type(err).__name__}: {line.split('Error details:', 1)[1].strip()}"[:300]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("jax", "jaxlib", "libtpu", "libtpu-nightly"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _plan(case: Any) -> Iterator[tuple[str, int]]:
    yield "fix", case.fix_rows
    for rows in case.bug_rows:
        yield "bug", rows


def child_main(names: Sequence[str], hang_s: float) -> int:
    """Take the chip, run each case, report every stage; leave after a run error."""
    try:
        import jax

        device = jax.devices()[0]
        platform = str(device.platform)
    except Exception as err:  # no TPU backend: say why and leave
        _emit(event="ready", platform="none", reason=f"no TPU: {_first_line(err)}")
        return 0
    # The runner's own test hook: run the cases in jax's TPU interpret mode on the CPU,
    # where an over-wait hangs as on a chip, to exercise the kill and restart paths.
    self_test = os.environ.get(SELF_TEST_VARIABLE) == "interpret"
    if self_test:
        platform = "tpu"
    reason = "" if platform == "tpu" else f"no TPU: jax.devices()[0].platform is {platform!r}"
    _emit(
        event="ready",
        platform=platform,
        device_kind=str(device.device_kind) + (" (interpret mode)" if self_test else ""),
        versions=_versions(),
        reason=reason,
    )
    if platform != "tpu":
        return 0
    if not self_test:
        return _run_cases(names, device)
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        return _run_cases(names, device)


def _run_cases(names: Sequence[str], device: Any) -> int:
    import jax
    import numpy as np

    from benchmarks import chip_cases as cc

    call = 0
    for name in names:
        case = cc.BY_NAME[name]
        for variant, rows in _plan(case):
            where = {"case": name, "variant": variant, "rows": rows}
            _emit(event="stage", stage="trace", **where)
            fn = case.build(variant, rows)
            spec = jax.ShapeDtypeStruct((rows, cc.LANES), np.float32)
            try:
                traced = jax.jit(fn).trace(spec)
            except Exception as err:
                _emit(event="result", outcome=cc.TRACE_ERROR, detail=_first_line(err), **where)
                continue
            _emit(event="stage", stage="lower", **where)
            try:
                lowered = traced.lower()
            except Exception as err:
                _emit(event="result", outcome=cc.LOWERING_ERROR, detail=_first_line(err), **where)
                continue
            _emit(event="stage", stage="compile", **where)
            try:
                compiled = lowered.compile()
            except Exception as err:
                _emit(event="result", outcome=cc.COMPILE_ERROR, detail=_first_line(err), **where)
                continue
            trials = 1 if variant == "fix" else case.trials
            fractions: list[float] = []
            began = time.perf_counter()
            for trial in range(trials):
                call += 1
                x = cc.example(rows, call % 16)
                _emit(event="stage", stage="run", trial=trial, **where)
                try:
                    out = compiled(jax.device_put(x, device))
                    got = np.asarray(jax.block_until_ready(out))
                except Exception as err:
                    _emit(event="result", outcome=cc.CRASH, detail=_first_line(err), **where)
                    _emit(event="stopping", case=name)
                    return 0
                fractions.append(cc.wrong_fraction(got, x))
            seconds = time.perf_counter() - began
            if any(fractions):
                outcome = cc.WRONG
            elif variant == "fix" or case.lane_only:
                outcome = cc.RIGHT
            else:
                outcome = cc.RIGHT_BY_LUCK
            _emit(
                event="result",
                outcome=outcome,
                wrong_fractions=[round(f, 6) for f in fractions],
                seconds=round(seconds, 4),
                **where,
            )
        _emit(event="case done", case=name)
    _emit(event="stage", stage="done", case="", variant="", rows=0)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chip_runner")
    p.add_argument("--child", nargs="+", metavar="CASE", required=True)
    p.add_argument("--hang-s", type=float, default=DEFAULT_HANG_S)
    ns = p.parse_args(argv)
    return child_main(ns.child, ns.hang_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
