"""The type-test corpus under pyright strict, with pyright's own expected rule at each error.

The same files as test_mypy.py, checked by pyright with the repository's
``pyrightconfig.json`` (strict, no rule relaxed):

* ``enableTypeIgnoreComments`` is false, so only ``# pyright: ignore[rule]``
  comments count and mypy's ``# type: ignore[code]`` cannot hide a pyright error;
* ``reportUnnecessaryTypeIgnoreComment`` is an error, so a pyright comment whose
  error did not happen (or a rule in it that was not reported) fails the file.

So "pyright reports nothing for a file" means: in a pass file, nothing at all;
in a fail file, every expected error happened with exactly the written rules
and nothing else did. The library (``safedma/``) must be clean too.

Where the two checkers disagree on a line (one reports, the other does not),
the decision is in docs/type-checkers.md and the line is listed in
``ONE_SIDED`` below; every other expected line carries both comments, with
pyright rules that correspond to mypy's codes (``MYPY_TO_PYRIGHT``).

pyright runs once per session, over the configured paths plus the seed's fail
file with its comments stripped (to show the real messages and prove the
mechanism can fail). pyright keeps no cache between runs: each session pays
for analysing the jax sources it imports.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from _comments import code_at, mypy_expectations, pyright_expectations, strip_expectations

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIBRARY = REPO / "safedma"
CONFIG = REPO / "pyrightconfig.json"
DOC = REPO / "docs" / "type-checkers.md"
PASS_FILES = sorted((HERE / "pass").glob("*.py"))
FAIL_FILES = sorted((HERE / "fail").glob("*.py"))
SEED_FILE = HERE / "fail" / "s1_semaphore_value.py"
# The pass files' one home for jax's partly unannotated functions (see its docstring).
JAX_SHIM = HERE / "pass" / "_typed_jax.py"

# What each mypy code of the corpus corresponds to in pyright. pyright strict also
# reports reportUnknown* next to many of them (the failed expression's type is
# Unknown, and strict reports each use of Unknown): those may accompany any line.
MYPY_TO_PYRIGHT: dict[str, frozenset[str]] = {
    "arg-type": frozenset({"reportArgumentType"}),
    "dict-item": frozenset({"reportArgumentType"}),
    "attr-defined": frozenset({"reportAttributeAccessIssue"}),
    # mypy's "Invalid self argument" (a RemoteCopy not yet [Given, Given]) is pyright's
    # 'Cannot access attribute ... Could not bind method'.
    "misc": frozenset({"reportAttributeAccessIssue"}),
    "call-arg": frozenset({"reportCallIssue"}),
    "index": frozenset({"reportIndexIssue"}),
    # An index no overload of an N-D semaphore array's .at accepts (wrong rank).
    "call-overload": frozenset({"reportCallIssue", "reportArgumentType"}),
    "return-value": frozenset({"reportReturnType"}),
    "assignment": frozenset({"reportAssignmentType"}),
    # `.wait().wait()`: pyright reports only the attribute access on None.
    "func-returns-value": frozenset(),
}
UNKNOWN_RULES = frozenset(
    {
        "reportUnknownMemberType",
        "reportUnknownVariableType",
        "reportUnknownArgumentType",
        "reportUnknownLambdaType",
        "reportUnknownParameterType",
    }
)


@dataclasses.dataclass(frozen=True)
class OneSided:
    case: str  # the id of the decision in docs/type-checkers.md
    reported_by: str  # "mypy" or "pyright"


# Lines of the fail files where exactly one checker reports an error, by file and
# code (docs/type-checkers.md, "Where the checkers disagree").
ONE_SIDED: dict[tuple[str, str], OneSided] = {
    ("extra_checker_differences.py", "copy = copy.with_send_sem(send)"): OneSided("D1", "mypy"),
    ("extra_checker_differences.py", 'copy = copy.to(safedma.neighbour("x"))'): OneSided(
        "D1", "mypy"
    ),
    ("extra_checker_differences.py", "copy.start().wait()"): OneSided("D1", "mypy"),
    (
        "extra_checker_differences.py",
        "safedma.LocalCopy(x, o, sem).start(priority=slot).wait()",
    ): OneSided("D2", "mypy"),
    ("extra_checker_differences.py", "handle.wait()"): OneSided("D3", "pyright"),
    ("s1_semaphore_value.py", "sem_val = pl.semaphore_read(send_sem)"): OneSided("D4", "pyright"),
}

# What pyright says about the seed (the same mistakes test_mypy.py strips and shows).
SEED_SEND_SEM_MESSAGE = (
    'Argument of type "Array" cannot be assigned to parameter "send_sem" of type "SemRef" '
    'in function "with_send_sem"\n  "Array" is not assignable to "SemRef"'
)


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    path: Path
    line: int  # 1-based
    severity: str
    rule: str | None
    message: str

    def render(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        first = self.message.splitlines()[0] if self.message else ""
        return f"{where}:{self.line}: {self.severity}: {first} ({self.rule})"


@dataclasses.dataclass(frozen=True)
class PyrightRun:
    returncode: int
    diagnostics: tuple[Diagnostic, ...]
    files_analyzed: int
    stderr: str
    seconds: float
    stripped_seed: Path

    def for_path(self, path: Path) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.path == path.resolve()]

    def under(self, directory: Path) -> list[Diagnostic]:
        root = directory.resolve()
        return [d for d in self.diagnostics if d.path.is_relative_to(root)]


def _relative(path: Path) -> str:
    return path.relative_to(HERE).as_posix()


def _report(diagnostics: Sequence[Diagnostic]) -> str:
    return "\n".join(d.render() for d in diagnostics)


def _config() -> dict[str, object]:
    # pyrightconfig.json is JSON with // comments (pyright reads it as JSONC).
    lines = CONFIG.read_text().splitlines()
    text = "\n".join(re.sub(r"^\s*//.*$", "", line) for line in lines)
    loaded: dict[str, object] = json.loads(text)
    return loaded


def _pyright_executable() -> Path:
    exe = Path(sys.executable).with_name("pyright")
    if not exe.exists():
        pytest.fail(
            f"pyright is not installed in this environment ({exe} is missing); it is a "
            "dev dependency: pip install -e '.[dev]'",
            pytrace=False,
        )
    return exe


def run_pyright(targets: Sequence[Path | str]) -> tuple[PyrightRun, str]:
    """pyright with this repository's config and this interpreter's packages."""
    command = [
        str(_pyright_executable()),
        "--outputjson",
        "-p",
        str(CONFIG),
        "--pythonpath",
        sys.executable,
        *(str(t) for t in targets),
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(
            f"pyright failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr}"
        )
    report = json.loads(proc.stdout)
    diagnostics = tuple(
        Diagnostic(
            path=Path(item["file"]).resolve(),
            line=int(item["range"]["start"]["line"]) + 1,
            severity=str(item["severity"]),
            rule=item.get("rule"),
            # pyright indents continuation lines with no-break spaces
            message=str(item["message"]).replace("\xa0", " "),
        )
        for item in report["generalDiagnostics"]
    )
    run = PyrightRun(
        returncode=proc.returncode,
        diagnostics=diagnostics,
        files_analyzed=int(report["summary"]["filesAnalyzed"]),
        stderr=proc.stderr,
        seconds=seconds,
        stripped_seed=Path(),
    )
    return run, proc.stdout


@pytest.fixture(scope="session")
def pyright_run(tmp_path_factory: pytest.TempPathFactory) -> PyrightRun:
    """The one pyright run of the session: the configured paths and the stripped seed."""
    stripped = tmp_path_factory.mktemp("pyright") / "stripped_s1_semaphore_value.py"
    stripped.write_text(strip_expectations(SEED_FILE.read_text()))
    include = _config()["include"]
    assert isinstance(include, list)
    run, _ = run_pyright([*(str(p) for p in include), stripped])
    print(
        f"\npyright session run: {len(PASS_FILES) + len(FAIL_FILES)} corpus files + safedma "
        f"({run.files_analyzed} files) in {run.seconds:.1f} s"
    )
    return dataclasses.replace(run, stripped_seed=stripped.resolve())


# --- The configuration is strict, and is what runs ------------------------------------


def test_config_is_strict_with_no_rule_relaxed() -> None:
    config = _config()
    assert config.get("typeCheckingMode") == "strict"
    assert config.get("enableTypeIgnoreComments") is False
    assert config.get("reportUnnecessaryTypeIgnoreComment") == "error"
    relaxed = sorted(
        k for k in config if k.startswith("report") and k != "reportUnnecessaryTypeIgnoreComment"
    )
    assert not relaxed, f"pyrightconfig.json relaxes strict mode: {relaxed}"
    include = config.get("include")
    assert isinstance(include, list)
    assert set(include) >= {"safedma", "tests/typing/pass", "tests/typing/fail"}


def test_pyright_output_is_all_understood(pyright_run: PyrightRun) -> None:
    known = {p.resolve() for p in (*PASS_FILES, *FAIL_FILES)} | {pyright_run.stripped_seed}
    stray = [
        d
        for d in pyright_run.diagnostics
        if d.path not in known and not d.path.is_relative_to(LIBRARY.resolve())
    ]
    assert not stray, "pyright reported on files outside the corpus:\n" + _report(stray)
    corpus = len(PASS_FILES) + len(FAIL_FILES) + 1
    assert pyright_run.files_analyzed > corpus, "pyright analysed fewer files than given"


def test_library_is_clean_under_pyright_strict(pyright_run: PyrightRun) -> None:
    found = pyright_run.under(LIBRARY)
    if found:
        pytest.fail("pyright strict safedma is not clean:\n" + _report(found), pytrace=False)


@pytest.mark.parametrize("path", PASS_FILES, ids=_relative)
def test_pass_file(pyright_run: PyrightRun, path: Path) -> None:
    found = pyright_run.for_path(path)
    if found:
        message = f"{_relative(path)} must pass pyright strict:\n" + _report(found)
        pytest.fail(message, pytrace=False)


@pytest.mark.parametrize("path", FAIL_FILES, ids=_relative)
def test_fail_file(pyright_run: PyrightRun, path: Path) -> None:
    """Each expected error happened with its exact rules (an unneeded rule is an error)."""
    found = pyright_run.for_path(path)
    if found:
        pytest.fail(
            f"{_relative(path)}: an expected pyright error is missing (unnecessary ignore), "
            "has another rule, or an unexpected error appeared:\n" + _report(found),
            pytrace=False,
        )


# --- The corpus follows its own rules --------------------------------------------------


@pytest.mark.parametrize("path", PASS_FILES, ids=_relative)
def test_pass_file_has_no_pyright_ignores(path: Path) -> None:
    expected = pyright_expectations(path.read_text())
    if path == JAX_SHIM:
        # The shim may only silence jax's own unknowns.
        other = {n: e.names for n, e in expected.items() if not set(e.names) <= UNKNOWN_RULES}
        assert expected and not other, f"{_relative(path)}: only reportUnknown* rules: {other}"
        return
    assert not expected, f"{_relative(path)} must not contain '# pyright: ignore'"


@pytest.mark.parametrize("path", FAIL_FILES, ids=_relative)
def test_fail_file_expectations_pair_up(path: Path) -> None:
    """Both checkers expect an error on the same lines, with corresponding codes and rules,
    except on the lines listed in ONE_SIDED."""
    source = path.read_text()
    mypy, pyright = mypy_expectations(source), pyright_expectations(source)
    bare = [line for line, e in pyright.items() if not e.names or "" in e.names]
    assert not bare, f"{_relative(path)}: '# pyright: ignore' without [rule] on lines {bare}"
    problems: list[str] = []
    for line in sorted(mypy.keys() | pyright.keys()):
        code = code_at(path, line)
        decided = ONE_SIDED.get((path.name, code))
        has_mypy, has_pyright = line in mypy, line in pyright
        if has_mypy != has_pyright:
            side = "mypy" if has_mypy else "pyright"
            if decided is None or decided.reported_by != side:
                problems.append(f"line {line} ({code!r}): only {side} expects an error")
            continue
        if decided is not None:
            problems.append(f"line {line} ({code!r}) is in ONE_SIDED but both checkers expect it")
            continue
        wanted = set[str]().union(
            *(MYPY_TO_PYRIGHT.get(c, {f"<no pyright rule for {c}>"}) for c in mypy[line].names)
        )
        main_rules = set(pyright[line].names) - UNKNOWN_RULES
        if main_rules != wanted:
            problems.append(
                f"line {line} ({code!r}): mypy {list(mypy[line].names)} expects pyright "
                f"{sorted(wanted)}, the comment says {sorted(pyright[line].names)}"
            )
    assert not problems, f"{_relative(path)}:\n" + "\n".join(problems)


def test_every_one_sided_line_exists_and_is_documented() -> None:
    doc = DOC.read_text()
    for (name, code), decision in ONE_SIDED.items():
        path = HERE / "fail" / name
        lines = [
            n
            for n, text in enumerate(path.read_text().splitlines(), 1)
            if text.split("#", 1)[0].strip() == code
        ]
        assert len(lines) == 1, f"ONE_SIDED names {code!r}, found on lines {lines} of {name}"
        assert re.search(rf"^#+ {decision.case}\b", doc, re.M), (
            f"docs/type-checkers.md has no section for {decision.case}"
        )


# --- The mechanism can fail: the seed's file with its comments stripped ----------------


def test_stripped_seed_reports_the_expected_rules(pyright_run: PyrightRun) -> None:
    seed = pyright_expectations(SEED_FILE.read_text())
    expected = {(line, rule) for line, e in seed.items() for rule in e.names}
    found = pyright_run.for_path(pyright_run.stripped_seed)
    print("\n".join(d.render() for d in found))
    assert {(d.line, d.rule) for d in found} == expected, _report(found)
    assert all(d.severity == "error" for d in found)
    seed_lines = [
        n
        for n, text in enumerate(SEED_FILE.read_text().splitlines(), 1)
        if "with_send_sem(sem_val)" in text
    ]
    assert len(seed_lines) == 2
    for line in seed_lines:
        assert [d.message for d in found if d.line == line] == [SEED_SEND_SEM_MESSAGE]


def test_pyright_wrote_nothing_to_stderr(pyright_run: PyrightRun) -> None:
    assert not pyright_run.stderr.strip(), pyright_run.stderr
