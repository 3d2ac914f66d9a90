"""results.json, the field lane's committed verdicts, is consistent and is what the
manual reports: runs in the ordinary suite, with no field package installed."""

from __future__ import annotations

from pathlib import Path

from tests.field import _results

MANUAL = Path(__file__).resolve().parents[2] / "docs" / "verify.md"
READINGS = ("true bug:", "by design:", "false alarm:", "unsupported:")


def test_every_finding_and_refusal_is_read_and_none_is_a_false_alarm() -> None:
    kernels = _results.committed()["kernels"]
    assert kernels, "results.json holds no kernel: ./dev field --record"
    for name, record in kernels.items():
        for tool in ("verify", "trace", "simulate"):
            if tool not in record:
                continue  # simulate runs on one-device programs only
            outcome = record[tool]["outcome"]
            assert outcome != "crash", (name, tool, record[tool])
            reading = record.get("readings", {}).get(tool, "")
            if outcome == "finding" or (outcome == "unsupported" and tool != "simulate"):
                assert reading.startswith(READINGS), (name, tool, record[tool])
                assert not reading.startswith("false alarm:"), (name, reading)


def test_a_kept_mutant_is_scored_by_both_checkers() -> None:
    for key, record in _results.committed()["mutants"].items():
        if record["kept"]:
            assert {"caught", "at_line", "error"} <= set(record["verify"]), key
            assert record["verify"]["caught"] or not record["verify"]["at_line"], key
            assert "caught" in record["trace"], key
        else:
            assert record["why"], key


def test_the_manual_reports_the_committed_results() -> None:
    text = MANUAL.read_text()
    for line in (
        _results.summary(_results.committed()),
        _results.per_path_line(_results.committed()),
    ):
        assert line in text, f"docs/verify.md does not report the field lane's line:\n{line}"
    for name, record in _results.committed()["kernels"].items():
        if record.get("readings", {}).get("verify", "").startswith("true bug:"):
            assert f"`{name}`" in text, f"docs/verify.md does not name the true bug in {name}"
