"""Mutants of the field kernels: each one protocol mistake in the real source, scored on
whether verify and the trace-time checks catch it and name the line to fix."""

from __future__ import annotations

import pytest

from tests.field import _results
from tests.field._lane import lane_mutants, mutant_record


@pytest.mark.parametrize(
    ("kernel", "mutant"),
    [
        pytest.param(k, m, marks=pytest.mark.xdist_group(k.module), id=f"{k.name}::{m.ident}")
        for k, m in lane_mutants()
    ],
)
def test_field_mutant(kernel, mutant) -> None:  # type: ignore[no-untyped-def]
    key = f"{kernel.name}::{mutant.ident}"
    record = mutant_record(kernel, mutant)
    _results.write("mutants", key, record)
    expected = _results.committed()["mutants"].get(key)
    assert expected is not None, f"{key} is not in results.json yet: ./dev field --record"
    fields = ("kept", "why")
    assert {f: record.get(f) for f in fields} == {f: expected.get(f) for f in fields}, (
        key,
        record,
        expected,
    )
    if record["kept"]:
        for tool in ("verify", "trace"):
            assert record[tool] == expected[tool], (
                f"{tool} on {key}: results.json says {expected[tool]}, this run {record[tool]}"
            )
