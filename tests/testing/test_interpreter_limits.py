"""Which run-time errors are jax's interpreter meeting a construct it lacks (simulate
says it cannot run the kernel) and which are the kernel's own failure."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax.numpy as jnp
import pytest

from safedma.testing import _uninterpretable

INTERPRETER_FILE = os.path.join(
    _uninterpretable._JAX_DIR, "_src", "pallas", "mosaic", "interpret", "stand_in.py"
)


def _raised(fn: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _through_the_interpreter(call: str) -> Callable[[], object]:
    """``call`` run from a function whose code says it is jax's interpreter's."""
    space: dict[str, object] = {"jnp": jnp}
    exec(compile(f"def run():\n    return {call}\n", INTERPRETER_FILE, "exec"), space)
    return space["run"]  # type: ignore[return-value]


def test_jax_code_the_interpreter_calls_failing_on_a_vector_index_is_a_limit() -> None:
    error = _raised(_through_the_interpreter("int(jnp.arange(2))"))
    assert isinstance(error, TypeError)
    assert _uninterpretable.raised_by_interpreter(error)


def test_the_same_failure_outside_the_interpreter_is_the_kernels() -> None:
    error = _raised(lambda: int(jnp.arange(2)))
    assert not _uninterpretable.raised_by_interpreter(error)


def test_an_index_error_the_interpreter_raises_is_the_kernels() -> None:
    error = _raised(_through_the_interpreter("jnp.zeros(2)[jnp.int32(5)].item() + [][1]"))
    assert isinstance(error, IndexError)
    assert not _uninterpretable.raised_by_interpreter(error)
