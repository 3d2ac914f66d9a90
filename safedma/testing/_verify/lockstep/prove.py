"""The lockstep path's entry point: a device program proved clean, or why it gave up."""

from __future__ import annotations

from typing import Any

from safedma.testing._verify.lockstep.model import Bail, Model, SemBuf
from safedma.testing._verify.lockstep.rules import handler
from safedma.testing._verify.lockstep.walker import LockstepWalk

__all__ = ["Outcome", "prove"]


class Outcome:
    """What a lockstep run proved (the counts of verify's report), or why it gave up."""

    def __init__(self, model: Model | None, sems: list[SemBuf], reason: str = "") -> None:
        self.model, self.sems, self.reason = model, sems, reason


def prove(
    body: Any,
    axis_names: tuple[str, ...],
    axis_sizes: tuple[int, ...],
    invocations: int,
    cores: int,
    deadline: float,
    strict: bool = False,
) -> Outcome:
    """Walk the device program ``body`` (a shard_map body) in lockstep on every device,
    ``invocations`` times back to back.

    An error of the path itself (a case its rules mishandle) also gives up, so the
    per-device walk still answers; ``strict`` (the suite's check mode) raises it instead.
    """
    try:
        if cores != 1 or not axis_names:
            raise Bail("not a program of a one-core mesh")
        walk = LockstepWalk(axis_names, axis_sizes, deadline, handler)
        for _ in range(invocations):
            walk.run_program(body)
        return Outcome(walk.model, walk.all_sems)
    except Bail as why:
        return Outcome(None, [], str(why))
    except Exception as err:
        if strict:
            raise
        return Outcome(None, [], f"the lockstep path failed ({type(err).__name__}: {err})")
