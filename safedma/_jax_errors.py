"""jax errors that safedma's own API can provoke, rewritten to say what to do.

``handle.wait()`` gives back the buffer it protected. A branch of
``pl.when`` / ``lax.cond`` written as ``lambda: handle.wait()`` therefore
returns a ref, and jax refuses with "Cannot return `Ref`s from `cond`",
naming neither the wait nor the fix. The kernel scope passes such errors
through :func:`rewrite` on their way out of the body.
"""

from __future__ import annotations

import os
import traceback

from safedma._describe import is_library_file
from safedma._errors import BranchReturnedRefError

__all__ = ["rewrite"]

_REF_FROM_BRANCH = "Cannot return `Ref`s from"
_JAX_DIR = os.sep + "jax" + os.sep


def _user_line(error: BaseException) -> str | None:
    """The innermost traceback line in neither jax nor safedma's library: the user's call."""
    found: str | None = None
    for frame in traceback.extract_tb(error.__traceback__):
        if _JAX_DIR in os.path.abspath(frame.filename) or is_library_file(frame.filename):
            continue
        found = f"{frame.filename}:{frame.lineno}"
    return found


def rewrite(error: Exception) -> Exception | None:
    """A safedma error to raise instead of ``error``, or None to let it through."""
    if not isinstance(error, ValueError) or _REF_FROM_BRANCH not in str(error):
        return None
    where = _user_line(error)
    at = f" at {where}" if where else ""
    return BranchReturnedRefError(
        f"a pl.when / lax.cond branch{at} returned a ref, which jax's cond cannot return. "
        "safedma's waits give back the buffer they protected (handle.wait() returns the "
        "destination), so `lambda: handle.wait()` returns a ref. Make the branch return "
        "nothing: pass the wait itself, `pl.when(c)(handle.wait)`, or write a def:\n"
        "    @pl.when(c)\n"
        "    def _():\n"
        "        handle.wait()"
    )
