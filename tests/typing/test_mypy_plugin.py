"""safedma.mypy_plugin: the exact sentences it adds, and that it changes nothing else.

One mypy run per session (through the shared runner, ``_checkers.py``) with the
project's mypy configuration plus the one
documented line (``plugins = ["safedma.mypy_plugin"]``), over

* ``plugin/*.py``: each expected diagnostic is written on the line(s) above its
  code as ``# expect[code]`` or ``# expect[code]: exact message``; the run must
  report exactly those (line and code), with those messages;
* the whole type-test corpus (``pass/``, ``fail/``) and the library, which must
  stay clean: the corpus's ``# type: ignore[misc]`` / ``[attr-defined]`` /
  ``[arg-type]`` still cover every error (and none becomes unused), and correct
  code gets no new error.

test_corpus.py runs the same corpus without the plugin (and under the four other checkers). The missing-operation
sentences are also checked against the run-time ``WrongOperationError`` for
unchecked code: both say the same thing.
"""

from __future__ import annotations

import collections
import tomllib
from collections.abc import Sequence
from pathlib import Path

import _checkers
import pytest
from _checkers import Diagnostic, Run, Setup
from _comments import Expected, plugin_expectations

import safedma._copies
from safedma import mypy_plugin
from safedma._errors import WrongOperationError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIBRARY = REPO / "safedma"
PLUGIN_FILES = sorted((HERE / "plugin").glob("*.py"))
CORPUS = sorted((HERE / "pass").glob("*.py")) + sorted((HERE / "fail").glob("*.py"))
DOC = REPO / "docs" / "readable-errors.md"
CONFIG_LINE = 'plugins = ["safedma.mypy_plugin"]'


def _mypy_config(directory: Path) -> Path:
    """The project's [tool.mypy] settings plus the plugin line, as a mypy.ini."""
    settings = dict(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"])
    settings.pop("files", None)  # the targets are given on the command line
    settings["plugins"] = ["safedma.mypy_plugin"]
    lines = ["[mypy]"]
    for key, value in settings.items():
        if isinstance(value, bool):
            value = "True" if value else "False"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        lines.append(f"{key} = {value}")
    path = directory / "mypy.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    config = _mypy_config(tmp_path_factory.mktemp("mypy-plugin"))
    # Its own cache: a run with a plugin cannot reuse one made without it.
    setup = Setup(mypy_config=config, cache="typing-plugin")
    run = _checkers.run("mypy", [LIBRARY, *PLUGIN_FILES, *CORPUS], setup)
    files = len(PLUGIN_FILES) + len(CORPUS)
    print(f"\nmypy run with the plugin: {files} files + safedma in {run.seconds:.1f} s")
    return run


def _relative(path: Path) -> str:
    return path.relative_to(HERE).as_posix()


def _report(diagnostics: Sequence[Diagnostic]) -> str:
    return "\n".join(d.render() for d in diagnostics)


def test_plugin_corpus_is_present() -> None:
    assert PLUGIN_FILES
    stems = [p.stem for p in (*PLUGIN_FILES, *CORPUS)]
    assert len(stems) == len(set(stems)), "plugin corpus file names must differ from the corpus"


def test_run_is_understood(plugin_run: Run) -> None:
    assert not plugin_run.stderr.strip(), plugin_run.stderr
    known = {p.resolve() for p in (*PLUGIN_FILES, *CORPUS)}
    stray = [
        d
        for d in plugin_run.diagnostics
        if d.path not in known and not d.path.is_relative_to(LIBRARY.resolve())
    ]
    assert not stray, _report(stray)


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=_relative)
def test_plugin_messages(plugin_run: Run, path: Path) -> None:
    """Exactly the expected diagnostics, line by line, with the exact sentences."""
    expected: list[Expected] = plugin_expectations(path)
    assert expected, f"{_relative(path)} expects nothing"
    found = plugin_run.for_path(path)
    assert not [d for d in plugin_run.for_path(path, errors_only=False) if d.severity != "error"], (
        _report(found)
    )
    want = collections.Counter((e.line, e.code) for e in expected)
    got = collections.Counter((d.line, d.code) for d in found)
    problems = [f"line {line}: expected [{code}], not reported" for (line, code) in want - got]
    problems += [
        f"line {d.line}: unexpected: {d.message} [{d.code}]"
        for d in found
        if (d.line, d.code) in got - want
    ]
    for e in expected:
        if e.message is None:
            continue
        messages = [d.message for d in found if (d.line, d.code) == (e.line, e.code)]
        if messages and e.message not in messages:
            problems.append(
                f"line {e.line} [{e.code}]:\n  expected: {e.message}\n  got:      {messages}"
            )
    assert not problems, f"{_relative(path)}:\n" + "\n".join(problems)


def test_plugin_codes_are_covered_by_mypys() -> None:
    """So that `# type: ignore[misc|attr-defined|arg-type]` keeps covering them."""
    added = ((mypy_plugin.INCOMPLETE_COPY, "misc"), (mypy_plugin.VALUE_FOR_REF, "arg-type"))
    for code, parent in added:
        assert code.sub_code_of is not None and code.sub_code_of.code == parent
    assert mypy_plugin.NO_SUCH_OPERATION.code == "attr-defined"


def test_corpus_and_library_unchanged_under_the_plugin(plugin_run: Run) -> None:
    """Pass files stay clean; fail files' ignores still cover every error (none unused)."""
    found = [d for path in CORPUS for d in plugin_run.for_path(path)]
    found += plugin_run.under(LIBRARY)
    assert not found, "with the plugin enabled:\n" + _report(found)


# --- Static and run-time sentences agree -------------------------------------------------

_CLASSES = {
    "safedma._copies.LocalHandle": safedma._copies.LocalHandle,
    "safedma._copies.LocalCopy": safedma._copies.LocalCopy,
    "safedma._copies.RemoteCopy": safedma._copies.RemoteCopy,
    "safedma._copies.IncomingHandle": safedma._copies.IncomingHandle,
}


@pytest.mark.parametrize(
    ("class_fullname", "name"),
    [(cls, name) for cls, names in mypy_plugin.MISSING_OPERATIONS.items() for name in names],
)
def test_missing_operation_reads_like_the_runtime_error(class_fullname: str, name: str) -> None:
    # A bare instance: only the class's __getattr__ matters here.
    obj = object.__new__(_CLASSES[class_fullname])
    with pytest.raises(WrongOperationError) as raised:
        getattr(obj, name)
    static = mypy_plugin.missing_operation_message(class_fullname, name)
    assert str(raised.value) == static


def test_readme_text_shows_the_one_config_line() -> None:
    assert CONFIG_LINE in DOC.read_text()
