"""Former home of the kernel-scope bookkeeping, now split by job.

* :mod:`safedma._scope`: which kernel is traced (parameter names, compiler config);
* :mod:`safedma._ledger`: started copies and their waits, and the checks on them;
* :mod:`safedma._describe`: source lines and descriptions for messages.

These re-exports keep modules written against the old layout importing
(``safedma._devices`` uses ``describe_value``); new code imports from the
modules above.
"""

from safedma._describe import SourceLine, call_site, describe_ref, describe_value
from safedma._ledger import HandleState, Side
from safedma._scope import (
    KernelConfig,
    KernelScope,
    current_config,
    current_scope,
    kernel_config,
    kernel_scope,
)

__all__ = [
    "HandleState",
    "KernelConfig",
    "KernelScope",
    "Side",
    "SourceLine",
    "call_site",
    "current_config",
    "current_scope",
    "describe_ref",
    "describe_value",
    "kernel_config",
    "kernel_scope",
]
