"""What the sanitizer itself raises at trace time (the mistakes it finds in kernels are the
classes of ``safedma.testing``, decoded after the call by :mod:`._report`)."""

from __future__ import annotations

from safedma._errors import SafeDmaError
from safedma._public import publish

__all__ = ["SanitizerUnsupportedError"]


class SanitizerUnsupportedError(SafeDmaError, NotImplementedError):
    """A kernel or entry point the sanitizer cannot instrument; the message says why and
    what to do (usually: pass ``sanitize=False`` for that kernel, or run it through
    ``safedma.pallas_call``)."""


publish(globals(), __name__)  # public classes print as safedma.X
