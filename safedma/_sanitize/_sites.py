"""The checks the sanitizer put into kernels: what each one knows at trace time.

Each check the instrumenter emits gets a process-wide id (a *site*), written
to the flags when it fires. The site keeps what only the trace knows (the
kernel, the user's frames, the semaphore's or buffer's name and shape, the
amount a wait needs); the flags bring the run-time values. Ids are never
reused, so a kernel traced once and run many times (jit caching) decodes
through the same sites.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Mapping
from typing import Any

from safedma._sanitize._units import Backend

__all__ = ["Site", "lookup", "register", "registered"]


@dataclasses.dataclass(frozen=True)
class Site:
    """One check in one traced kernel.

    ``code``: the flag code it records (``_flags.DEADLOCK`` ...); ``operation``:
    what the user's line does ("DMA wait", "copy start", "semaphore signal" ...);
    ``name``: the kernel parameter (or ``run_scoped`` allocation) it concerns;
    ``shape``: that ref's shape; ``frames``: the traceback of the user's line,
    innermost first, with the frames of the enclosing blocks; ``detail``: the
    check's own static facts (a dimension, a needed amount, the index names).
    """

    code: int
    kernel: str
    operation: str
    name: str
    shape: tuple[int, ...]
    frames: tuple[Any, ...]
    backend: Backend
    axes: tuple[tuple[str, int], ...]
    grid: tuple[int | None, ...]
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict[str, Any])


_lock = threading.Lock()
_ids = itertools.count(1)
_sites: dict[int, Site] = {}


def register(site: Site) -> int:
    """Keep ``site`` for decoding and return its id (an int32)."""
    with _lock:
        ident = next(_ids)
        if ident >= 2**31:
            raise OverflowError("the sanitizer ran out of check ids (2**31 per process)")
        _sites[ident] = site
    return ident


def lookup(ident: int) -> Site | None:
    """The site with id ``ident``, if this process registered it."""
    with _lock:
        return _sites.get(ident)


def registered() -> int:
    """How many checks this process has put into kernels (a test's proof that a kernel
    was instrumented at all)."""
    with _lock:
        return len(_sites)
