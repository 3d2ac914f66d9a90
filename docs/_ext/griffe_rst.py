"""A griffe extension for the API reference: safedma's docstrings in Markdown.

safedma's docstrings are prose written with reStructuredText's inline roles
(``:class:`LocalCopy```, ``:func:`~safedma.testing.verify```) and literal blocks
(a paragraph ending in ``::``), which is what an editor's hover shows. mkdocstrings
renders Markdown, where a role would print as written: this extension rewrites each
role to inline code (the last dotted part for a ``~`` target, as Sphinx shows it)
and ``::`` to ``:`` before the indented block, which Markdown already shows as code.
The docstrings themselves are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(~?)([^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::[ \t]*$", re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    if match.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def markdown(text: str) -> str:
    """``text`` with its reStructuredText roles and literal-block markers made Markdown."""
    return _LITERAL_BLOCK.sub(":", _ROLE.sub(_role, text))


class RstToMarkdown(griffe.Extension):
    """Rewrite every loaded docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
