"""The development workflow's declarations agree with each other and with what runs.

uv.lock pins the two jax generations of the test matrix, the environment running
this suite has the locked jax, dev tools live in a dependency group (not a published
extra), pre-commit runs the locked ruff, and the editable install is one the type
checkers can see.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCK = tomllib.loads((REPO / "uv.lock").read_text())


def _locked(name: str) -> list[dict[str, object]]:
    return [p for p in LOCK["package"] if p["name"] == name]


def test_lock_pins_one_jax_per_python() -> None:
    versions = sorted(str(p["version"]) for p in _locked("jax"))
    assert len(versions) == 2, versions
    oldest, newest = versions
    assert oldest == "0.10.2"
    assert newest.startswith("0.12."), newest
    markers = {
        str(p["version"]): " ".join(map(str, p.get("resolution-markers", [])))
        for p in _locked("jax")
    }
    assert "python_full_version < '3.12'" in markers[oldest]
    assert "python_full_version == '3.12.*'" in markers[newest]


def test_this_environment_has_the_locked_jax() -> None:
    """So that two developers (and CI) run the suite against the same jax."""
    want_oldest = sys.version_info < (3, 12)
    locked = sorted(str(p["version"]) for p in _locked("jax"))
    expected = locked[0] if want_oldest else locked[1]
    assert importlib.metadata.version("jax") == expected, "run ./dev setup (uv sync --locked)"


def test_dev_tools_are_a_dependency_group_not_an_extra() -> None:
    extras = PYPROJECT["project"].get("optional-dependencies", {})
    tools = {"mypy", "pytest", "pyright", "basedpyright", "pyrefly", "ty", "ruff", "hypothesis"}
    published = {re.split(r"[\[<>=!; ]", req)[0] for reqs in extras.values() for req in reqs}
    assert not (tools & published), f"dev tools in a published extra: {sorted(tools & published)}"
    group = {
        re.split(r"[\[<>=!; ]", req)[0]
        for req in PYPROJECT["dependency-groups"]["dev"]
        if isinstance(req, str)
    }
    assert tools <= group, f"missing from the dev group: {sorted(tools - group)}"


def test_pre_commit_runs_the_locked_ruff() -> None:
    (ruff,) = _locked("ruff")
    config = (REPO / ".pre-commit-config.yaml").read_text()
    pins = re.findall(r'"ruff==([^"]+)"', config)
    assert pins and set(pins) == {ruff["version"]}, (
        f"pre-commit pins {pins}, uv.lock has {ruff['version']}"
    )


def test_editable_install_is_visible_to_type_checkers() -> None:
    """setuptools' compat mode: a .pth path entry, not an import hook (which mypy and pyright cannot follow)."""
    # The installed one (a build also leaves safedma.egg-info in the checkout, on sys.path).
    installed = [
        d
        for d in importlib.metadata.distributions(name="safedma")
        if d.read_text("direct_url.json")
    ]
    if not installed:
        pytest.skip("safedma is not installed in this interpreter (run through ./dev)")
    (dist,) = installed
    pths = [f for f in dist.files or [] if str(f).endswith(".pth")]
    assert pths, "no .pth file: not an editable install"
    finders = [f for f in dist.files or [] if "_finder" in str(f)]
    assert not finders, f"an import-hook editable install ({finders}): use editable_mode=compat"
    entries = {
        line.strip()
        for pth in pths
        for line in Path(str(dist.locate_file(pth))).read_text().splitlines()
    }
    assert any((Path(e) / "safedma" / "__init__.py").exists() for e in entries), entries


def _ci_workflow() -> dict[str, object]:
    yaml = pytest.importorskip("yaml")  # PyYAML, in the dev environments through mkdocs
    loaded = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _steps(job: dict[str, object]) -> str:
    steps = job.get("steps")
    assert isinstance(steps, list)
    return "\n".join(str(step.get("run", "")) for step in steps if isinstance(step, dict))


def test_ci_workflow_runs_lint_both_environments_and_the_manual() -> None:
    """The forge's CI runs what a developer runs: ./dev lint, ./dev test on py311 and
    py312, ./dev docs build; the slow tests on a schedule."""
    jobs = _ci_workflow()["jobs"]
    assert isinstance(jobs, dict)
    runs = {name: _steps(job) for name, job in jobs.items()}
    assert any(re.search(r"\./dev lint\b", r) for r in runs.values()), runs
    assert any(re.search(r"\./dev docs build\b", r) for r in runs.values()), runs
    for lane in ("not slow", "slow"):
        (job_name,) = [
            n for n, r in runs.items() if re.search(rf'\./dev test .*-m "?{lane}"?(\s|$)', r)
        ]
        matrix = jobs[job_name]["strategy"]["matrix"]["env"]
        assert sorted(matrix) == ["py311", "py312"], (job_name, matrix)
        assert "${{ matrix.env }}" in runs[job_name]


def test_ci_workflow_names_only_dev_commands_that_exist() -> None:
    dev = (REPO / "dev").read_text()
    commands = set(re.findall(r'^    "(\w+)": \(cmd_\w+,', dev, re.M))
    assert {"lint", "test", "docs"} <= commands, commands
    jobs = _ci_workflow()["jobs"]
    assert isinstance(jobs, dict)
    text = "\n".join(_steps(job) for job in jobs.values())
    used = set(re.findall(r"\./dev (\w+)", text))
    assert used and used <= commands, sorted(used - commands)
    block = re.search(r"^ENVS = \{(.*?)^\}", dev, re.M | re.S)
    assert block, "dev defines no ENVS"
    envs = set(re.findall(r'"(\w+)": Env\(', block.group(1)))
    named = set(re.findall(r"\bpy3\d\d\b", (REPO / ".github" / "workflows" / "ci.yml").read_text()))
    assert named <= envs, sorted(named - envs)
