"""Scoped scratch (``safedma/_scratch.py``): ``sd.run_scoped`` hands its keyword options
to ``pl.run_scoped``. Scoped buffers and semaphores of every kind against the raw
spelling: tests/corpus/run_scoped.py."""

from __future__ import annotations

from typing import Any

import safedma as sd
import safedma._scratch as scratch


def test_run_scoped_passes_collective_axes() -> None:
    seen: dict[str, Any] = {}

    def fake(body: Any, *types: Any, **kw: Any) -> Any:
        seen.update(kw)
        return None

    original = scratch.pl.run_scoped
    scratch.pl.run_scoped = fake  # type: ignore[assignment]
    try:
        sd.run_scoped(lambda flag: None, sd.regular_semaphore(), collective_axes="x")
    finally:
        scratch.pl.run_scoped = original  # type: ignore[assignment]
    assert seen == {"collective_axes": "x"}
