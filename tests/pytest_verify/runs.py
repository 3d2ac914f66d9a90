"""Running a small user project's tests in a fresh pytest process, and reading the result.

Each run starts jax anew (the plugin sets the simulated device count before jax
starts), so runs are few and shared by the tests that read them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECTS = Path(__file__).resolve().parent / "projects"

# the variables a run must not inherit from the suite that starts it
_OWN = ("XLA_FLAGS", "JAX_PLATFORMS", "SAFEDMA_VERIFY", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")


@dataclass(frozen=True)
class Run:
    """A finished run: its exit code, output, and each test's outcome by name."""

    code: int
    output: str
    outcomes: dict[str, str]

    def failure(self, name: str) -> str:
        """The failure report of test ``name`` as pytest printed it."""
        found = re.search(
            rf"_{{3,}} {re.escape(name)} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}} )", self.output, re.S
        )
        assert found, f"no failure report for {name} in:\n{self.output}"
        return found.group(1)

    def summary(self) -> str:
        """The plugin's summary section."""
        found = re.search(r"=+ safedma verify =+\n(.*?)(?=\n=+ )", self.output, re.S)
        assert found, f"no safedma verify summary in:\n{self.output}"
        return found.group(1)


def run_project(
    directory: Path,
    project: str,
    *args: str,
    ini: str = "",
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> Run:
    """Copy ``projects/<project>.py`` into ``directory`` as ``test_<project>.py`` and
    run pytest there with safedma's plugin (as its entry point loads it)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECTS / f"{project}.py", directory / f"test_{project}.py")
    (directory / "pytest.ini").write_text(f"[pytest]\nsafedma_devices = 4\n{ini}")
    environment = {k: v for k, v in os.environ.items() if k not in _OWN}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    environment.update(env or {})
    junit = directory / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "safedma.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-rA",
            f"--junitxml={junit}",
            *args,
        ],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = done.stdout + done.stderr
    outcomes: dict[str, str] = {}
    if junit.exists():
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            outcomes[case.attrib["name"]] = kinds[0] if kinds else "passed"
    return Run(done.returncode, output, outcomes)
