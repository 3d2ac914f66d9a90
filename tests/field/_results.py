"""results.json: the field lane's committed verdicts, one run's records, and the summary.

Each test writes its record to the run folder (one file per test, so pytest-xdist
workers never share a file); ``python -m tests.field.summary`` gathers them, prints the
lane's closing line and, with ``--record``, writes them into results.json, keeping the
readings people wrote there. The committed file is what the lane asserts: a checker
whose verdict on a kernel or a mutant changes fails its test until the change is read
and recorded.

A mutant's verdict ``kept`` says whether it counts: it traces, its program differs from
the original's, the original verifies clean, and a removed wait or barrier runs on the
driven inputs (a mutant that verify passes with exactly the original's copies, waits
and signals runs the original's program). A kept mutant that verify does not
catch counts as missed unless results.json holds a reading for it that starts with
``equivalent:`` (the changed program still obeys every rule, and why).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results.json")
RUN_VARIABLE = "SAFEDMA_FIELD_RUN"


def committed() -> dict[str, Any]:
    if not RESULTS.exists():
        return {"kernels": {}, "mutants": {}}
    data: dict[str, Any] = json.loads(RESULTS.read_text())
    return data


def run_folder() -> Path | None:
    folder = os.environ.get(RUN_VARIABLE)
    return Path(folder) if folder else None


def write(kind: str, key: str, record: dict[str, Any]) -> None:
    """Keep one test's record in the run folder (if the lane runs with one)."""
    folder = run_folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(f"{kind}/{key}".encode()).hexdigest()[:16]
    (folder / f"{name}.json").write_text(json.dumps({"kind": kind, "key": key, "record": record}))


def gathered(folder: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"kernels": {}, "mutants": {}}
    for path in sorted(folder.glob("*.json")):
        item = json.loads(path.read_text())
        out[item["kind"]][item["key"]] = item["record"]
    return out


def counts_as_missed(record: dict[str, Any], reading: str = "") -> bool:
    """A kept mutant verify passes is missed unless read as equivalent (``reading``: the
    one results.json holds, for a run's record that carries none)."""
    return not str(record.get("reading", reading)).startswith("equivalent:")


def summary(results: dict[str, dict[str, Any]]) -> str:
    """The lane's closing line over one run's records (a mutant read as equivalent in
    results.json counts as such in the run too)."""
    kernels = results["kernels"]
    packages = {r["package"] for r in kernels.values()}
    false_alarms = sum(
        1
        for r in kernels.values()
        if any(str(reading).startswith("false alarm") for reading in r.get("readings", {}).values())
        or any(r.get(tool, {}).get("outcome") == "crash" for tool in ("verify", "trace"))
    )
    unsupported = sum(
        1 for r in kernels.values() if r.get("verify", {}).get("outcome") == "unsupported"
    )
    counted = _counted(results)
    caught = sum(1 for r in counted if r["verify"]["caught"])
    at_line = sum(1 for r in counted if r["verify"]["at_line"])
    traced = sum(1 for r in counted if r["trace"]["caught"])
    return (
        f"field: {len(kernels)} kernels ({len(packages)} packages), {false_alarms} false alarms, "
        f"{unsupported} unsupported; mutants {len(counted)}: verify {caught} caught, "
        f"{at_line} at the line to fix; trace {traced} caught"
    )


def _counted(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The mutants scored: kept, and caught or read as a real miss (not equivalent)."""
    readings = {k: str(r.get("reading", "")) for k, r in committed()["mutants"].items()}
    return [
        r
        for key, r in results["mutants"].items()
        if r.get("kept") and (r["verify"]["caught"] or counts_as_missed(r, readings.get(key, "")))
    ]


# The operators whose mistake shows on one path of one kernel body, without the inputs'
# values: a start left unwaited (a dropped wait), a wait of another size than its copy,
# a start that runs where its guard kept it from running. The trace-time checks are
# scored on these; the others (a slot off by one, a wrong neighbour) need the values.
PER_PATH_OPERATORS = ("drop_wait", "wait_send_only", "wrong_size_wait", "unguarded_start")


def per_path_line(results: dict[str, dict[str, Any]]) -> str:
    """How many kept mutants of :data:`PER_PATH_OPERATORS` the trace-time checks catch."""
    kept = [r for r in _counted(results) if r.get("operator") in PER_PATH_OPERATORS]
    traced = sum(1 for r in kept if r["trace"]["caught"])
    at_line = sum(1 for r in kept if r["trace"].get("at_line"))
    return (
        f"trace on mistakes one path shows ({', '.join(PER_PATH_OPERATORS)}): "
        f"{traced} of {len(kept)} caught, {at_line} at the line to fix"
    )


def record_run(results: dict[str, dict[str, Any]]) -> None:
    """Write one (whole) run's records as results.json, keeping the reading of every
    mutant still there (a kernel's ``readings`` come from its driver; a mutant's
    ``reading`` is written here, by hand)."""
    old = committed()
    merged: dict[str, Any] = {"kernels": dict(results["kernels"]), "mutants": {}}
    for key, record in results["mutants"].items():
        previous = old.get("mutants", {}).get(key, {})
        if "reading" in previous:
            record = {**record, "reading": previous["reading"]}
        merged["mutants"][key] = record
    merged["kernels"] = dict(sorted(merged["kernels"].items()))
    merged["mutants"] = dict(sorted(merged["mutants"].items()))
    RESULTS.write_text(json.dumps(merged, indent=1, sort_keys=False) + "\n")
