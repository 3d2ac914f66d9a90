"""Every seeded mistake verify or simulate reports carries a ``# fix:`` marker on the line
a person would fix, and most of their verdicts hold the message to name it
(``tests/tools/fix_lines.py`` measures the share the messages reach; the drivers fail a
``line=True`` verdict whose message stops naming its line)."""

from __future__ import annotations

import pytest

from tests.corpus._case import Raises
from tests.tools.fix_lines import mistakes

# Seeded mistakes whose line to fix cannot carry a marker: it is not in this repository.
UNMARKED = {"jax_all_gather_on_4": "the line is in jax's installed all_gather.py"}

# The share of each tool's seeded-mistake verdicts that ask for the fix line; raise it
# when a message learns to name one more (docs/coverage.md quotes the measured count).
LEAST_SHARE = {"verify": 0.90, "simulate": 0.90}


@pytest.mark.parametrize("tool", sorted(LEAST_SHARE))
def test_every_seeded_mistake_marks_its_fix_line(tool: str) -> None:
    unmarked = []
    for case in mistakes(tool):
        if case.name in UNMARKED:
            continue
        try:
            case.fix_lines()
        except LookupError:
            unmarked.append(case.name)
    assert not unmarked, f"no '# fix:' line for {unmarked}"


@pytest.mark.parametrize("tool", sorted(LEAST_SHARE))
def test_most_seeded_mistakes_are_held_to_their_fix_line(tool: str) -> None:
    cases = mistakes(tool)
    held = [c for c in cases if isinstance(c.expect[tool], Raises) and c.expect[tool].line]
    share = len(held) / len(cases)
    assert share >= LEAST_SHARE[tool], (
        f"{tool}: {len(held)} of {len(cases)} seeded-mistake verdicts ask for the fix line"
    )
