"""Public classes carry the public module path.

A class defined in a private module prints as ``safedma._errors.DeviceIdError`` in
tracebacks, reprs and ``pytest.raises`` messages, a path no user imports from.
:func:`publish`, called at the end of each module that defines public names, sets
the ``__module__`` of those classes to ``safedma`` (the name they are imported by),
as jax and numpy do for theirs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

__all__ = ["publish"]


def publish(namespace: Mapping[str, object], module: str) -> None:
    """Set ``__module__`` to ``"safedma"`` on the classes of ``namespace`` (the globals of
    ``module``) that ``safedma`` exports from ``module``."""
    # The package is imported before its modules; read it without importing it again
    # (an import here would be a cycle: safedma -> its module -> here -> safedma).
    homes: dict[str, str] = getattr(sys.modules["safedma"], "_HOMES")
    for name, home in homes.items():
        value = namespace.get(name)
        if home == module and isinstance(value, type):
            value.__module__ = "safedma"
