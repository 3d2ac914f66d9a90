"""The value ranges of semaphore index expressions (safedma/_slot_ranges.py), read from
jaxprs: each range covers every value the expression takes (across loop iterations
too), and is as narrow as the rules in the module's docstring allow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from safedma._slot_ranges import Index, Ranges, Scope, Span, flat_positions, index_of


def _operands(eqn: Any) -> list[object]:
    return list(eqn.invars)


def _span_of(fn: Callable[..., Any], *args: Any) -> Span:
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return Ranges().span(jaxpr.outvars[0], Scope(jaxpr.eqns, _operands))


def _bounded(lo: int, hi: int) -> Callable[[Any], Any]:
    """An integer known only to lie in [lo, hi] (a clamp of an unknown input)."""
    return lambda x: jax.lax.clamp(jnp.int32(lo), x, jnp.int32(hi))


ZERO = jnp.int32(0)
INT32: Span = (-(2**31), 2**31 - 1)
"""Unknown: any int32."""
within = _bounded(0, 9)


@pytest.mark.parametrize(
    ("fn", "span"),
    [
        (lambda x: within(x) % 2, (0, 1)),
        (lambda x: x % 2, (0, 1)),  # jnp's % is floor-mod: never negative for n > 0
        (lambda x: x % 3 + 1, (1, 3)),
        (lambda x: (x + 1) % 4, (0, 3)),
        (lambda x: 1 - within(x) % 2, (0, 1)),
        (lambda x: jax.lax.rem(within(x), 3), (0, 2)),
        (lambda x: jnp.clip(x, 1, 1) % 2, (1, 1)),
        (lambda x: jax.lax.rem(jnp.clip(x, -3, -2), 4), (-3, -2)),
        (lambda x: jax.lax.rem(jnp.clip(x, -3, 2), 4), (-3, 2)),
        (lambda x: jax.lax.rem(jnp.clip(x, -3, 9), 4), (-3, 3)),
        (lambda x: jax.lax.rem(x, 3), (-2, 2)),  # follows the dividend's sign
        (lambda x: jax.lax.rem(within(x) - 9, 4), (-3, 0)),
        (lambda x: jnp.bitwise_and(x, 3), (0, 3)),
        (lambda x: within(x) * 2 + 1, (1, 19)),
        (lambda x: jnp.minimum(within(x), 4), (0, 4)),
        (lambda x: jnp.maximum(within(x), 4), (4, 9)),
        (lambda x: jnp.clip(x, 2, 5), (2, 5)),
        (lambda x: jnp.where(x > 0, 1, 3), (1, 3)),
        (lambda x: jnp.where(x > 0, x % 2, 2), (0, 2)),
        (lambda x: (lambda y: jax.lax.select(y < 5, y, 5 + 0 * x))(within(x)), (0, 5)),
        (lambda x: jnp.where(x < 0, 0, x), (0, 2**31 - 1)),
        (lambda x: jnp.int32(7) - 3, (4, 4)),
        (lambda x: within(x) // 2, None),  # floor division: not followed here
        (lambda x: jnp.right_shift(within(x), 1), INT32),
        (lambda x: x * x, INT32),
    ],
)
def test_the_range_of_an_index_expression(fn: Callable[[Any], Any], span: Span | None) -> None:
    found = _span_of(fn, ZERO)
    if span is None:  # only sound: holds every value
        assert (found[0] is None or found[0] <= 0) and (found[1] is None or found[1] >= 4)
    else:
        assert found == span


def test_a_value_that_may_wrap_is_its_types_range() -> None:
    assert _span_of(lambda x: within(x) * 2**30, ZERO) == (-(2**31), 2**31 - 1)


def _body_spans(fn: Callable[[Any], Any]) -> list[Span]:
    """The spans of the inputs of the body of the one loop in ``fn``'s jaxpr."""
    jaxpr = jax.make_jaxpr(fn)(ZERO).jaxpr
    ranges, scope = Ranges(), Scope(jaxpr.eqns, _operands)
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name in ("scan", "while")]
    name = "jaxpr" if loop.primitive.name == "scan" else "body_jaxpr"
    body = loop.params[name].jaxpr
    inner = ranges.enter(loop, scope, body)
    return [ranges.span(v, inner) for v in body.invars]


def test_a_static_fori_loop_index_is_within_its_bounds() -> None:
    spans = _body_spans(lambda x: jax.lax.fori_loop(2, 6, lambda i, c: c + i, x))
    assert spans == [(2, 5), INT32]  # the index, then the sum carried


def test_a_dynamic_fori_loop_index_is_below_its_bound() -> None:
    def fn(x: Any) -> Any:
        stop = jnp.minimum(x, 100)  # at most 100: a while loop, the index at most 99
        return jax.lax.fori_loop(jnp.maximum(x, 1), stop, lambda i, c: c + i, x)

    spans = _body_spans(fn)
    assert (1, 99) in spans
    assert (None, None) not in spans


def test_a_loop_carry_that_is_not_an_index_is_unknown() -> None:
    jaxpr = jax.make_jaxpr(lambda: jax.lax.fori_loop(0, 4, lambda i, s: 1 - s, jnp.int32(0)))()
    loop = jaxpr.jaxpr.eqns[-1]
    body = loop.params["jaxpr"].jaxpr
    ranges, scope = Ranges(), Scope(jaxpr.jaxpr.eqns, _operands)
    inner = ranges.enter(loop, scope, body)
    carried = body.invars[-1]
    assert ranges.span(carried, inner) == (-(2**31), 2**31 - 1)


def test_identical_expressions_are_one_slot() -> None:
    def fn(x: Any) -> Any:
        return x * x % 7 * 0 + x * x, x * x + 0

    jaxpr = jax.make_jaxpr(fn)(ZERO).jaxpr
    ranges, scope = Ranges(), Scope(jaxpr.eqns, _operands)
    mul = [e for e in jaxpr.eqns if e.primitive.name == "mul"]
    first, second = mul[0].outvars[0], mul[-1].outvars[0]
    assert first is not second
    assert ranges.key(first, scope) == ranges.key(second, scope)
    assert ranges.key(first, scope) != ranges.key(jaxpr.invars[0], scope)


def test_an_index_outside_its_dimension_is_the_whole_dimension() -> None:
    assert index_of(0, 3, (0, 1)) == Index(0, 1)
    assert index_of(0, 3, (-1, 1)) == Index(0, 2)
    assert index_of(0, 3, (0, 3)) == Index(0, 2)
    assert index_of(0, 3, (-1, -1), literal=True) == Index(2, 2, ("const", 2))
    assert not Index(0, 1).meets(Index(2, 2))
    assert Index(0, 1).meets(Index(1, 2))


def test_flat_positions_of_a_two_dimensional_view() -> None:
    assert flat_positions([Index(0, 1), Index(2, 2)], (2, 3)) == frozenset({2, 5})
    assert flat_positions([Index(0, 999), Index(0, 999)], (1000, 1000)) is None


def test_without_bounds_a_loop_index_is_unknown() -> None:
    jaxpr = jax.make_jaxpr(lambda x: jax.lax.fori_loop(0, 1, lambda i, c: c + (i + 1) % 2, x))(
        ZERO
    ).jaxpr
    loop = jaxpr.eqns[-1]
    body = loop.params["jaxpr"].jaxpr
    spans, index = {}, {}
    for bounds in (True, False):
        ranges = Ranges(bounds=bounds)
        inner = ranges.enter(loop, Scope(jaxpr.eqns, _operands), body)
        index[bounds] = ranges.span(body.invars[0], inner)
        spans[bounds] = [ranges.span(e.outvars[0], inner) for e in body.eqns if e.outvars]
    assert index == {True: (0, 0), False: INT32}
    assert spans[True].count((1, 1)) >= 2  # i + 1, (i + 1) % 2
    assert (0, 1) in spans[False]  # (i + 1) % 2 of any i


def test_axis_index_is_within_the_axis_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The size is read where the body is traced (the named axes in scope); program_id's
    from the grid being traced is pinned in test_computed_semaphore_slots.py."""
    from safedma import _compat

    jaxpr = jax.make_jaxpr(lambda x: jax.lax.axis_index("x") % 8, axis_env=[("x", 4)])(ZERO)
    scope = Scope(jaxpr.jaxpr.eqns, _operands)
    assert Ranges().span(jaxpr.jaxpr.outvars[0], scope) == (0, 7)  # no axis in scope: % 8
    monkeypatch.setattr(_compat, "axes_in_scope", lambda: {"x": 4})
    assert Ranges().span(jaxpr.jaxpr.outvars[0], scope) == (0, 3)


def test_shared_subexpressions_are_read_once() -> None:
    """40 doublings share each operand: read once each (not 2**40 times), the wrapped
    value is any int32, and its floor-mod still 0 or 1."""

    def fn(x: Any) -> Any:
        for _ in range(40):
            x = x + x
        return x % 2

    jaxpr = jax.make_jaxpr(fn)(ZERO).jaxpr
    ranges, scope = Ranges(), Scope(jaxpr.eqns, _operands)
    assert ranges.span(jaxpr.outvars[0], scope) == (0, 1)
    assert ranges.key(jaxpr.outvars[0], scope) == ranges.key(jaxpr.outvars[0], scope)
