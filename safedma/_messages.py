"""Sentences the mypy plugin and the run-time checks both say, written once.

An operation a copy or handle does not have (``wait_send()`` on a local handle,
``wait()`` on a copy description, ...) is an error under mypy, where the plugin
words it, and in unchecked code at run time, where ``WrongOperationError`` does;
the user reads the same sentence either way. This module must stay free of jax
and of the rest of safedma: mypy imports it into its own process.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MISSING_OPERATIONS", "missing_operation"]

_WAIT_A_DESCRIPTION = (
    "a copy description cannot be waited. Wait the handle that start() returns, or, for a "
    "copy started in an earlier iteration or by another device, started_elsewhere()"
)
_LOCAL_ONLY = "a local copy has no send or receive side; call wait()"
_RECEIVER = "the receiving side only has wait_recv(); the send side is waited by the sender"

# Class name -> operation it lacks -> what to do instead.
MISSING_OPERATIONS: Mapping[str, Mapping[str, str]] = {
    "LocalHandle": {
        name: _LOCAL_ONLY for name in ("wait_send", "wait_recv", "wait_read", "wait_write")
    },
    "LocalCopy": {
        **{name: _WAIT_A_DESCRIPTION for name in ("wait", "wait_send", "wait_recv")},
        "to": "a LocalCopy stays on this device; for a copy to another device use RemoteCopy",
        "with_send_sem": (
            "a LocalCopy has one semaphore; for a copy to another device use RemoteCopy"
        ),
    },
    "RemoteCopy": {
        name: _WAIT_A_DESCRIPTION + " (or incoming() on the receiving side)"
        for name in ("wait", "wait_send", "wait_recv")
    },
    "IncomingHandle": {name: _RECEIVER for name in ("wait", "wait_send")},
}


def missing_operation(class_name: str, name: str) -> str:
    """``"LocalHandle has no wait_send(): <what to do>"``."""
    return f"{class_name} has no {name}(): {MISSING_OPERATIONS[class_name][name]}"
