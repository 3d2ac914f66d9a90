"""No file of the repository keeps a merge's conflict markers: inside a docstring or a
Markdown page they parse and build, so nothing else would notice them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)


def test_no_tracked_file_holds_conflict_markers() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.pyi", "*.md", "*.toml", "*.yml", "*.json", "*.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [
        name
        for name in listed
        if (ROOT / name).is_file()
        and _MARKER.search((ROOT / name).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, f"conflict markers left by a merge in: {found}"
