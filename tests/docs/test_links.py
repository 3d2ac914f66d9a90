"""Every relative link in the README and docs/ resolves inside the repository.

A link that leaves the repository (``../elsewhere/...``) or names a file that moved
sends a reader nowhere; an anchor that no longer exists lands them at the top of
a long page. Both fail here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "CHANGELOG.md",
        *(REPO / "docs").rglob("*.md"),
        REPO / "benchmarks" / "README.md",
    ]
)
# [text](target) not preceded by "!" (images are links too, so keep them).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _links(doc: Path) -> list[str]:
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def _anchors(doc: Path) -> set[str]:
    text = doc.read_text(encoding="utf-8")
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        ids.add(slug)
    return ids


CASES = [(doc, target) for doc in DOCS for target in _links(doc)]


def test_the_documents_have_links() -> None:
    assert len(CASES) > 5, "the link pattern no longer matches the documents' links"


@pytest.mark.parametrize(
    ("doc", "target"), CASES, ids=[f"{d.relative_to(REPO)}->{t}" for d, t in CASES]
)
def test_relative_link_resolves_inside_the_repository(doc: Path, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    resolved = (doc.parent / path_part).resolve() if path_part else doc
    where = f"{doc.relative_to(REPO)} links to {target!r}"
    assert resolved.is_relative_to(REPO), f"{where}, which is outside the repository"
    assert resolved.exists(), f"{where}, which does not exist"
    if anchor and resolved.suffix == ".md":
        assert anchor in _anchors(resolved), f"{where}, whose anchor #{anchor} is not in it"
