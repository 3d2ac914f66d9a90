"""Which runs happen inside a ``simulate`` call, and whether that call failed.

A test that calls ``simulate`` receives simulate's own error (or the interrupt)
for a run that failed, and a test of a deliberately broken kernel expects it:
verify's verdict on that run would be no news to the test. ``simulate`` runs
its program on a worker thread, so the scope is the call, not the thread:
simulations run one at a time per process (``simulate`` holds a lock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from safedma.testing import _simulate

__all__ = ["watch_simulations"]

Scope = Callable[[], object]  # opens a scope; the token is handed back at its end
Close = Callable[[object, "BaseException | None"], None]


def watch_simulations(open_scope: Scope, close_scope: Close) -> Callable[[], None]:
    """Call ``open_scope()`` as each ``simulate`` starts and ``close_scope(token,
    error)`` as it ends (``error``: what it raised, or None); returns the function
    that stops watching."""
    # simulate() calls run_simulation through its module's global name
    original: Callable[..., Any] = getattr(_simulate, "run_simulation")

    def run_simulation(*args: Any, **kwargs: Any) -> Any:
        token = open_scope()
        error: BaseException | None = None
        try:
            return original(*args, **kwargs)
        except BaseException as err:
            error = err
            raise
        finally:
            close_scope(token, error)

    setattr(_simulate, "run_simulation", run_simulation)

    def stop() -> None:
        setattr(_simulate, "run_simulation", original)

    return stop
