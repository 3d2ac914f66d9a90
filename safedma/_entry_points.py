"""The kernel scope: where safedma checks what a body leaves in flight.

:func:`kernel` wraps a kernel body so that, each time it is traced, safedma
knows its parameter names (for error messages) and checks, when the body
returns, that every started copy was waited (T7). :func:`pallas_call` is
``pl.pallas_call`` with that wrapper applied and with the compiler parameters
made visible to the body, so that using the barrier semaphore without a
``collective_id`` fails at trace time (T9).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, cast, overload

import jax
from jax.experimental import pallas as pl

from safedma._ledger import ledger_scope
from safedma._scope import KernelConfig, kernel_config, kernel_scope

__all__ = ["checked", "pallas_call"]

P = ParamSpec("P")
_MARK = "__safedma_kernel__"


def _named_arguments(signature: inspect.Signature | None, args: tuple[object, ...],
                     kwargs: Mapping[str, object]) -> dict[str, object]:
    if signature is None:
        return {f"arg{i}": a for i, a in enumerate(args)}
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError:
        return {f"arg{i}": a for i, a in enumerate(args)}
    named: dict[str, object] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL and isinstance(value, tuple):
            positional = cast("tuple[object, ...]", value)
            named.update({f"{name}[{i}]": v for i, v in enumerate(positional)})
        elif kind is inspect.Parameter.VAR_KEYWORD and isinstance(value, dict):
            keywords = cast("dict[object, object]", value)
            named.update({str(k): v for k, v in keywords.items()})
        else:
            named[name] = value
    return named


def checked(body: Callable[P, None]) -> Callable[P, None]:
    """Check, each time ``body`` is traced, that it leaves no copy in flight.

    Use it on kernels passed to ``pl.pallas_call``; :func:`pallas_call`
    applies it for you.
    """
    if getattr(body, _MARK, False):
        return body
    try:
        signature: inspect.Signature | None = inspect.signature(body)
    except (TypeError, ValueError):
        signature = None
    name = _body_name(body)

    @functools.wraps(body)
    def traced(*args: P.args, **kwargs: P.kwargs) -> None:
        with kernel_scope(name, _named_arguments(signature, args, kwargs)), \
                ledger_scope() as ledger:
            body(*args, **kwargs)
            ledger.check_all_waited(name)

    # jax names a kernel after its function, looking through functools.partial;
    # a partial has no __name__ for wraps() to copy, so give the wrapper the
    # name jax would have used (the same Mosaic module as pl.pallas_call(partial)).
    traced.__name__ = name
    traced.__qualname__ = getattr(_unwrap_partial(body), "__qualname__", name)
    setattr(traced, _MARK, True)
    return traced


def _unwrap_partial(body: object) -> object:
    while isinstance(body, functools.partial):
        body = cast("functools.partial[object]", body).func
    return body


def _body_name(body: object) -> str:
    """The name jax gives the kernel: the function's, looking through partials."""
    name = getattr(body, "__name__", None)
    if isinstance(name, str):
        return name
    inner = _unwrap_partial(body)
    name = getattr(inner, "__name__", None)
    return name if isinstance(name, str) else type(inner).__name__


class _Unset:
    """Marks a pallas_call option the caller did not give (so jax's default applies)."""


_UNSET: Any = _Unset()


@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: jax.ShapeDtypeStruct,
    *,
    grid_spec: object = ...,
    grid: int | tuple[int, ...] = ...,
    in_specs: object = ...,
    out_specs: object = ...,
    scratch_shapes: Sequence[object] = ...,
    input_output_aliases: Mapping[int, int] = ...,
    compiler_params: object = ...,
    interpret: object = ...,
    name: str | None = ...,
    cost_estimate: object = ...,
) -> Callable[..., jax.Array]: ...
@overload
def pallas_call(
    body: Callable[..., None],
    out_shape: tuple[jax.ShapeDtypeStruct, ...] | list[jax.ShapeDtypeStruct],
    *,
    grid_spec: object = ...,
    grid: int | tuple[int, ...] = ...,
    in_specs: object = ...,
    out_specs: object = ...,
    scratch_shapes: Sequence[object] = ...,
    input_output_aliases: Mapping[int, int] = ...,
    compiler_params: object = ...,
    interpret: object = ...,
    name: str | None = ...,
    cost_estimate: object = ...,
) -> Callable[..., tuple[jax.Array, ...]]: ...
def pallas_call(
    body: Callable[..., None],
    out_shape: object,
    *,
    grid_spec: object = _UNSET,
    grid: int | tuple[int, ...] = _UNSET,
    in_specs: object = _UNSET,
    out_specs: object = _UNSET,
    scratch_shapes: Sequence[object] = _UNSET,
    input_output_aliases: Mapping[int, int] = _UNSET,
    compiler_params: object = _UNSET,
    interpret: object = _UNSET,
    name: str | None = _UNSET,
    cost_estimate: object = _UNSET,
) -> Callable[..., Any]:
    """``pl.pallas_call`` with safedma's kernel-scope checks.

    Takes the same arguments; only those given are passed on, so jax's own
    defaults apply to the rest. The result is called like pl.pallas_call's.
    """
    given: dict[str, Any] = {
        key: value
        for key, value in {
            "grid_spec": grid_spec,
            "grid": grid,
            "in_specs": in_specs,
            "out_specs": out_specs,
            "scratch_shapes": scratch_shapes,
            "input_output_aliases": input_output_aliases,
            "compiler_params": compiler_params,
            "interpret": interpret,
            "name": name,
            "cost_estimate": cost_estimate,
        }.items()
        if value is not _UNSET
    }
    config = KernelConfig(collective_id=getattr(compiler_params, "collective_id", None))
    call = pl.pallas_call(checked(body), out_shape=out_shape, **given)

    @functools.wraps(call)
    def run(*args: object) -> Any:
        with kernel_config(config):
            return call(*args)

    return run
