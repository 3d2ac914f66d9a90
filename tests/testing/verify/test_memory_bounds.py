"""verify's memory bounds never change an answer.

At pod scale verify would keep, for rule 6, every completed wait with the clocks of
what it counted (devices^2 records of devices entries on a ring), and, for messages,
every wait that was released by whichever contributions landed first. It drops a
semaphore's waits once every contributor is ordered after them (a contributor new to
the semaphore that is not makes the walk run again keeping them all: ``PruneMiss``),
and keeps only the newest waits for messages (a message that may need an older one
makes the walk run again keeping them all: ``LooseMiss``). These tests run every
protocol case and the collectives with the bounds as tight as they go and with no
bounds, and compare what verify says, word for word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from safedma.testing._verify.model import semantics as _semantics
from safedma.testing._verify.model.regions import Buffer
from safedma.testing._verify.model.semantics import LooseMiss, Machine, PruneMiss
from tests import corpus
from tests.corpus import _run

_TIGHT = {"_PRUNE_FROM": 1, "_LOOSE_KEPT": 0}
_NONE = {"_PRUNE_FROM": 10**9, "_LOOSE_KEPT": None}


class _Misses:
    """How often each fallback ran (PruneMiss, LooseMiss raised inside the walks)."""

    def __init__(self) -> None:
        self.prune = 0
        self.loose = 0


@pytest.fixture
def misses(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Misses]:
    seen = _Misses()
    prune_waits = Machine._prune_waits
    explain = Machine.explain

    def counting_prune(self: Machine, sem: Any) -> None:
        prune_waits(self, sem)

    def counting_explain(self: Machine, p: int, q: int, t: int) -> Any:
        try:
            return explain(self, p, q, t)
        except LooseMiss:
            seen.loose += 1
            raise

    contribute = Machine._contribute

    def counting_contribute(self: Machine, sem: Any, c: Any) -> None:
        try:
            contribute(self, sem, c)
        except PruneMiss:
            seen.prune += 1
            raise

    monkeypatch.setattr(Machine, "_prune_waits", counting_prune)
    monkeypatch.setattr(Machine, "explain", counting_explain)
    monkeypatch.setattr(Machine, "_contribute", counting_contribute)
    yield seen


def _say(run: Callable[[], Any]) -> tuple[str, str]:
    """What verify says: the report, or the error's class and message."""
    try:
        report = run()
    except Exception as err:  # every verdict is compared, errors included
        return type(err).__name__, str(err)
    return "clean", repr(report)


def _bounded(monkeypatch: pytest.MonkeyPatch, bounds: dict[str, Any]) -> None:
    for name, value in bounds.items():
        monkeypatch.setattr(_semantics, name, value)


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any]) -> tuple[Any, Any]:
    _bounded(monkeypatch, _TIGHT)
    tight = _say(run)
    _bounded(monkeypatch, _NONE)
    unbounded = _say(run)
    return tight, unbounded


def test_tight_bounds_say_what_no_bounds_say_of_every_protocol_case(
    monkeypatch: pytest.MonkeyPatch, misses: _Misses
) -> None:
    verdicts = set()
    for case in corpus.cases("verify", tags=("pair",)):
        tight, unbounded = _both(monkeypatch, lambda case=case: _run.verify(case.build()))
        assert tight == unbounded, case
        verdicts.add(tight[0])
    # the cases cover clean runs and several kinds of error, and the message fallback
    # ran (no wait is kept for messages: every explanation walks again)
    assert "clean" in verdicts and len(verdicts) >= 4, verdicts
    assert misses.loose > 0


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce"])
@pytest.mark.parametrize("invocations", [1, 2])
def test_tight_bounds_say_what_no_bounds_say_of_the_collectives(
    monkeypatch: pytest.MonkeyPatch, kind: str, invocations: int
) -> None:
    from benchmarks.verify import _args, _kernel
    from safedma.testing import abstract_mesh, verify

    shape, names = (8,), ("x",)
    x, ins, outs = _args(kind, shape, names)

    def run() -> Any:
        return verify(
            _kernel(kind),
            x,
            mesh=abstract_mesh(shape, names),
            in_specs=ins,
            out_specs=outs,
            invocations=invocations,
        )

    tight, unbounded = _both(monkeypatch, run)
    assert tight == unbounded
    assert tight[0] == "clean"


# ------------------------------------------------------------ the pruning rule itself


def _sems(m: Machine) -> tuple[Any, Any]:
    s = m.sem(Buffer(101, 0, "s", (), 4, "SEMAPHORE", "REGULAR"), 0)
    ack = m.sem(Buffer(102, 1, "ack", (), 4, "SEMAPHORE", "REGULAR"), 0)
    return s, ack


def _rounds(m: Machine, s: Any, ack: Any, n: int) -> None:
    """b signals a's ``s``, a waits and acknowledges: b is ordered after a's waits."""
    for i in range(n):
        m.signal(1, s, 1, f"k.py:{i}")
        assert m.try_wait(0, s, 1, where=f"k.py:{100 + i}")
        m.signal(0, ack, 1, f"k.py:{200 + i}")
        assert m.try_wait(1, ack, 1, where=f"k.py:{300 + i}")


def _after_rounds(monkeypatch: pytest.MonkeyPatch, bounds: dict[str, Any]) -> tuple[Machine, Any]:
    """A machine of a, b, c after 20 rounds of ``_rounds`` under ``bounds``; a's ``s``."""
    _bounded(monkeypatch, bounds)
    m = Machine(["a", "b", "c"])
    s, ack = _sems(m)
    _rounds(m, s, ack, 20)
    return m, s


def test_a_contributor_new_to_a_pruned_semaphore_stops_the_pruned_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, s = _after_rounds(monkeypatch, _TIGHT)
    assert len(s.waits) < 20  # b knows a's waits: they were dropped
    with pytest.raises(PruneMiss):
        m.signal(2, s, 1, "k.py:999")  # c knows none of them: it may count at any

    # with every wait kept, the same signal counts early at a past wait (rule 6)
    m, s = _after_rounds(monkeypatch, _NONE)
    assert len(s.waits) == 20
    m.signal(2, s, 1, "k.py:999")
    assert m.hints.changed


def test_a_new_contributor_ordered_after_the_pruned_waits_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, s = _after_rounds(monkeypatch, _TIGHT)
    go = m.sem(Buffer(103, 2, "go", (), 4, "SEMAPHORE", "REGULAR"), 0)
    m.signal(0, go, 1, "k.py:500")  # a tells c after its last wait
    assert m.try_wait(2, go, 1, where="k.py:501")
    m.signal(2, s, 1, "k.py:999")  # ordered after every wait of a: no fallback
    assert not m.hints.changed


def _random_run(seed: int) -> list[object]:
    """Four participants signalling and waiting on each other's semaphores at random;
    what each step leaves behind, and the hints found (rule 6)."""
    rng = np.random.default_rng(seed)
    m = Machine(["a", "b", "c", "d"])
    sems = [
        m.sem(Buffer(100 + i, i % 4, f"s{i}", (), 4, "SEMAPHORE", "REGULAR"), 0) for i in range(6)
    ]
    trace: list[object] = []
    for step in range(400):
        s = sems[int(rng.integers(0, len(sems)))]
        if rng.random() < 0.5:
            # most signals come from one partner per semaphore, a few from anyone
            p = (s.buffer.owner + 1) % 4 if rng.random() < 0.9 else int(rng.integers(0, 4))
            m.signal(p, s, 1, f"k.py:{step}")
        else:
            trace.append(m.try_wait(s.buffer.owner, s, 1, where=f"k.py:{step}"))
        trace.append(
            (m.clocks.rows.tolist(), [(x.credit, [c.seq for c in x.pending]) for x in sems])
        )
    hints = {w: sorted(early) for w, early in m.hints.by_wait.items()}
    return [trace, hints]


def test_pruned_random_runs_find_the_same_early_contributions_or_fall_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fell_back = compared = 0
    for seed in range(40):
        _bounded(monkeypatch, _NONE)
        unbounded = _random_run(seed)
        _bounded(monkeypatch, _TIGHT)
        try:
            tight = _random_run(seed)
        except PruneMiss:
            fell_back += 1
            continue
        assert tight == unbounded, seed
        compared += 1
    assert compared >= 10 and fell_back >= 1, (compared, fell_back)
