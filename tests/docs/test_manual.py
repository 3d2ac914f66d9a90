"""The user's manual builds, documents every public name and every error, and speaks of the product.

The manual is built once per run with ``mkdocs build --strict`` (mkdocs.yml) into a
temporary directory: a broken link or anchor, a page left out of the navigation, a
missing snippet file or section, or an API reference entry that does not resolve is a
warning there, and --strict makes any warning fail the build. The built pages are
then read back: the API reference must hold an entry for every public name, the
troubleshooting page must name every error class, and the catalogue must keep its
anchors. The examples the manual includes are run in slow tests.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import safedma
import safedma.kernels
import safedma.pytest_plugin
import safedma.stubs
import safedma.testing

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The manual, built with --strict into a temporary directory (about 10 s)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return out


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


def test_every_public_name_of_safedma_has_a_reference_entry(site: Path) -> None:
    ids = _ids(site / "reference" / "safedma" / "index.html")
    missing = [n for n in safedma.__all__ if f"safedma.{n}" not in ids]
    assert not missing, f"docs/reference/safedma.md has no entry for {missing}"


def test_every_public_name_of_safedma_testing_has_a_reference_entry(site: Path) -> None:
    ids = _ids(site / "reference" / "testing" / "index.html")
    missing = [n for n in safedma.testing.__all__ if f"safedma.testing.{n}" not in ids]
    assert not missing, f"docs/reference/testing.md has no entry for {missing}"


def test_every_public_name_of_safedma_gpu_has_a_reference_entry(site: Path) -> None:
    import safedma.gpu

    ids = _ids(site / "reference" / "gpu" / "index.html")
    missing = [n for n in safedma.gpu.__all__ if f"safedma.gpu.{n}" not in ids]
    assert not missing, f"docs/reference/gpu.md has no entry for {missing}"


def test_every_kernel_has_a_reference_entry_under_its_public_module(site: Path) -> None:
    """Each name of safedma.kernels is documented in the public kernel module that holds
    it (safedma.kernels.ppermute.ppermute), with that module's text."""
    ids = _ids(site / "reference" / "kernels" / "index.html")
    missing = [
        name
        for name in safedma.kernels.__all__
        if not any(re.fullmatch(rf"safedma\.kernels\.[a-z]\w*\.{name}", i) for i in ids)
    ]
    assert not missing, f"docs/reference/kernels.md has no entry for {missing}"


def test_the_plugins_and_stubs_have_reference_entries(site: Path) -> None:
    ids = _ids(site / "reference" / "plugins" / "index.html")
    wanted = [f"safedma.pytest_plugin.{n}" for n in safedma.pytest_plugin.__all__]
    wanted += [f"safedma.stubs.{n}" for n in safedma.stubs.__all__]
    wanted.append("safedma.mypy_plugin")
    missing = [w for w in wanted if w not in ids]
    assert not missing, f"docs/reference/plugins.md has no entry for {missing}"


def test_the_reference_names_no_private_module(site: Path) -> None:
    """Entries are found by their public path, so regrouping private modules breaks nothing."""
    for page in (site / "reference").rglob("index.html"):
        private = sorted(i for i in _ids(page) if re.search(r"(^|\.)_[a-z]", i))
        assert not private, f"{page.parent.name}: entries under private paths {private}"


def _error_classes() -> set[type[BaseException]]:
    """Every subclass of SafeDmaError once every module that defines one is loaded,
    and every exception class the testing helpers export."""
    importlib.import_module("safedma.testing._verify")
    importlib.import_module("safedma.gpu._errors")
    found: set[type[BaseException]] = set()
    todo: list[type[BaseException]] = [safedma.SafeDmaError]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    for module in (safedma, safedma.testing):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.add(value)
    return found


def test_every_error_class_is_on_the_troubleshooting_page() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    classes = _error_classes()
    assert len(classes) > 40, "the error classes were not found"
    missing = sorted(c.__name__ for c in classes if f"`{c.__name__}`" not in page)
    assert not missing, f"docs/troubleshooting.md does not explain {missing}"


CATALOGUE_ANCHORS = [f"s{i}" for i in range(1, 10)] + ["t1", "t3", "t4", "t7", "t8", "t9", "t10"]
CATALOGUE_ANCHORS += [f"r{i}" for i in range(1, 11)]


def test_the_catalogue_keeps_its_anchors(site: Path) -> None:
    """Error messages and other pages cite catalogue.md#s1 and the like."""
    ids = _ids(site / "catalogue" / "index.html")
    missing = [a for a in CATALOGUE_ANCHORS if a not in ids]
    assert not missing, f"docs/catalogue.md lost the anchors {missing}"


# Words about how the project was made rather than what it is: work sessions,
# measurement campaigns, held-out sets, issue numbers, notes kept outside the repository.
PROCESS_WORDS = re.compile(
    r"\bsessions?\b|\bcampaigns?\b|held[- ]?out|issue ?#?\d|"
    r"MISUSE\.md|FINDINGS\.md|PATTERNS\.md|\.\./shared",
    re.IGNORECASE,
)
USER_TEXTS = sorted(
    [
        *DOCS.rglob("*.md"),
        *(DOCS / "_ext").glob("*.py"),
        REPO / "README.md",
        REPO / "CHANGELOG.md",
        REPO / "CONTRIBUTING.md",
        REPO / "mkdocs.yml",
        *(REPO / "examples").glob("*.py"),
        REPO / "benchmarks" / "README.md",
        REPO / "benchmarks" / "results" / "notes.md",
    ]
)


def test_the_process_word_pattern_matches_what_it_is_for() -> None:
    for text in ("session 7", "Held-out kernels", "heldout", "issue 14", "issue #3", "MISUSE.md"):
        assert PROCESS_WORDS.search(text), text
    for text in ("a missing operation", "the issuer's clock", "held in a variable"):
        assert not PROCESS_WORDS.search(text), text


@pytest.mark.parametrize("path", USER_TEXTS, ids=[str(p.relative_to(REPO)) for p in USER_TEXTS])
def test_the_manual_speaks_of_the_product_alone(path: Path) -> None:
    hits = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PROCESS_WORDS.search(line)
    ]
    assert not hits, f"{path.relative_to(REPO)}:\n" + "\n".join(hits)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the example sets its own device count
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_the_getting_started_example_runs() -> None:
    result = _run("examples/first_kernel.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "output matches numpy.roll" in result.stdout
    assert "verified: 1 kernel(s) ring_permute on 256 device(s)" in result.stdout


@pytest.mark.slow
def test_the_pytest_plugin_example_passes() -> None:
    result = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/test_first_kernel.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout


@pytest.mark.slow
def test_the_compile_checks_example_runs() -> None:
    pytest.importorskip("libtpu", reason="compile_for_tpu needs the tpu extra")
    result = _run("examples/compile_checks.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bytes of TPU code" in result.stdout


@pytest.mark.slow
def test_the_sanitizer_recipe_reports_the_hang() -> None:
    result = _run("examples/sanitize_on_cpu.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[safedma sanitizer] hang (R3) on device 0" in result.stdout
    assert "sanitize_on_cpu.py:37 (double_hangs)" in result.stdout


@pytest.mark.slow
def test_the_typed_jax_wrapper_runs() -> None:
    result = _run("examples/typed_jax.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fori_loop: 0 + 1 + 2 + 3 = 6" in result.stdout


@pytest.mark.slow
def test_the_library_kernels_example_gathers_on_eight_devices() -> None:
    result = _run("examples/library_kernels.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every device holds the whole input" in result.stdout
