"""The raw-pltpu stubs: the S-rows under five checkers, and honesty against jax.

* ``tests/stubs/pass/*.py``: raw pltpu kernels annotated with safedma's brands;
  every checker must report nothing. One file asserts that jax's own inline
  types survive (``jnp``, ``jax.Array``, ``pl.BlockSpec`` ...).
* ``tests/stubs/fail/*.py``: every expected error is written on its line, for each
  checker in its own syntax (``_comments.py``); the harness (``_checkers.py``)
  compares what each checker reports on a copy without the comments.
* ``tests/stubs/messages/``: no comments; the exact messages are checked here.
* stubtest compares the stubs with the installed jax, with the allowlists in
  ``stubtest/`` (each entry has its reason; unused entries fail), and a name check
  covers what stubtest skips (re-exports, ``__getattr__`` names).

Each checker gets the stubs the way docs/stubs.md tells a user: mypy the partial
``jax-stubs`` tree on PYTHONPATH, pyright and basedpyright the ``stubPath`` tree,
pyrefly the ``jax-stubs`` tree as site packages (on its search path it would take the
partial tree for all of jax), ty the ``stubPath`` tree as an extra search path.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import _checkers
import jax
import pytest
from _checkers import CHECKERS, Diagnostic, Run, Setup
from _comments import expected_codes

REPO = _checkers.REPO
CORPUS = REPO / "tests" / "stubs"
STUBS = _checkers.stubs_root()
PYRIGHT_TREE = STUBS / "pyright"
MYPY_TREE = STUBS / "mypy"
STUBTEST_DIR = STUBS / "stubtest"
STUB_FILES = {
    "jax.experimental.pallas": PYRIGHT_TREE / "jax" / "experimental" / "pallas" / "__init__.pyi",
    "jax.experimental.pallas.tpu": PYRIGHT_TREE / "jax" / "experimental" / "pallas" / "tpu.pyi",
    "jax.experimental.pallas.tpu_sc": PYRIGHT_TREE
    / "jax"
    / "experimental"
    / "pallas"
    / "tpu_sc.pyi",
}

PASS_FILES = sorted((CORPUS / "pass").glob("*.py"))
FAIL_FILES = sorted((CORPUS / "fail").glob("*.py"))
MESSAGE_FILES = sorted((CORPUS / "messages").glob("*.py"))
ALL_FILES = PASS_FILES + FAIL_FILES + MESSAGE_FILES
STRIPPED = _checkers.WORK / "stubs-corpus"

JAX_MINOR = ".".join(jax.__version__.split(".")[:2])  # "0.10", "0.12"


def _rel(path: Path) -> str:
    return path.relative_to(CORPUS).as_posix()


def _report(found: list[Diagnostic]) -> str:
    return "\n".join(d.render() for d in found)


def _env_with_stubs() -> dict[str, str]:
    """The mypy user set-up: the partial ``jax-stubs`` tree (and safedma) on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(MYPY_TREE), str(REPO)])}


@dataclasses.dataclass
class StubRuns:
    """One run per checker per session, over the stripped corpus, started on first use."""

    copies: dict[Path, Path]  # stripped copy -> original
    runs: dict[str, Run] = dataclasses.field(default_factory=dict)

    def get(self, checker: str) -> Run:
        if checker not in self.runs:
            try:
                run = _checkers.run(
                    checker, list(self.copies), Setup(stubs=True, cache="typing-stubs")
                )
            except _checkers.CheckerMissing as missing:
                pytest.fail(str(missing), pytrace=False)
            print(f"\nstubs corpus: {checker} over {len(self.copies)} files in {run.seconds:.1f} s")
            self.runs[checker] = run
        return self.runs[checker]

    def found(self, checker: str, original: Path) -> list[Diagnostic]:
        copy = next(c for c, o in self.copies.items() if o == original)
        return self.get(checker).for_path(copy)


@pytest.fixture(scope="session")
def stub_runs() -> StubRuns:
    return StubRuns(_checkers.strip_copy(ALL_FILES, CORPUS, STRIPPED))


def test_corpus_is_present() -> None:
    assert PASS_FILES and FAIL_FILES and MESSAGE_FILES
    stems = [p.stem for p in ALL_FILES]
    assert len(stems) == len(set(stems)), (
        "mypy names each corpus file by its stem: stems must be unique"
    )
    for path in FAIL_FILES:
        expected = expected_codes(path)
        missing = [c for c in CHECKERS if not expected[c]]
        assert not missing, f"{_rel(path)} expects no error from {missing}"
        lines = [set(lines) for lines in expected.values()]
        assert all(x == lines[0] for x in lines), (
            f"{_rel(path)}: the checkers expect errors on different lines"
        )
    for path in PASS_FILES + MESSAGE_FILES:
        assert "ignore[" not in path.read_text(), f"{_rel(path)} must not suppress anything"


@pytest.mark.parametrize("checker", CHECKERS)
def test_no_output_outside_the_corpus(checker: str, stub_runs: StubRuns) -> None:
    run = stub_runs.get(checker)
    stray = [d for d in run.diagnostics if d.path not in stub_runs.copies]
    assert not stray, f"{checker} reported outside the corpus:\n{_report(stray)}"


@pytest.mark.parametrize("path", PASS_FILES + FAIL_FILES, ids=_rel)
@pytest.mark.parametrize("checker", CHECKERS)
def test_corpus_file(checker: str, path: Path, stub_runs: StubRuns) -> None:
    """Pass files: nothing. Fail files: every expected error, with its code, and nothing else."""
    found = stub_runs.found(checker, path)
    mismatches = _checkers.compare(expected_codes(path)[checker], found)
    if mismatches:
        pytest.fail(
            f"{checker} on {_rel(path)}:\n"
            + "\n".join(m.render() for m in mismatches)
            + "\nreported:\n"
            + _report(found),
            pytrace=False,
        )


def _marker_lines(path: Path) -> dict[str, int]:
    lines = path.read_text().splitlines()
    return {
        m.group(1): n
        for n, text in enumerate(lines, 1)
        if (m := re.search(r"# expect: (\w+)", text))
    }


# The semaphore parameters also take a jax.Ref, jax's TransformedRef (pl.select_ref's result)
# and ``sems.at[i]`` of a jax.Array-annotated array (an _IndexUpdateRef), so the messages
# list those; a bare jax.Array is still refused. pl.semaphore_signal and semaphore_wait also
# take None (an unannotated ``ring_sem=None`` parameter); ty shortens a union of six.
_SEM = "SemRef | Ref | TransformedRef | _IndexUpdateRef"
_SIGNALLED = "RegularSem | BarrierSem | Ref | TransformedRef | _IndexUpdateRef | None"
_PYRIGHT_MESSAGES = {
    "seed": {
        (
            "reportArgumentType",
            f'Argument of type "Array" cannot be assigned to parameter "send_sem" of type "{_SEM}" in function '
            f'"make_async_remote_copy"\n  Type "Array" is not assignable to type "{_SEM}"\n'
            '    "Array" is not assignable to "SemRef"\n    "Array" is not assignable to "Ref"\n'
            '    "Array" is not assignable to "TransformedRef"\n'
            '    "Array" is not assignable to "_IndexUpdateRef"',
        )
    },
    "wait_send": {
        (
            "reportCallIssue",
            'Argument missing for parameter "local_copy_has_no_send_side_use_wait"',
        ),
    },
    "signal": {
        (
            "reportArgumentType",
            f'Argument of type "SemRef" cannot be assigned to parameter "sem_or_view" of type "{_SIGNALLED}" '
            f'in function "semaphore_signal"\n  Type "SemRef" is not assignable to type "{_SIGNALLED}"\n'
            '    "SemRef" is not assignable to "RegularSem"\n    "SemRef" is not assignable to "BarrierSem"\n'
            '    "SemRef" is not assignable to "Ref"\n    "SemRef" is not assignable to "TransformedRef"\n'
            '    "SemRef" is not assignable to "_IndexUpdateRef"\n    "SemRef" is not assignable to "None"',
        )
    },
}
EXPECTED_MESSAGES = {
    "mypy": {
        "seed": {
            (
                "arg-type",
                f'Argument 3 to "make_async_remote_copy" has incompatible type "Array"; expected "{_SEM}"',
            )
        },
        "wait_send": {
            (
                "call-arg",
                'Missing named argument "local_copy_has_no_send_side_use_wait" for "wait_send" of "LocalCopyDescriptor"'
                '\n"wait_send" defined in "jax.experimental.pallas.tpu"',
            )
        },
        "signal": {
            (
                "arg-type",
                f'Argument 1 to "semaphore_signal" has incompatible type "SemRef"; expected "{_SIGNALLED}"',
            )
        },
    },
    "pyright": _PYRIGHT_MESSAGES,
    "basedpyright": _PYRIGHT_MESSAGES,
    "pyrefly": {
        "seed": {
            (
                "bad-argument-type",
                "Argument `Array` is not assignable to parameter `send_sem` with type "
                "`Ref | SemRef | TransformedRef | _IndexUpdateRef` "
                "in function `jax.experimental.pallas.tpu.make_async_remote_copy`",
            )
        },
        "wait_send": {
            (
                "missing-argument",
                "Missing argument `local_copy_has_no_send_side_use_wait` in function "
                "`jax.experimental.pallas.tpu.LocalCopyDescriptor.wait_send`",
            )
        },
        "signal": {
            (
                "bad-argument-type",
                "Argument `SemRef` is not assignable to parameter `sem_or_view` with type "
                "`BarrierSem | Ref | RegularSem | TransformedRef | _IndexUpdateRef | None` in function "
                "`jax.experimental.pallas.semaphore_signal`",
            )
        },
    },
    "ty": {
        "seed": {
            (
                "invalid-argument-type",
                f"Argument to function `make_async_remote_copy` is incorrect: Expected `{_SEM}`, found `Array`",
            )
        },
        "wait_send": {
            (
                "missing-argument",
                "No argument provided for required parameter `local_copy_has_no_send_side_use_wait` "
                "of bound method `LocalCopyDescriptor.wait_send`",
            )
        },
        "signal": {
            (
                "invalid-argument-type",
                "Argument to function `semaphore_signal` is incorrect: Expected "
                "`RegularSem | BarrierSem | Ref | ... omitted 3 union elements`, found `SemRef`",
            )
        },
    },
}


@pytest.mark.parametrize("checker", CHECKERS)
def test_messages_name_the_mistake(checker: str, stub_runs: StubRuns) -> None:
    """Without comments, each marked line gives exactly these messages (and nothing else does)."""
    (path,) = MESSAGE_FILES
    markers = _marker_lines(path)
    expected = EXPECTED_MESSAGES[checker]
    assert set(markers) == set(expected)
    found = stub_runs.found(checker, path)
    got = {(d.line, d.code, d.message) for d in found}
    want = {
        (markers[name], code, message)
        for name, pairs in expected.items()
        for code, message in pairs
    }
    assert got == want, f"{checker} messages differ:\n{_report(found)}"


# --------------------------------------------------------------------------
# Honesty against the installed jax
# --------------------------------------------------------------------------


def _allowlists() -> list[Path]:
    version_file = STUBTEST_DIR / f"allowlist-jax{JAX_MINOR}.txt"
    if not version_file.exists():
        pytest.fail(
            f"no stubtest allowlist for jax {jax.__version__}: create {version_file.relative_to(REPO)}",
            pytrace=False,
        )
    return [STUBTEST_DIR / "allowlist-common.txt", version_file]


def _entries(path: Path) -> Iterator[tuple[str, str]]:
    """(entry, reason) for each non-comment line; every entry must give its reason."""
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        entry, sep, reason = raw.partition("  # ")
        assert sep and reason.strip(), (
            f"{path.name}:{n}: entry without a reason ('entry  # reason'): {raw!r}"
        )
        yield entry.strip(), reason.strip()


def _stubtest_mypy_config(directory: Path) -> Path:
    """A mypy config that analyses only the jax modules the stubs import, not all of jax.

    stubtest turns mypy's cache off (a cached module has no syntax tree to compare), so
    by default it re-analyses the whole of jax on every run: about 14-16 s of CPU here.
    Skipping the jax internals the stubs do not import keeps every type the stubs' own
    definitions mention (so type-level checks such as pl.HOST's still run) for about 6-7 s.
    SAFEDMA_STUBTEST_FULL=1 runs stubtest exactly as docs/stubs.md shows.
    """
    followed = {"jax._src.basearray"}  # jax.Array
    for module in STUB_FILES:
        for node in _stub_tree(module).body:
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("jax._src")
            ):
                followed.add(node.module)
                followed |= {
                    f"{node.module}.{alias.name}" for alias in node.names
                }  # `from jax._src import core`
    config = directory / "stubtest-mypy.ini"
    config.write_text(
        "[mypy]\n[mypy-jax._src.*]\nfollow_imports = skip\n"
        f"[mypy-{','.join(sorted(followed))}]\nfollow_imports = normal\n"
    )
    return config


def test_stubtest_against_installed_jax(tmp_path: Path) -> None:
    """stubtest with the allowlists: no difference unlisted, no listed difference unused."""
    allowlists = _allowlists()
    for path in allowlists:
        list(_entries(path))
    cmd = [sys.executable, "-m", "mypy.stubtest", "jax.experimental.pallas"]
    if os.environ.get("SAFEDMA_STUBTEST_FULL") != "1":
        cmd += ["--mypy-config-file", str(_stubtest_mypy_config(tmp_path))]
    for path in allowlists:
        cmd += ["--allowlist", str(path)]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=REPO, env=_env_with_stubs(), capture_output=True, text=True, check=False
    )
    print(f"\nstubtest (jax {jax.__version__}) in {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, f"stubtest failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Success: no issues found" in proc.stdout, proc.stdout


# An allowlist entry silences every stubtest error of its object, so each allowlisted
# function is pinned here: the runtime signature it was checked against, and the
# parameters the stub leaves out (-) or adds (+). Any further drift fails this test.
ALLOWLISTED_SIGNATURES: dict[str, dict[str, tuple[str, set[str], set[str]]]] = {
    "0.12": {},
    "0.10": {
        "jax.experimental.pallas.tpu.get_barrier_semaphore": ("()", set(), {"tag"}),
        # 0.12's src_sem= (and sem=None) for SparseCore push streams.
        "jax.experimental.pallas.tpu.make_async_copy": (
            "(src_ref, dst_ref, sem)",
            set(),
            {"src_sem"},
        ),
        "jax.experimental.pallas.tpu.async_copy": (
            "(src_ref, dst_ref, sem, *, priority: 'int' = 0, add: 'bool' = False)",
            set(),
            {"src_sem"},
        ),
    },
}


def test_allowlisted_functions_differ_only_as_listed() -> None:
    import inspect

    pinned = ALLOWLISTED_SIGNATURES.get(JAX_MINOR, {})
    listed = {entry for entry, _ in _entries(STUBTEST_DIR / f"allowlist-jax{JAX_MINOR}.txt")}
    runtime_functions = {
        e
        for e in listed
        if callable(
            getattr(importlib.import_module(e.rsplit(".", 1)[0]), e.rsplit(".", 1)[1], None)
        )
    }
    assert runtime_functions == set(pinned), (
        "pin every allowlisted function's signature in ALLOWLISTED_SIGNATURES"
    )
    for full_name, (runtime_sig, left_out, added) in pinned.items():
        module, name = full_name.rsplit(".", 1)
        runtime = getattr(importlib.import_module(module), name)
        assert (
            str(inspect.signature(runtime).replace(return_annotation=inspect.Signature.empty))
            == runtime_sig
        ), f"{full_name} changed in jax {jax.__version__}"
        (stub_def,) = [
            n for n in _stub_tree(module).body if isinstance(n, ast.FunctionDef) and n.name == name
        ]
        stub_params = [
            a.arg
            for a in (*stub_def.args.posonlyargs, *stub_def.args.args, *stub_def.args.kwonlyargs)
        ]
        runtime_params = list(inspect.signature(runtime).parameters)
        kept = [p for p in stub_params if p not in added]
        assert (
            kept == [p for p in runtime_params if p not in left_out]
            and set(stub_params) - set(kept) == added
        ), (
            f"{full_name}: stub parameters {stub_params} differ from jax's {runtime_params} beyond -{left_out} +{added}"
        )


def _stub_tree(module: str) -> ast.Module:
    return ast.parse(STUB_FILES[module].read_text())


def _stub_public_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names |= {a.name for a in node.names if a.asname == a.name}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in node.decorator_list}
            if "type_check_only" not in decorators:
                names.add(node.name)
    return {n for n in names if not n.startswith("_")}


def _runtime_public_names(mod: types.ModuleType) -> set[str]:
    """dir() without submodule attributes, plus names served by jax's deprecation __getattr__."""
    names = {
        n
        for n in dir(mod)
        if not n.startswith("_")
        and not (
            isinstance(v := getattr(mod, n), types.ModuleType)
            and v.__name__.startswith(mod.__name__ + ".")
        )
    }
    deprecations: dict[str, tuple[str, object]] = getattr(mod, "_deprecations", {})
    return names | {n for n, (_, replacement) in deprecations.items() if replacement is not None}


def _listed_names(kind: str) -> set[str]:
    """Names in this version's stubtest allowlist and (with kind "+" or "-") its names file."""
    names_file = STUBTEST_DIR / f"names-jax{JAX_MINOR}.txt"
    assert names_file.exists(), f"create {names_file.relative_to(REPO)}"
    listed = set()
    for entry, _ in _entries(names_file):
        assert entry[0] in "+-", f"{names_file.name}: {entry!r} must start with + or -"
        if entry[0] == kind:
            listed.add(entry[1:])
    return listed


def _stubtest_listed() -> set[str]:
    return {entry for entry, _ in _entries(STUBTEST_DIR / f"allowlist-jax{JAX_MINOR}.txt")}


@pytest.mark.parametrize("module", sorted(STUB_FILES))
def test_public_names_match_jax(module: str) -> None:
    """Every public name of the installed module is in the stub and back, except the listed ones.

    stubtest skips re-exported names, so a forgotten or stale re-export would
    otherwise go unnoticed; each difference is listed once, here or in stubtest's allowlist.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        runtime = _runtime_public_names(importlib.import_module(module))
    stub = _stub_public_names(_stub_tree(module))
    in_stubtest = _stubtest_listed()
    only_stub = {f"{module}.{n}" for n in stub - runtime} - in_stubtest
    only_runtime = {f"{module}.{n}" for n in runtime - stub} - in_stubtest
    prefix = module + "."
    want_plus = {
        n for n in _listed_names("+") if n.startswith(prefix) and "." not in n[len(prefix) :]
    }
    want_minus = {
        n for n in _listed_names("-") if n.startswith(prefix) and "." not in n[len(prefix) :]
    }
    assert only_stub == want_plus, (
        f"declared by the stub but missing from jax {jax.__version__} (list with '+' and a reason, or fix): "
        f"unlisted {sorted(only_stub - want_plus)}, listed but not different {sorted(want_plus - only_stub)}"
    )
    assert only_runtime == want_minus, (
        f"public in jax {jax.__version__} but missing from the stub (re-export it, or list with '-' and a reason): "
        f"unlisted {sorted(only_runtime - want_minus)}, listed but not different {sorted(want_minus - only_runtime)}"
    )


@pytest.mark.parametrize("module", sorted(STUB_FILES))
def test_reexports_are_the_runtime_objects(module: str) -> None:
    """``from M import X as X`` in the stub names the object the real module exports (so it has jax's type)."""
    public = importlib.import_module(module)
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for node in _stub_tree(module).body:
            if not (
                isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax")
            ):
                continue
            source = (
                importlib.import_module(node.module)
                if importlib.util.find_spec(node.module)
                else None
            )
            for alias in node.names:
                if alias.asname != alias.name or not hasattr(public, alias.name):
                    continue  # private helpers, and names this jax lacks (listed, see above)
                assert source is not None and hasattr(source, alias.name), (
                    f"{node.module}.{alias.name} is gone"
                )
                assert getattr(source, alias.name) is getattr(public, alias.name), (
                    f"{module}.{alias.name} is not {node.module}.{alias.name} in jax {jax.__version__}"
                )
                checked += 1
    assert checked > 20


def _pyi_files(root: Path) -> list[Path]:
    """The .pyi files under root, following symlinks (as both checkers do)."""
    return sorted(
        (Path(d) / f).relative_to(root)
        for d, _, files in os.walk(root, followlinks=True)
        for f in files
        if f.endswith(".pyi")
    )


def test_layout_keeps_jax_inline_types() -> None:
    """The layout docs/stubs.md measures: one source per stub, two entry points, nothing above pallas/.

    * pyright: ``stubs/pyright/jax`` for ``stubPath`` holds the stub files (a partial
      ``jax-stubs`` anywhere on pyright's paths hides jax's own .pyi files, e.g. jax.numpy's);
    * mypy: ``stubs/mypy/jax-stubs`` with py.typed = "partial\\n" (mypy reads partial stub
      packages only from the interpreter's sys.path, not from mypy_path), whose .pyi files
      are relative symlinks to the pyright tree's: one source, which setuptools copies into
      the sdist and the wheel as real files (test_wheel_install.py checks the wheel).
    Neither has an ``__init__.pyi`` for ``jax`` or ``jax.experimental``: those stay jax's.
    """
    assert (MYPY_TREE / "jax-stubs" / "py.typed").read_bytes() == b"partial\n"
    assert not list(PYRIGHT_TREE.rglob("*-stubs")), (
        "a -stubs directory on pyright's stubPath hides jax's .pyi files"
    )
    for tree in (PYRIGHT_TREE / "jax", MYPY_TREE / "jax-stubs"):
        assert (
            not (tree / "__init__.pyi").exists()
            and not (tree / "experimental" / "__init__.pyi").exists()
        )
    mypy_files, pyright_files = (
        _pyi_files(MYPY_TREE / "jax-stubs"),
        _pyi_files(PYRIGHT_TREE / "jax"),
    )
    assert (
        mypy_files
        == pyright_files
        == [
            Path("experimental/pallas/__init__.pyi"),
            Path("experimental/pallas/tpu.pyi"),
            Path("experimental/pallas/tpu_sc.pyi"),
        ]
    )
    for rel in pyright_files:
        source, entry = PYRIGHT_TREE / "jax" / rel, MYPY_TREE / "jax-stubs" / rel
        assert not source.is_symlink(), f"{source.relative_to(REPO)} is the one source: a real file"
        link = os.readlink(entry) if entry.is_symlink() else None
        assert (
            link is not None and not os.path.isabs(link) and entry.resolve() == source.resolve()
        ), (
            f"{entry.relative_to(REPO)} must be a relative symlink to {source.relative_to(REPO)} "
            f"(one source; the wheel gets a copy): ln -sf {os.path.relpath(source, entry.parent)} {entry.relative_to(REPO)}"
        )
