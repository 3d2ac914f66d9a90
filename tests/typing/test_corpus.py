"""The type-test corpus under five checkers: mypy, pyright, basedpyright, pyrefly, ty.

typeshed's style, one harness for all five:

* ``pass/*.py``: realistic kernels; every checker, in its strict mode, reports nothing
  (only ``pass/_typed_jax.py`` expects pyright's reportUnknown* on jax's own
  unannotated functions, in one place);
* ``fail/*.py`` and ``plugin/*.py``: each expected error is written on its line, for
  each checker in its own syntax (see ``_comments.py``);
* the library (``safedma/``) is clean under all five, and also with safedma's own pltpu
  stubs given to each checker (docs/stubs.md's set-up).

Each checker runs once per session, over the library in place and over a copy of the
corpus with every expected-error comment removed (line numbers unchanged). For each
file and checker the set of (line, code) reported must equal the set written: an
expected error that does not happen, one with another code, and any error not
written all fail. The comments are each checker's own suppression syntax, so a plain
run of any checker over the repository (with its configuration in pyproject.toml /
pyrightconfig.json) is clean too.

Where the checkers disagree on a line, the line is listed in ``DISAGREEMENTS`` with the
checkers that report it, and docs/type-checkers.md records the decision.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import _checkers
import pytest
from _checkers import CHECKERS, REPO, Diagnostic, Run, Setup
from _comments import code_at, comment_expectations, expected_codes, plugin_expectations

HERE = Path(__file__).resolve().parent
LIBRARY = REPO / "safedma"
# The library's own modules: not the shipped jax stubs under safedma/stubs/, which
# describe one jax version each and are checked by test_stubs.py.
# A module with a .pyi beside its .py is given as the .pyi (what the checkers read for
# it; mypy refuses both at once).
LIBRARY_TARGETS = sorted(
    p.with_suffix(".pyi") if p.suffix == ".py" and p.with_suffix(".pyi").exists() else p
    for p in LIBRARY.iterdir()
    if (p.is_dir() and p.name not in ("stubs", "__pycache__")) or p.suffix == ".py"
)
DOC = REPO / "docs" / "type-checkers.md"
PASS_FILES = sorted((HERE / "pass").glob("*.py"))
FAIL_FILES = sorted((HERE / "fail").glob("*.py"))
PLUGIN_FILES = sorted((HERE / "plugin").glob("*.py"))
CORPUS = PASS_FILES + FAIL_FILES + PLUGIN_FILES
SEED_FILE = HERE / "fail" / "s1_semaphore_value.py"
# The pass files' one home for jax's partly unannotated functions (see its docstring).
JAX_SHIM = HERE / "pass" / "_typed_jax.py"
STRIPPED = _checkers.WORK / "corpus"

S_ROWS = [f"S{i}" for i in range(1, 10)]
UNKNOWN_RULES = frozenset(
    {
        "reportUnknownMemberType",
        "reportUnknownVariableType",
        "reportUnknownArgumentType",
        "reportUnknownLambdaType",
        "reportUnknownParameterType",
    }
)

# What each mypy code of the corpus is called by the other checkers. pyright strict also
# reports reportUnknown* next to many errors (the failed expression's type is Unknown,
# and strict reports each use of Unknown): those may accompany any pyright line.
EQUIVALENT_CODES: dict[str, dict[str, frozenset[str]]] = {
    "pyright": {
        "arg-type": frozenset({"reportArgumentType"}),
        "dict-item": frozenset({"reportArgumentType"}),
        "attr-defined": frozenset({"reportAttributeAccessIssue"}),
        # mypy's "Invalid self argument" (a RemoteCopy not yet [Given, Given]) is pyright's
        # 'Cannot access attribute ... Could not bind method'.
        "misc": frozenset({"reportAttributeAccessIssue"}),
        "call-arg": frozenset({"reportCallIssue"}),
        "index": frozenset({"reportIndexIssue"}),
        "return-value": frozenset({"reportReturnType"}),
        "assignment": frozenset({"reportAssignmentType"}),
        # `.wait().wait()`: pyright reports only the attribute access on None.
        "func-returns-value": frozenset({"reportOptionalMemberAccess"}),
        # An index no overload of an N-D semaphore array's .at accepts (the wrong rank).
        "call-overload": frozenset({"reportCallIssue", "reportArgumentType"}),
    },
    "pyrefly": {
        "arg-type": frozenset({"bad-argument-type"}),
        "dict-item": frozenset({"bad-assignment"}),
        "attr-defined": frozenset({"missing-attribute"}),
        "misc": frozenset({"bad-argument-type"}),  # the self argument of start() and friends
        "call-arg": frozenset({"missing-argument", "unexpected-keyword", "bad-argument-count"}),
        "index": frozenset({"bad-index", "unsupported-operation"}),
        "return-value": frozenset({"bad-return"}),
        "assignment": frozenset({"bad-assignment"}),
        "func-returns-value": frozenset({"missing-attribute"}),
        "call-overload": frozenset({"bad-index"}),
    },
    "ty": {
        "arg-type": frozenset({"invalid-argument-type"}),
        "dict-item": frozenset({"invalid-argument-type"}),
        "attr-defined": frozenset({"missing-attribute"}),
        "misc": frozenset({"invalid-argument-type"}),
        "call-arg": frozenset(
            {"missing-argument", "unknown-argument", "too-many-positional-arguments"}
        ),
        "index": frozenset({"not-subscriptable", "invalid-assignment"}),
        "return-value": frozenset({"invalid-return-type", "invalid-explicit-return"}),
        "assignment": frozenset({"invalid-assignment"}),
        "func-returns-value": frozenset({"missing-attribute"}),
        "call-overload": frozenset({"invalid-argument-type"}),
    },
}
EQUIVALENT_CODES["basedpyright"] = EQUIVALENT_CODES["pyright"]


@dataclasses.dataclass(frozen=True)
class Disagreement:
    case: str  # the id of the decision in docs/type-checkers.md
    reported_by: frozenset[str]


def _by(*checkers: str) -> frozenset[str]:
    return frozenset(checkers)


PYRIGHTS = ("pyright", "basedpyright")
# Lines of the fail and plugin files that not every checker reports, by file and code
# (docs/type-checkers.md, "Where the checkers disagree").
DISAGREEMENTS: dict[tuple[str, str], Disagreement] = {
    ("extra_checker_differences.py", "copy = copy.with_send_sem(send)"): Disagreement(
        "D1", _by("mypy")
    ),
    ("extra_checker_differences.py", 'copy = copy.to(safedma.neighbour("x"))'): Disagreement(
        "D1", _by("mypy")
    ),
    ("extra_checker_differences.py", "copy.start().wait()"): Disagreement("D1", _by("mypy")),
    (
        "extra_checker_differences.py",
        "safedma.LocalCopy(x, o, sem).start(priority=slot).wait()",
    ): Disagreement("D2", _by("mypy")),
    ("extra_checker_differences.py", "handle.wait()"): Disagreement("D3", _by(*PYRIGHTS)),
    ("s1_semaphore_value.py", "sem_val = pl.semaphore_read(send_sem)"): Disagreement(
        "D4", _by(*PYRIGHTS)
    ),
    ("values_for_refs.py", "sem_val = pl.semaphore_read(send)"): Disagreement("D4", _by(*PYRIGHTS)),
    (
        "kernel_options.py",
        "safedma.core_kernel(kernel, out, mesh=mesh, scratch_shapes=[])",
    ): Disagreement("D5", _by("mypy", *PYRIGHTS, "pyrefly")),
}

# What each checker says about the seed (a semaphore's value passed as a remote copy's
# send semaphore), on both of its lines: the message a user reads.
SEED_MESSAGES = {
    "mypy": 'Argument 1 to "with_send_sem" of "RemoteCopy" has incompatible type "Array"; expected "SemRef"',
    "pyright": 'Argument of type "Array" cannot be assigned to parameter "send_sem" of type "SemRef" '
    'in function "with_send_sem"\n  "Array" is not assignable to "SemRef"',
    "pyrefly": "Argument `Array` is not assignable to parameter `send_sem` with type `SemRef` in function "
    "`safedma._copies.RemoteCopy.with_send_sem`",
    "ty": "Argument to bound method `RemoteCopy.with_send_sem` is incorrect: Expected `SemRef`, found `Array`",
}
SEED_MESSAGES["basedpyright"] = SEED_MESSAGES["pyright"]


def _relative(path: Path) -> str:
    return path.relative_to(HERE).as_posix()


def _report(diagnostics: list[Diagnostic]) -> str:
    return "\n".join(d.render() for d in diagnostics)


@dataclasses.dataclass
class CorpusRuns:
    """One run per checker per session, started on first use."""

    copies: dict[Path, Path]  # stripped copy -> original
    runs: dict[str, Run] = dataclasses.field(default_factory=dict)

    def get(self, checker: str) -> Run:
        if checker not in self.runs:
            try:
                # The pass files import _typed_jax from their own directory.
                setup = Setup(roots=(REPO, STRIPPED / "pass"), cache="typing-corpus")
                run = _checkers.run(checker, [*LIBRARY_TARGETS, *self.copies], setup)
            except _checkers.CheckerMissing as missing:
                pytest.fail(str(missing), pytrace=False)
            print(f"\n{checker}: safedma + {len(self.copies)} corpus files in {run.seconds:.1f} s")
            self.runs[checker] = run
        return self.runs[checker]

    def found(self, checker: str, original: Path) -> list[Diagnostic]:
        copy = next(c for c, o in self.copies.items() if o == original)
        return self.get(checker).for_path(copy)


@pytest.fixture(scope="session")
def corpus() -> CorpusRuns:
    return CorpusRuns(_checkers.strip_copy(CORPUS, HERE, STRIPPED))


# --- Each checker over the library and each corpus file ------------------------------------


@pytest.mark.parametrize("checker", CHECKERS)
def test_library_is_clean(corpus: CorpusRuns, checker: str) -> None:
    """mypy --strict, pyright and basedpyright strict, pyrefly's strict preset, ty."""
    found = corpus.get(checker).under(LIBRARY)
    if found:
        pytest.fail(f"{checker} is not clean on safedma/:\n" + _report(found), pytrace=False)


@pytest.mark.parametrize("checker", CHECKERS)
def test_library_is_clean_under_its_stubs(checker: str) -> None:
    """The same, with safedma's pltpu stubs handed to the checker as docs/stubs.md says:
    the library's seams call jax's copy and semaphore functions in a way that checks
    under jax's own signatures and under the stricter ones the stubs give them."""
    try:
        run = _checkers.run(
            checker, LIBRARY_TARGETS, Setup(stubs=True, cache="typing-library-stubs")
        )
    except _checkers.CheckerMissing as missing:
        pytest.fail(str(missing), pytrace=False)
    found = run.under(LIBRARY)
    if found:
        pytest.fail(
            f"{checker} is not clean on safedma/ with its stubs:\n" + _report(found),
            pytrace=False,
        )
    stray = [d for d in run.errors if not d.path.is_relative_to(LIBRARY)]
    assert not stray, f"{checker} reported outside the library:\n" + _report(stray)


@pytest.mark.parametrize("checker", CHECKERS)
def test_output_is_all_understood(corpus: CorpusRuns, checker: str) -> None:
    """Nothing the checker said is lost: every finding is in the library or the corpus."""
    run = corpus.get(checker)
    known = set(corpus.copies)
    stray = [
        d for d in run.diagnostics if d.path not in known and not d.path.is_relative_to(LIBRARY)
    ]
    assert not stray, f"{checker} reported outside the corpus:\n" + _report(stray)
    if checker in ("mypy", "pyright", "basedpyright"):
        assert not run.stderr.strip(), run.stderr


@pytest.mark.parametrize("path", CORPUS, ids=_relative)
@pytest.mark.parametrize("checker", CHECKERS)
def test_file(corpus: CorpusRuns, checker: str, path: Path) -> None:
    """Exactly the expected (line, code) pairs, and nothing else."""
    expected = expected_codes(path)[checker]
    found = corpus.found(checker, path)
    mismatches = _checkers.compare(expected, found)
    if mismatches:
        pytest.fail(
            f"{checker} on {_relative(path)}:\n"
            + "\n".join(m.render() for m in mismatches)
            + "\nreported:\n"
            + _report(found),
            pytrace=False,
        )


@pytest.mark.parametrize("checker", CHECKERS)
def test_seed_message(corpus: CorpusRuns, checker: str) -> None:
    """The seed's mistake, in each checker's own words (the mechanism can fail: it shows them)."""
    lines = [
        n
        for n, text in enumerate(SEED_FILE.read_text().splitlines(), 1)
        if "with_send_sem(sem_val)" in text
    ]
    assert len(lines) == 2
    found = corpus.found(checker, SEED_FILE)
    for line in lines:
        assert [d.message for d in found if d.line == line] == [SEED_MESSAGES[checker]]


# --- The corpus follows its own rules (no checker needed) -------------------------------


def test_corpus_is_present() -> None:
    assert PASS_FILES and FAIL_FILES and PLUGIN_FILES
    # The corpus directories are not packages: mypy names each file by its stem, so
    # two files with one name would be a "Duplicate module" error for the whole run.
    stems = [path.stem for path in CORPUS]
    assert len(stems) == len(set(stems)), f"duplicate corpus file names: {sorted(stems)}"


@pytest.mark.parametrize("path", PASS_FILES, ids=_relative)
def test_pass_file_expects_nothing(path: Path) -> None:
    expected = {c: lines for c, lines in expected_codes(path).items() if lines}
    if path == JAX_SHIM:
        # The shim may only silence jax's own unknowns, for pyright and basedpyright.
        assert set(expected) == set(PYRIGHTS), f"{_relative(path)}: {sorted(expected)}"
        other = {
            n: codes
            for c in PYRIGHTS
            for n, codes in expected[c].items()
            if not codes <= UNKNOWN_RULES
        }
        assert not other, f"{_relative(path)}: only reportUnknown* rules: {other}"
        return
    assert not expected, f"{_relative(path)} must expect no error: {expected}"


# The typed fori_loop wrapper lives in three files, each of which must stand alone: the
# manual's example (users copy it), the library's kernels (which cannot import an
# example) and the pass corpus (which checks what a user writes, with no private import).
FORI_LOOP_HOMES = (
    REPO / "examples" / "typed_jax.py",
    LIBRARY / "kernels" / "_typed_jax.py",
    JAX_SHIM,
)


def _function_source(path: Path, name: str) -> str:
    """``name``'s source in ``path``, comments kept, its docstring left out."""
    text = path.read_text()
    tree = ast.parse(text)
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    lines = text.splitlines()[function.lineno - 1 : function.end_lineno]
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        end = first.end_lineno or first.lineno
        del lines[first.lineno - function.lineno : end - function.lineno + 1]
    return "\n".join(lines)


def test_the_fori_loop_wrapper_is_the_same_in_its_three_homes() -> None:
    """Signature, body and pyright comment alike (docstrings may differ): a fix to one
    reaches the others, and the manual shows what the library runs."""
    sources = {
        path.relative_to(REPO).as_posix(): _function_source(path, "fori_loop")
        for path in FORI_LOOP_HOMES
    }
    first = next(iter(sources.values()))
    differing = [name for name, source in sources.items() if source != first]
    assert not differing, f"fori_loop differs from {next(iter(sources))} in {differing}"


def _expectation_lines(path: Path) -> Iterator[int]:
    per_checker = expected_codes(path)
    yield from sorted(set().union(*(lines.keys() for lines in per_checker.values())))


@pytest.mark.parametrize("path", FAIL_FILES + PLUGIN_FILES, ids=_relative)
def test_expectations_name_codes_and_rows(path: Path) -> None:
    """No bare ignore; each expected error has its catalogue row ("# S3: ...") just above."""
    written = comment_expectations(path.read_text())
    bare = [
        (c, n)
        for c, lines in written.items()
        for n, e in lines.items()
        if not e.names or "" in e.names
    ]
    assert not bare, f"{_relative(path)}: ignore comments without [code] (checker, line): {bare}"
    lines = path.read_text().splitlines()
    unexplained = [
        n
        for n in _expectation_lines(path)
        if not any(re.search(r"\b([ST]\d\b|Extra\b)", text) for text in lines[max(0, n - 8) : n])
        and path.parent.name == "fail"
    ]
    assert not unexplained, f"{_relative(path)}: no '# Sn:' row comment near lines {unexplained}"


@pytest.mark.parametrize("path", FAIL_FILES + PLUGIN_FILES, ids=_relative)
def test_checkers_agree_except_where_decided(path: Path) -> None:
    """Every expected line is expected by all five checkers, with corresponding codes,
    except the lines listed in DISAGREEMENTS (exactly the checkers listed report them)."""
    per_checker = expected_codes(path)
    problems: list[str] = []
    for line in _expectation_lines(path):
        code = code_at(path, line)
        reporters = frozenset(c for c in CHECKERS if line in per_checker[c])
        decided = DISAGREEMENTS.get((path.name, code))
        if decided is not None:
            if reporters != decided.reported_by:
                problems.append(
                    f"line {line} ({code!r}): {decided.case} says {sorted(decided.reported_by)}, "
                    f"the comments say {sorted(reporters)}"
                )
            continue
        if reporters != frozenset(CHECKERS):
            problems.append(f"line {line} ({code!r}): only {sorted(reporters)} expect an error")
            continue
        mypy_codes = per_checker["mypy"][line]
        for checker, table in EQUIVALENT_CODES.items():
            wanted = frozenset().union(*(table.get(c, {f"<nothing for {c}>"}) for c in mypy_codes))
            codes = per_checker[checker][line] - UNKNOWN_RULES
            if not codes or not codes <= wanted:
                problems.append(
                    f"line {line} ({code!r}): mypy {sorted(mypy_codes)} corresponds to {checker} "
                    f"{sorted(wanted)}, the comment says {sorted(per_checker[checker][line])}"
                )
    assert not problems, f"{_relative(path)}:\n" + "\n".join(problems)


def test_every_disagreement_exists_and_is_documented() -> None:
    doc = DOC.read_text()
    for (name, code), decision in DISAGREEMENTS.items():
        (path,) = [p for p in FAIL_FILES + PLUGIN_FILES if p.name == name]
        lines = [
            n
            for n, text in enumerate(path.read_text().splitlines(), 1)
            if text.split("#", 1)[0].strip() == code
        ]
        assert len(lines) == 1, f"DISAGREEMENTS names {code!r}, found on lines {lines} of {name}"
        assert re.search(rf"^#+ {decision.case}\b", doc, re.M), (
            f"{DOC.name} has no section for {decision.case}"
        )


def test_every_s_row_has_a_fail_file() -> None:
    covered = {path.name.split("_", 1)[0].upper() for path in FAIL_FILES}
    missing = [row for row in S_ROWS if row not in covered]
    assert not missing, f"no fail/<row>_*.py for {missing}"


def test_plugin_files_expect_mypys_own_codes() -> None:
    """In the plugin corpus, every line the plugin adds a sentence to also has mypy's own code."""
    for path in PLUGIN_FILES:
        by_line: dict[int, set[str]] = {}
        for e in plugin_expectations(path):
            by_line.setdefault(e.line, set()).add(e.code)
        bare = [n for n, codes in by_line.items() if all(c.startswith("safedma-") for c in codes)]
        assert not bare, f"{_relative(path)}: lines with only a plugin code: {bare}"


# --- The configurations are strict, and are what runs ------------------------------------


def test_pyright_config_is_strict_with_no_rule_relaxed() -> None:
    config = _checkers.pyright_settings()
    assert config.get("typeCheckingMode") == "strict"
    assert config.get("enableTypeIgnoreComments") is False
    assert config.get("reportUnnecessaryTypeIgnoreComment") == "error"
    relaxed = sorted(
        k for k in config if k.startswith("report") and k != "reportUnnecessaryTypeIgnoreComment"
    )
    assert not relaxed, f"pyrightconfig.json relaxes strict mode: {relaxed}"
    include = config.get("include")
    assert isinstance(include, list)
    assert set(include) >= {
        "safedma",
        "tests/typing/pass",
        "tests/typing/fail",
        "tests/typing/plugin",
    }


def test_pyrefly_and_ty_read_only_their_own_comments() -> None:
    """So that mypy's ``# type: ignore[code]`` cannot hide a pyrefly or ty error."""
    import tomllib

    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    assert tool["pyrefly"]["preset"] == "strict"
    assert tool["pyrefly"]["enabled-ignores"] == ["pyrefly"]
    assert tool["ty"]["analysis"]["respect-type-ignore-comments"] is False
    assert tool["mypy"]["strict"] is True
