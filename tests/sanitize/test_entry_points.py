"""How the sanitizer is turned on and off, and what it refuses to pretend it covers."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma._sanitize import _sites
from safedma.testing import DeadlockError, LeftoverSemaphoreError
from tests.sanitize.helpers import F32, HBM, example, interpret

X = (8, 128)


def hangs(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_wait(reg, 1)


def leaks(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_signal(reg, 1)


def _call(kernel: Any, **options: Any) -> Any:
    return sd.pallas_call(
        kernel,
        jax.ShapeDtypeStruct(X, F32),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        interpret=interpret(),
        **options,
    )


@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")  # `leaks`, on purpose
def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAFEDMA_SANITIZE", raising=False)
    before = _sites.registered()
    _call(leaks)(example(X))  # jax prints the leftover; nothing is instrumented
    assert _sites.registered() == before


def test_the_environment_switch_turns_it_on_and_sets_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    monkeypatch.setenv("SAFEDMA_SANITIZE_HANG_S", "0.05")  # 50 polls in interpret mode
    with pytest.raises(DeadlockError, match=r"after 50 polls"):
        _call(hangs)(example(X))


@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")  # `leaks`, on purpose
def test_an_explicit_false_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    before = _sites.registered()
    _call(leaks, sanitize=False)(example(X))
    assert _sites.registered() == before


def test_a_bad_hang_bound_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    monkeypatch.setenv("SAFEDMA_SANITIZE_HANG_S", "soon")
    with pytest.raises(ValueError, match="SAFEDMA_SANITIZE_HANG_S='soon'"):
        _call(leaks)(example(X))


def test_checked_with_sanitize_marks_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAFEDMA_SANITIZE", raising=False)
    body = sd.checked(sanitize=sd.SanitizeOptions(polls=20))(hangs)
    with pytest.raises(DeadlockError, match=r"after 20 polls"):
        _call(body)(example(X))


@pytest.mark.safedma_verify_expected("LeftoverSemaphoreError")  # `leaks`, on purpose
def test_checked_with_sanitize_false_opts_a_body_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    body = sd.checked(sanitize=False)(leaks)
    before = _sites.registered()
    _call(body)(example(X))
    assert _sites.registered() == before


# The body only exercises a semaphore: it never writes its output (R6 under verify).
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_plain_checked_still_works() -> None:
    @sd.checked
    def body(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
        pl.semaphore_signal(reg, 1)
        pl.semaphore_wait(reg, 1)

    _call(body)(example(X))


def test_a_sanitized_body_under_plain_pallas_call_is_refused() -> None:
    body = sd.checked(sanitize=True)(leaks)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(X, F32),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        interpret=interpret(),
    )
    with pytest.raises(sd.SanitizerUnsupportedError, match=r"sd.pallas_call\(\.\.\.\)"):
        call(example(X))


# The body only exercises a semaphore: it never writes its output (R6 under verify).
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_the_switch_warns_where_it_cannot_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")

    @sd.checked
    def body(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
        pl.semaphore_signal(reg, 1)
        pl.semaphore_wait(reg, 1)

    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(X, F32),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.REGULAR],
        interpret=interpret(),
    )
    with pytest.warns(RuntimeWarning, match="runs unsanitized"):
        call(example(X))


def test_verify_sees_the_kernel_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify cannot bound the sanitizer's spin loops; the switch leaves its traces alone."""
    from safedma.testing import verify

    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")

    def body(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        copy.start()
        copy.wait()

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(X, F32),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        verify(fn, jax.ShapeDtypeStruct(X, F32))


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_options_are_checked(bad: float) -> None:
    with pytest.raises(ValueError, match="hang_after_s"):
        sd.SanitizeOptions(hang_after_s=bad)
    with pytest.raises(ValueError, match="polls"):
        sd.SanitizeOptions(polls=0)


def test_the_bound_in_polls_follows_the_measured_poll_cost() -> None:
    options = sd.SanitizeOptions(hang_after_s=1.2)
    assert options.spin_polls(interpreted=False) == 100_000_000  # 12 ns a poll on the chip
    assert options.spin_polls(interpreted=True) == 1200  # at most 1 ms a poll interpreted
    assert sd.SanitizeOptions().spin_polls(interpreted=False) < 2**31
    assert sd.SanitizeOptions(hang_after_s=100).spin_polls(interpreted=False) == 2**31 - 1


def test_a_leftover_error_is_one_of_simulates_classes() -> None:
    with pytest.raises(LeftoverSemaphoreError) as caught:
        _call(leaks, sanitize=True)(example(X))
    assert caught.value.leftovers[0].kind == "REGULAR"
    assert caught.value.leftovers[0].count == 1
