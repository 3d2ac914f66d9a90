"""The raw-pltpu stubs (``stubs/``): the S-rows under mypy and pyright, and honesty against jax.

* ``tests/stubs/pass/*.py``: raw pltpu kernels annotated with safedma's brands;
  both checkers must report nothing. One file asserts that jax's own inline
  types survive (``jnp``, ``jax.Array``, ``pl.BlockSpec`` ...).
* ``tests/stubs/fail/*.py``: every expected error is written on its line, for
  mypy as ``# type: ignore[code]`` (run with --warn-unused-ignores) and for
  pyright as ``# pyright: ignore[rule]`` (reportUnnecessaryTypeIgnoreComment,
  with ``# type: ignore`` disabled for pyright), so an error that does not
  happen, or happens with another code, fails the file.
* ``tests/stubs/messages/``: no ignores; the exact messages are checked here.
* stubtest compares the stubs with the installed jax, with the allowlists in
  ``stubs/stubtest/`` (each entry has its reason; unused entries fail), and a
  name check covers what stubtest skips (re-exports, ``__getattr__`` names).

One mypy, one pyright and one stubtest process per session. mypy runs the way
docs/stubs.md tells a user to: the ``jax-stubs`` tree on PYTHONPATH; safedma is
found there too (as an installed package would be), so only corpus files report.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "stubs"
PYRIGHT_TREE = REPO / "safedma" / "stubs" / "pyright"
MYPY_TREE = REPO / "safedma" / "stubs" / "mypy"
STUBTEST_DIR = REPO / "safedma" / "stubs" / "stubtest"
STUB_FILES = {
    "jax.experimental.pallas": PYRIGHT_TREE / "jax" / "experimental" / "pallas" / "__init__.pyi",
    "jax.experimental.pallas.tpu": PYRIGHT_TREE / "jax" / "experimental" / "pallas" / "tpu.pyi",
}

PASS_FILES = sorted((CORPUS / "pass").glob("*.py"))
FAIL_FILES = sorted((CORPUS / "fail").glob("*.py"))
MESSAGE_FILES = sorted((CORPUS / "messages").glob("*.py"))
ALL_FILES = PASS_FILES + FAIL_FILES + MESSAGE_FILES

JAX_MINOR = ".".join(jax.__version__.split(".")[:2])  # "0.10", "0.12"
_ENV_TAG = hashlib.sha256(sys.prefix.encode()).hexdigest()[:8]
MYPY_CACHE = REPO / ".mypy_cache" / f"stubs-tests-{_ENV_TAG}"


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    path: Path
    line: int
    code: str | None  # mypy error code or pyright rule
    message: str


@dataclasses.dataclass(frozen=True)
class CheckerRun:
    name: str
    diagnostics: tuple[Diagnostic, ...]
    output: str
    seconds: float

    def for_path(self, path: Path) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.path == path.resolve()]

    def report(self, found: list[Diagnostic]) -> str:
        return "\n".join(f"{d.path.relative_to(CORPUS)}:{d.line}: [{d.code}] {d.message}" for d in found)


def _rel(path: Path) -> str:
    return path.relative_to(CORPUS).as_posix()


def _env_with_stubs() -> dict[str, str]:
    """The mypy user set-up: the partial ``jax-stubs`` tree (and safedma) on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(MYPY_TREE), str(REPO)])}


_MYPY_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<sev>error|note): (?P<msg>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$")


@pytest.fixture(scope="session")
def mypy_run() -> CheckerRun:
    cmd = [
        sys.executable, "-m", "mypy", "--strict", "--warn-unused-ignores",
        "--untyped-calls-exclude=jax",  # the line README.md recommends for every jax user
        "--no-error-summary", "--show-error-codes", "--no-pretty", "--no-color-output",
        "--cache-dir", str(MYPY_CACHE),
        *(_rel(p) for p in ALL_FILES),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=CORPUS, env=_env_with_stubs(), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        pytest.fail(f"mypy crashed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    diagnostics = []
    for raw in proc.stdout.splitlines():
        match = _MYPY_LINE.match(raw)
        if match is None:
            pytest.fail(f"unparsed mypy output line: {raw!r}", pytrace=False)
        if match["sev"] == "note":
            continue
        path = (CORPUS / match["path"]).resolve()
        diagnostics.append(Diagnostic(path, int(match["line"]), match["code"], match["msg"]))
    print(f"\nstubs corpus: mypy over {len(ALL_FILES)} files in {seconds:.1f} s")
    return CheckerRun("mypy", tuple(diagnostics), proc.stdout, seconds)


def _pyright_command() -> list[str]:
    exe = Path(sys.executable).parent / "pyright"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("pyright")
    if found is None:
        pytest.fail("pyright is not installed in this environment (it is a dev dependency)", pytrace=False)
    return [found]


@pytest.fixture(scope="session")
def pyright_run() -> CheckerRun:
    # The config (tests/stubs/pyrightconfig.json) holds the user's one line, "stubPath".
    cmd = [*_pyright_command(), "-p", str(CORPUS), "--pythonpath", sys.executable, "--outputjson"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=CORPUS, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright gave no JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False)
    analysed = data["summary"]["filesAnalyzed"]
    assert analysed == len(ALL_FILES), f"pyright analysed {analysed} files, the corpus has {len(ALL_FILES)}"
    diagnostics = tuple(
        Diagnostic(
            Path(d["file"]).resolve(), d["range"]["start"]["line"] + 1, d.get("rule"),
            d["message"].replace("\xa0", " "),
        )
        for d in data["generalDiagnostics"]
        if d["severity"] == "error"
    )
    print(f"\nstubs corpus: pyright over {len(ALL_FILES)} files in {seconds:.1f} s")
    return CheckerRun("pyright", diagnostics, proc.stdout, seconds)


CHECKERS = ["mypy_run", "pyright_run"]


def test_corpus_is_present() -> None:
    assert PASS_FILES and FAIL_FILES and MESSAGE_FILES
    stems = [p.stem for p in ALL_FILES]
    assert len(stems) == len(set(stems)), "mypy names each corpus file by its stem: stems must be unique"
    for path in FAIL_FILES:
        text = path.read_text()
        assert "# type: ignore[" in text and "# pyright: ignore[" in text, f"{_rel(path)} expects no error"
    for path in PASS_FILES + MESSAGE_FILES:
        assert "ignore[" not in path.read_text(), f"{_rel(path)} must not suppress anything"


@pytest.mark.parametrize("checker", CHECKERS)
def test_no_output_outside_the_corpus(checker: str, request: pytest.FixtureRequest) -> None:
    run: CheckerRun = request.getfixturevalue(checker)
    known = {p.resolve() for p in ALL_FILES}
    stray = [d for d in run.diagnostics if d.path not in known]
    assert not stray, f"{run.name} reported outside the corpus:\n{run.output}"


@pytest.mark.parametrize("path", PASS_FILES + FAIL_FILES, ids=_rel)
@pytest.mark.parametrize("checker", CHECKERS)
def test_corpus_file(checker: str, path: Path, request: pytest.FixtureRequest) -> None:
    """Pass files: nothing. Fail files: every expected error, with its code, and nothing else."""
    run: CheckerRun = request.getfixturevalue(checker)
    found = run.for_path(path)
    if found:
        pytest.fail(
            f"{run.name} on {_rel(path)}: an expected error is missing (unused ignore), has another "
            f"code, or an unexpected error appeared:\n{run.report(found)}",
            pytrace=False,
        )


def _marker_lines(path: Path) -> dict[str, int]:
    lines = path.read_text().splitlines()
    return {m.group(1): n for n, text in enumerate(lines, 1) if (m := re.search(r"# expect: (\w+)", text))}


EXPECTED_MESSAGES = {
    "mypy_run": {
        "seed": {("arg-type", 'Argument 3 to "make_async_remote_copy" has incompatible type "Array"; expected "SemRef"')},
        "wait_send": {("attr-defined", '"LocalCopyDescriptor" has no attribute "wait_send"')},
        "signal": {
            ("arg-type", 'Argument 1 to "semaphore_signal" has incompatible type "SemRef"; expected "RegularSem | BarrierSem"')
        },
    },
    "pyright_run": {
        "seed": {
            (
                "reportArgumentType",
                'Argument of type "Array" cannot be assigned to parameter "send_sem" of type "SemRef" in function '
                '"make_async_remote_copy"\n  "Array" is not assignable to "SemRef"',
            )
        },
        "wait_send": {
            ("reportAttributeAccessIssue", 'Cannot access attribute "wait_send" for class "LocalCopyDescriptor"\n  Attribute "wait_send" is unknown'),
            ("reportUnknownMemberType", 'Type of "wait_send" is unknown'),
        },
        "signal": {
            (
                "reportArgumentType",
                'Argument of type "SemRef" cannot be assigned to parameter "sem_or_view" of type "RegularSem | BarrierSem" '
                'in function "semaphore_signal"\n  Type "SemRef" is not assignable to type "RegularSem | BarrierSem"\n'
                '    "SemRef" is not assignable to "RegularSem"\n    "SemRef" is not assignable to "BarrierSem"',
            )
        },
    },
}


@pytest.mark.parametrize("checker", CHECKERS)
def test_messages_name_the_mistake(checker: str, request: pytest.FixtureRequest) -> None:
    """Without ignores, each marked line gives exactly these messages (and nothing else does)."""
    run: CheckerRun = request.getfixturevalue(checker)
    (path,) = MESSAGE_FILES
    markers = _marker_lines(path)
    expected = EXPECTED_MESSAGES[checker]
    assert set(markers) == set(expected)
    got = {(d.line, d.code, d.message) for d in run.for_path(path)}
    want = {(markers[name], code, message) for name, pairs in expected.items() for code, message in pairs}
    assert got == want, f"{run.name} messages differ:\n{run.report(run.for_path(path))}"


# --------------------------------------------------------------------------
# Honesty against the installed jax
# --------------------------------------------------------------------------


def _allowlists() -> list[Path]:
    version_file = STUBTEST_DIR / f"allowlist-jax{JAX_MINOR}.txt"
    if not version_file.exists():
        pytest.fail(f"no stubtest allowlist for jax {jax.__version__}: create {version_file.relative_to(REPO)}", pytrace=False)
    return [STUBTEST_DIR / "allowlist-common.txt", version_file]


def _entries(path: Path) -> Iterator[tuple[str, str]]:
    """(entry, reason) for each non-comment line; every entry must give its reason."""
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        entry, sep, reason = raw.partition("  # ")
        assert sep and reason.strip(), f"{path.name}:{n}: entry without a reason ('entry  # reason'): {raw!r}"
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
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax._src"):
                followed.add(node.module)
                followed |= {f"{node.module}.{alias.name}" for alias in node.names}  # `from jax._src import core`
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
    proc = subprocess.run(cmd, cwd=REPO, env=_env_with_stubs(), capture_output=True, text=True, check=False)
    print(f"\nstubtest (jax {jax.__version__}) in {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, f"stubtest failed:\n{proc.stdout}\n{proc.stderr}"
    assert "Success: no issues found" in proc.stdout, proc.stdout


# An allowlist entry silences every stubtest error of its object, so each allowlisted
# function is pinned here: the runtime signature it was checked against, and the
# parameters the stub leaves out (-) or adds (+). Any further drift fails this test.
ALLOWLISTED_SIGNATURES: dict[str, dict[str, tuple[str, set[str], set[str]]]] = {
    "0.12": {
        "jax.experimental.pallas.tpu.make_async_copy": ("(src_ref, dst_ref, sem=None, *, src_sem=None)", {"src_sem"}, set()),
        "jax.experimental.pallas.tpu.async_copy": (
            "(src_ref, dst_ref, sem=None, *, src_sem=None, priority: 'int' = 0, add: 'bool' = False)", {"src_sem"}, set()
        ),
    },
    "0.10": {
        "jax.experimental.pallas.tpu.get_barrier_semaphore": ("()", set(), {"tag"}),
    },
}


def test_allowlisted_functions_differ_only_as_listed() -> None:
    import inspect

    pinned = ALLOWLISTED_SIGNATURES.get(JAX_MINOR, {})
    listed = {entry for entry, _ in _entries(STUBTEST_DIR / f"allowlist-jax{JAX_MINOR}.txt")}
    runtime_functions = {e for e in listed if callable(getattr(importlib.import_module(e.rsplit(".", 1)[0]), e.rsplit(".", 1)[1], None))}
    assert runtime_functions == set(pinned), "pin every allowlisted function's signature in ALLOWLISTED_SIGNATURES"
    for full_name, (runtime_sig, left_out, added) in pinned.items():
        module, name = full_name.rsplit(".", 1)
        runtime = getattr(importlib.import_module(module), name)
        assert str(inspect.signature(runtime).replace(return_annotation=inspect.Signature.empty)) == runtime_sig, f"{full_name} changed in jax {jax.__version__}"
        (stub_def,) = [n for n in _stub_tree(module).body if isinstance(n, ast.FunctionDef) and n.name == name]
        stub_params = [a.arg for a in (*stub_def.args.posonlyargs, *stub_def.args.args, *stub_def.args.kwonlyargs)]
        runtime_params = list(inspect.signature(runtime).parameters)
        assert stub_params == [p for p in runtime_params if p not in left_out] + sorted(added), (
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
        n for n in dir(mod)
        if not n.startswith("_")
        and not (isinstance(v := getattr(mod, n), types.ModuleType) and v.__name__.startswith(mod.__name__ + "."))
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
    want_plus = {n for n in _listed_names("+") if n.startswith(prefix) and "." not in n[len(prefix):]}
    want_minus = {n for n in _listed_names("-") if n.startswith(prefix) and "." not in n[len(prefix):]}
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
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax")):
                continue
            source = importlib.import_module(node.module) if importlib.util.find_spec(node.module) else None
            for alias in node.names:
                if alias.asname != alias.name or not hasattr(public, alias.name):
                    continue  # private helpers, and names this jax lacks (listed, see above)
                assert source is not None and hasattr(source, alias.name), f"{node.module}.{alias.name} is gone"
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
    """The layout docs/stubs.md measures: one set of files, two entry points, nothing above pallas/.

    * mypy: ``stubs/mypy/jax-stubs`` with py.typed = "partial\\n" (mypy reads partial stub
      packages only from the interpreter's sys.path, not from mypy_path);
    * pyright: ``stubs/pyright/jax`` for ``stubPath`` (a partial ``jax-stubs`` anywhere on
      pyright's paths hides jax's own .pyi files, e.g. jax.numpy's).
    Neither has an ``__init__.pyi`` for ``jax`` or ``jax.experimental``: those stay jax's.
    """
    assert (MYPY_TREE / "jax-stubs" / "py.typed").read_bytes() == b"partial\n"
    assert not list(PYRIGHT_TREE.rglob("*-stubs")), "a -stubs directory on pyright's stubPath hides jax's .pyi files"
    for tree in (PYRIGHT_TREE / "jax", MYPY_TREE / "jax-stubs"):
        assert not (tree / "__init__.pyi").exists() and not (tree / "experimental" / "__init__.pyi").exists()
    mypy_files, pyright_files = _pyi_files(MYPY_TREE / "jax-stubs"), _pyi_files(PYRIGHT_TREE / "jax")
    assert mypy_files == pyright_files == [Path("experimental/pallas/__init__.pyi"), Path("experimental/pallas/tpu.pyi")]
    for rel in mypy_files:
        same = (MYPY_TREE / "jax-stubs" / rel).read_bytes() == (PYRIGHT_TREE / "jax" / rel).read_bytes()
        assert same, f"{rel}: the mypy and pyright copies differ (the wheel ships real files: copy safedma/stubs/pyright/jax/experimental/pallas/*.pyi into safedma/stubs/mypy/jax-stubs/experimental/pallas/)"
