"""verify's ``lockstep`` keyword: which path runs, the environment variable as its default.

The keyword is read by ``verify`` itself and handed down; ``SAFEDMA_VERIFY_LOCKSTEP``
only fills in a keyword left at None (the suite sets it to "check" in
tests/conftest.py). A per-device walk is counted by wrapping ``face.api._walk``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import safedma.kernels as sk
from safedma.testing import abstract_mesh, verify
from safedma.testing._verify.face import api as _api

VARIABLE = "SAFEDMA_VERIFY_LOCKSTEP"


def _all_gather(**kwargs: Any) -> Any:
    x = jax.ShapeDtypeStruct((4 * 16, 128), jnp.float32)
    fn = functools.partial(sk.all_gather, axis="x")
    mesh = abstract_mesh((4,), ("x",))
    return verify(fn, x, mesh=mesh, in_specs=P("x"), out_specs=P("x"), **kwargs)


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The per-device walks of each verify call (one entry per walk)."""
    seen: list[int] = []
    walk = _api._walk

    def counted(*args: Any) -> None:
        seen.append(1)
        walk(*args)

    monkeypatch.setattr(_api, "_walk", counted)
    return seen


def test_the_keyword_chooses_the_path_whatever_the_variable_says(
    walks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, "off")
    proved = _all_gather(lockstep="on")
    assert walks == [] and _api._LAST_LOCKSTEP[0] == ""
    monkeypatch.setenv(VARIABLE, "on")
    walked = _all_gather(lockstep="off")
    assert walks == [1]
    assert _api._LAST_LOCKSTEP[0] == "not tried (no shard_map, or lockstep='off')"
    checked = _all_gather(lockstep="check")
    assert walks == [1, 1] and _api._LAST_LOCKSTEP[0] == ""
    assert proved == walked == checked


@pytest.mark.parametrize(("value", "walked"), [("off", 1), ("on", 0), ("check", 1), ("", 0)])
def test_the_variable_is_the_default_of_a_keyword_left_at_none(
    value: str, walked: int, walks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, value)  # "": unset in effect, so "on"
    _all_gather()
    assert len(walks) == walked


def _never_traced(x: jax.Array) -> jax.Array:
    raise AssertionError("verify traced fn before checking its keywords")


def test_a_bad_keyword_is_refused_before_tracing_naming_the_keyword_and_the_modes() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    bad: Any = "fast"
    with pytest.raises(
        ValueError,
        match=r"^verify's lockstep keyword must be 'on', 'off' or 'check', or None for the "
        r"environment variable SAFEDMA_VERIFY_LOCKSTEP's mode, not 'fast'$",
    ):
        verify(_never_traced, x, lockstep=bad)


def test_a_bad_variable_is_refused_naming_the_variable_and_the_modes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(VARIABLE, "fast")
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    with pytest.raises(
        ValueError,
        match=r"^the environment variable SAFEDMA_VERIFY_LOCKSTEP \(verify's default lockstep "
        r"mode\) must be 'on', 'off' or 'check', or unset, not 'fast'$",
    ):
        verify(_never_traced, x)
    # a keyword given is all verify reads: the variable's value does not matter then
    with pytest.raises(AssertionError, match="traced fn"):
        verify(_never_traced, x, lockstep="off")


def test_only_the_public_function_reads_the_environment() -> None:
    """The mode is a parameter below ``verify``: no other module of verify (or of its
    lockstep path) reads the process environment."""
    root = Path(_api.__file__).resolve().parents[1]
    readers: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "os.environ" in text or "getenv" in text or VARIABLE in text:
            readers.append(str(path.relative_to(root)))
    assert readers == ["face/api.py"]
