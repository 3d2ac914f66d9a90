"""Tests that share a set-up run on one worker.

``./dev test`` spreads the suite over pytest-xdist workers with ``--dist loadgroup``,
and tests/support/fast_lane.py puts tests that share a module-wide set-up (a type
checker's run, a built wheel, the manual's build) in one group by adding
``xdist_group`` marks at collection. Some pytest and pytest-xdist releases together
drop such groups without a word, and each worker then builds the set-up again; this
runs a small project the same way and checks where its tests ran.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = """\
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "shared" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("shared"))
"""

TESTS = """\
import pytest

@pytest.mark.parametrize("n", range(6))
def test_shared(n):
    pass

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    pass
"""


def test_marks_added_at_collection_keep_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(textwrap.dedent(TESTS))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-v",
            "-p",
            "no:randomly",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers = {
        worker
        for worker, nodeid in re.findall(r"\[(gw\d+)\].*PASSED (\S+)", result.stdout)
        if "test_shared" in nodeid
    }
    ran = re.findall(r"PASSED \S+test_shared", result.stdout)
    assert len(ran) == 12, result.stdout
    assert len(workers) == 1, f"the group ran on {sorted(workers)}:\n{result.stdout}"
