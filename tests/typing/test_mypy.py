"""Static type tests, typeshed style: the misuses of MISUSE.md's S-rows must fail mypy.

* ``pass/*.py``: realistic kernels; mypy --strict must report nothing, and they
  hold no ``# type: ignore`` at all.
* ``fail/*.py``: one or more files per S-row; every expected error is written as
  ``# type: ignore[code]`` on its line. Under ``--warn-unused-ignores`` an ignore
  that suppresses nothing is itself an error, so "mypy reports nothing for this
  file" means: every expected error happened, with that exact code, and nothing
  else did.
* The library itself (``safedma/``) must be clean under ``--strict``.

mypy runs once per session over all of it (about 10-15 s cold, ~1-2 s warm with
the cache under .mypy_cache/); a second, single-file run strips the ignores
from the seed's fail file to show the real messages and prove the mechanism
can fail.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import _mypy_run
import pytest
from _comments import mypy_expectations, strip_expectations
from _mypy_run import Diagnostic, MypyRun

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIBRARY = REPO / "safedma"
PASS_FILES = sorted((HERE / "pass").glob("*.py"))
FAIL_FILES = sorted((HERE / "fail").glob("*.py"))
CORPUS = PASS_FILES + FAIL_FILES

S_ROWS = [f"S{i}" for i in range(1, 10)]

# One cache per interpreter (each venv has its own jax), kept apart from the
# cache of a plain `mypy` run so that the two do not invalidate each other.
_ENV_TAG = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
CACHE_DIR = REPO / ".mypy_cache" / f"typing-tests-{_ENV_TAG}"
STRIPPED_DIR = REPO / ".mypy_cache" / f"typing-tests-{_ENV_TAG}-stripped"

MYPY_FLAGS = [
    "--strict",
    "--warn-unused-ignores",
    "--no-error-summary",
    "--show-error-codes",
    "--no-pretty",
    "--no-color-output",
    "--cache-dir",
    str(CACHE_DIR),
]


def run_mypy(targets: Sequence[str | Path]) -> MypyRun:
    return _mypy_run.run_mypy(targets, MYPY_FLAGS)


def _relative(path: Path) -> str:
    return path.relative_to(HERE).as_posix()


def _report(diagnostics: Sequence[Diagnostic]) -> str:
    return "\n".join(d.raw for d in diagnostics)


@pytest.fixture(scope="session")
def corpus_run() -> MypyRun:
    """The one mypy run of the session: the library package and every corpus file.

    Paths are given relative to the repo root: mypy's cache replays a cached
    module's errors under the path it was cached with.
    """
    # "safedma" as a directory target is `mypy safedma` (mypy refuses -p mixed with files).
    run = run_mypy(["safedma", *(path.relative_to(REPO) for path in CORPUS)])
    print(f"\nmypy session run: {len(CORPUS)} corpus files + safedma in {run.seconds:.1f} s")
    return run


def test_corpus_is_present() -> None:
    assert PASS_FILES, "no pass/*.py files"
    assert FAIL_FILES, "no fail/*.py files"
    # The corpus directories are not packages: mypy names each file by its stem, so
    # two files with one name would be a "Duplicate module" error for the whole run.
    stems = [path.stem for path in CORPUS]
    assert len(stems) == len(set(stems)), f"duplicate corpus file names: {sorted(stems)}"


def test_mypy_output_is_all_understood(corpus_run: MypyRun) -> None:
    """Nothing mypy said is lost: every line parses and belongs to a checked file."""
    assert not corpus_run.unparsed, "unparsed mypy output:\n" + "\n".join(corpus_run.unparsed)
    known = {path.resolve() for path in CORPUS}
    stray = [
        d
        for d in corpus_run.diagnostics
        if d.path not in known and not d.path.is_relative_to(LIBRARY.resolve())
    ]
    assert not stray, "mypy reported on files outside the corpus:\n" + _report(stray)


def test_library_is_clean_under_strict(corpus_run: MypyRun) -> None:
    """`mypy --strict safedma`, from the same session run."""
    found = corpus_run.under(LIBRARY)
    if found:
        pytest.fail("mypy --strict safedma is not clean:\n" + _report(found), pytrace=False)


@pytest.mark.parametrize("path", PASS_FILES, ids=_relative)
def test_pass_file(corpus_run: MypyRun, path: Path) -> None:
    found = corpus_run.for_path(path)
    if found:
        message = f"{_relative(path)} must pass mypy --strict:\n" + _report(found)
        pytest.fail(message, pytrace=False)


@pytest.mark.parametrize("path", FAIL_FILES, ids=_relative)
def test_fail_file(corpus_run: MypyRun, path: Path) -> None:
    """Each expected error happened with its exact code (an unused ignore is an error)."""
    found = corpus_run.for_path(path)
    if found:
        pytest.fail(
            f"{_relative(path)}: an expected error is missing (unused ignore), has another "
            "code, or an unexpected error appeared:\n" + _report(found),
            pytrace=False,
        )


# --- The corpus follows its own rules ------------------------------------------------


def _ignores(path: Path) -> dict[int, list[str]]:
    """``{line: [codes]}`` of the ``# type: ignore`` comments (see _comments.py)."""
    return {
        line: list(e.names) for line, e in mypy_expectations(path.read_text()).items()
    }


@pytest.mark.parametrize("path", PASS_FILES, ids=_relative)
def test_pass_file_has_no_ignores(path: Path) -> None:
    assert not _ignores(path), f"{_relative(path)} must not contain '# type: ignore'"


@pytest.mark.parametrize("path", FAIL_FILES, ids=_relative)
def test_fail_file_ignores_name_codes_and_rows(path: Path) -> None:
    ignores = _ignores(path)
    assert ignores, f"{_relative(path)} expects no error at all"
    bare = [line for line, codes in ignores.items() if not codes or "" in codes]
    assert not bare, f"{_relative(path)}: '# type: ignore' without [code] on lines {bare}"
    lines = path.read_text().splitlines()
    # Each expected error has a comment naming its MISUSE.md row just above it
    # ("# S3: ...", or "# Extra ..." for checks beyond the catalogue).
    unexplained = []
    for line in ignores:
        window = lines[max(0, line - 6) : line]
        if not any(re.search(r"#\s*([ST]\d\b|Extra\b)", text) for text in window):
            unexplained.append(line)
    assert not unexplained, f"{_relative(path)}: no '# Sn:' row comment near lines {unexplained}"


def test_every_s_row_has_a_fail_file() -> None:
    covered = {path.name.split("_", 1)[0].upper() for path in FAIL_FILES}
    missing = [row for row in S_ROWS if row not in covered]
    assert not missing, f"no fail/<row>_*.py for {missing}"


# --- The mechanism can fail: the seed's file with its ignores stripped ----------------

SEED_FILE = HERE / "fail" / "s1_semaphore_value.py"

# What mypy says about the seed (MISUSE.md S1, seed-dma-source-semaphore-must-be-a-ref):
# a value read from a semaphore, passed as a remote copy's send (source) semaphore.
SEED_MESSAGES = {
    'Argument 1 to "with_send_sem" of "RemoteCopy" has incompatible type "Array"; '
    'expected "SemRef"',
    'Argument 3 to "RemoteCopy" has incompatible type "Array"; expected "SemRef"',
    'Argument 3 to "LocalCopy" has incompatible type "Array"; expected "SemRef"',
    'Value of type "SemRef" is not indexable',
}


def test_stripped_fail_file_reports_the_expected_errors() -> None:
    expected = {(line, code) for line, codes in _ignores(SEED_FILE).items() for code in codes}
    # A fixed path inside the repo, given relative to it, not tmp_path: mypy's cache
    # replays a module's errors with the path the module had when it was cached.
    STRIPPED_DIR.mkdir(parents=True, exist_ok=True)
    stripped = STRIPPED_DIR / "stripped_s1_semaphore_value.py"
    stripped.write_text(strip_expectations(SEED_FILE.read_text()))

    run = run_mypy([stripped.relative_to(REPO)])
    errors = [d for d in run.for_path(stripped) if d.severity == "error"]
    print("\n".join(f"line {d.line}: {d.message}  [{d.code}]" for d in errors))

    assert run.returncode == 1
    assert {(d.line, d.code) for d in errors} == expected, _report(run.diagnostics)
    assert {d.message for d in errors} == SEED_MESSAGES
    # The seed itself, both spellings (pl.semaphore_read and safedma.read):
    seed_lines = [
        number
        for number, text in enumerate(SEED_FILE.read_text().splitlines(), start=1)
        if "with_send_sem(sem_val)" in text
    ]
    assert len(seed_lines) == 2
    for line in seed_lines:
        assert [d.message for d in errors if d.line == line] == [
            'Argument 1 to "with_send_sem" of "RemoteCopy" has incompatible type "Array"; '
            'expected "SemRef"'
        ]


def test_mypy_wrote_nothing_to_stderr(corpus_run: MypyRun) -> None:
    assert not corpus_run.stderr.strip(), corpus_run.stderr
