"""A sanitized ``pl.pallas_call``: the flags output added to the call, the body instrumented,
the flags checked after the call.

The flags are one more output, ``int32[16]`` in SMEM, after the caller's
outputs (so ``input_output_aliases`` keep their numbers); the caller gets its
own outputs back, in their own structure. The body the call traces takes the
flags ref out of its arguments, traces the caller's (checked) body to a jaxpr
and re-emits it instrumented (:mod:`._instrument`).
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._sanitize import _jax, _report
from safedma._sanitize._errors import SanitizerUnsupportedError
from safedma._sanitize._drain import BUFFER
from safedma._sanitize._flags import WORDS, Recorder
from safedma._sanitize._instrument import Instrumenter, KernelPlan, NamedRef
from safedma._sanitize._options import ENV_SWITCH, SanitizeOptions
from safedma._sanitize._units import Backend

__all__ = [
    "MARK",
    "SanitizedRun",
    "Watcher",
    "inside_sanitized_call",
    "requested_by_body",
    "sanitized_pallas_call",
    "unsanitized_entry",
    "watch_runs",
]

#: The attribute ``@sd.checked(sanitize=...)`` sets on the body it returns.
MARK = "__safedma_sanitize__"
_KERNEL_MARK = "__safedma_kernel__"


_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("safedma_sanitizing", default=False)


def inside_sanitized_call() -> bool:
    """Whether the body being traced is traced by a sanitized call (which instruments it)."""
    return _inside.get()


@dataclass(frozen=True)
class SanitizedRun:
    """One run of a sanitized call, handed to the :data:`Watcher` in place of running it.

    ``instrumented(*args, **kwargs)`` runs the instrumented kernel and returns the
    caller's outputs then the flags; ``check`` takes those and returns the caller's
    outputs (raising the sanitizer's error for a flagged mistake);
    ``unsanitized()`` builds the caller's own call, the one that runs with the
    sanitizer off.
    """

    instrumented: Callable[..., Any]
    check: Callable[[Any], Any]
    unsanitized: Callable[[], Callable[..., Any]]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


#: Runs a :class:`SanitizedRun` and returns what the call returns: safedma's
#: ``pytest --safedma-verify`` watches sanitized calls so that verify is given the
#: caller's kernel, not the instrumented one.
Watcher = Callable[[SanitizedRun], Any]
_watcher: Watcher | None = None


def watch_runs(watcher: Watcher | None) -> Watcher | None:
    """Hand every sanitized call's runs to ``watcher`` (None: run them directly);
    returns the watcher it replaces."""
    global _watcher
    before, _watcher = _watcher, watcher
    return before


def requested_by_body(body: object) -> SanitizeOptions | bool | None:
    """What ``@sd.checked(sanitize=...)`` put on ``body``: options, False (off), or None."""
    found = getattr(body, MARK, None)
    return found if isinstance(found, (SanitizeOptions, bool)) else None


def unsanitized_entry(entry: str, body: object, explicit: bool) -> None:
    """A sanitized body (or the environment switch) reached an entry point the sanitizer
    does not cover: an error when asked for explicitly, a warning for the environment."""
    message = (
        f"the sanitizer covers kernels run through safedma.pallas_call; {entry} adds no "
        "output the sanitizer could report through, so "
        f"{getattr(body, '__name__', 'this kernel')} runs unsanitized. Run it through "
        "sd.pallas_call(...) (it takes pl.pallas_call's arguments) to sanitize it"
    )
    if explicit:
        raise SanitizerUnsupportedError(message + ", or drop sanitize= from this body.")
    warnings.warn(f"{message} ({ENV_SWITCH} is set).", RuntimeWarning, stacklevel=3)


def _normalized(tree: object) -> object:
    return tuple(cast("list[object]", tree)) if isinstance(tree, list) else tree


def _user_specs(out_shape: object, specs: object) -> object:
    """The caller's ``out_specs`` as jax would read them; ``pl.BlockSpec()`` per output
    where none were given (jax's own default: the whole array, default memory space)."""
    if specs is None or type(specs).__name__ == "NoBlockSpec":
        return _jax.tree_map(_default_spec, out_shape)
    return _normalized(specs)


def _default_spec(_: object) -> object:
    return pl.BlockSpec()


def _grid_rank(grid: object) -> tuple[int | None, ...]:
    if grid is None:
        return ()
    if isinstance(grid, int):
        return (grid,)
    dims: list[int | None] = []
    for g in cast("Sequence[object]", grid):
        if isinstance(g, tuple):  # a named grid dimension: (name, size)
            g = cast("tuple[object, object]", g)[1]
        dims.append(g if isinstance(g, int) else None)
    return tuple(dims)


def sanitized_pallas_call(
    checked_body: Callable[..., None],
    user_body: Callable[..., None],
    out_shape: object,
    options: Mapping[str, Any],
    sanitize: SanitizeOptions,
    scratch_positional: int,
) -> Callable[..., Any]:
    """``pl.pallas_call(checked_body, out_shape, **options)``, sanitized."""
    given = dict(options)
    user_out = _normalized(out_shape)
    flags_shape = jax.ShapeDtypeStruct((WORDS,), jnp.int32)
    flags_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    # The kernel receives each top-level output of a tuple as an argument of its own: the
    # flags join that tuple (a single output becomes the first of two).
    several = isinstance(user_out, tuple)
    outputs = (
        (*cast("tuple[object, ...]", user_out), flags_shape) if several else (user_out, flags_shape)
    )

    def with_flags(specs: object) -> object:
        mine = _user_specs(user_out, specs)
        return (*cast("tuple[object, ...]", mine), flags_spec) if several else (mine, flags_spec)

    grid_spec = given.get("grid_spec")
    if grid_spec is not None:
        spec = copy.copy(grid_spec)
        spec.out_specs = with_flags(getattr(grid_spec, "out_specs", None))
        spec.scratch_shapes = _with_drain_buffer(getattr(grid_spec, "scratch_shapes", None))
        given["grid_spec"] = spec
        grid = _grid_rank(getattr(grid_spec, "grid", ()))
    else:
        given["out_specs"] = with_flags(given.get("out_specs"))
        given["scratch_shapes"] = _with_drain_buffer(given.get("scratch_shapes"))
        grid = _grid_rank(given.get("grid"))
    traced: dict[str, Backend] = {}
    body = _sanitized_body(
        checked_body, user_body, sanitize, scratch_positional, grid, given.get("interpret"), traced
    )
    call = pl.pallas_call(body, out_shape=outputs, **given)

    def unsanitized() -> Callable[..., Any]:
        return pl.pallas_call(checked_body, out_shape=out_shape, **options)

    def run(*args: Any, **kwargs: Any) -> Any:
        watcher = _watcher
        if watcher is not None:
            return watcher(SanitizedRun(call, checked, unsanitized, args, kwargs))
        return checked(call(*args, **kwargs))

    def checked(outputs: Any) -> Any:
        *results, flags = outputs
        out = tuple(results) if several else results[0]
        if _jax.is_tracer(flags):
            if not _report.host_check_wanted():
                return out
            if traced.get("backend") is Backend.CHIP:
                _needs_cpu_platform()
            after: Any = ()
            if traced.get("backend") is Backend.TPU_INTERPRET:
                # In jax's TPU interpreter the devices of a call meet at a barrier after
                # their kernels; a callback that raised first on one device would leave
                # the others there forever. The interpreter's last callback is an ordered
                # io_callback after that barrier: an ordered one after it (which never
                # raises: a raising ordered callback poisons later ordered calls) gates
                # the one that raises.
                after = io_callback(_report.count_flagged, _STATUS, flags, ordered=True)
            jax.debug.callback(_report.report_in_callback, flags, after)
        else:
            _report.check_flags(flags)
        return out

    return run


_STATUS = jax.ShapeDtypeStruct((), jnp.int32)


def _needs_cpu_platform() -> None:
    """Under jit on a TPU the flags are checked in a host callback, which needs the CPU
    platform (jax places the callback's operands on a CPU device)."""
    configured: object = getattr(jax.config, "jax_platforms", None)
    platforms = str(configured or os.environ.get("JAX_PLATFORMS", "") or "")
    names = {p.strip() for p in platforms.split(",") if p.strip()}
    if names and "cpu" not in names:
        raise SanitizerUnsupportedError(
            f"a sanitized kernel under jax.jit reports its mistakes through a host callback, "
            f"which needs the CPU platform, and JAX_PLATFORMS={platforms!r} leaves it out: "
            "set JAX_PLATFORMS=tpu,cpu (or unset it), or call the kernel outside jax.jit."
        )


def _sanitized_body(
    checked_body: Callable[..., None],
    user_body: Callable[..., None],
    sanitize: SanitizeOptions,
    scratch_positional: int,
    grid: tuple[int | None, ...],
    interpret: object,
    traced: dict[str, Backend],
) -> Callable[..., None]:
    try:
        signature: inspect.Signature | None = inspect.signature(user_body)
    except (TypeError, ValueError):
        signature = None
    kernel_name = str(getattr(checked_body, "__name__", "kernel"))

    @functools.wraps(checked_body)
    def sanitized(*args: Any, **kwargs: Any) -> None:
        if _DRAIN_KEY in kwargs:
            kwargs = dict(kwargs)
            drain_buffer = kwargs.pop(_DRAIN_KEY)
        else:
            *rest, drain_buffer = args
            args = tuple(rest)
        at = len(args) - scratch_positional - 1
        flags = args[at]
        user_args = (*args[:at], *args[at + 1 :])
        backend = _jax.interpret_backend(interpret)
        traced["backend"] = backend
        if backend is Backend.TPU_INTERPRET:
            _jax.register_interpret_read()
        axes = _jax.axes_in_scope()
        plan = KernelPlan(
            kernel=kernel_name,
            backend=backend,
            options=sanitize,
            recorder=Recorder(flags, tuple(axes), len(grid)),
            axes=tuple(axes.items()),
            grid=grid,
            drain_buffer=drain_buffer,
        )
        leaves, tree = _jax.tree_flatten((user_args, kwargs))

        def body_of_leaves(*values: Any) -> None:
            positional, keywords = _jax.tree_unflatten(tree, list(values))
            checked_body(*positional, **keywords)

        token = _inside.set(True)
        try:
            jaxpr, consts = _jax.make_body_jaxpr(body_of_leaves, leaves)
        finally:
            _inside.reset(token)
        names = _leaf_names(signature, user_args, kwargs)
        scratch = _scratch_leaves(user_args, kwargs, scratch_positional)
        if backend is Backend.TPU_INTERPRET:
            _refuse_semaphore_operands(kernel_name, leaves, names, scratch)
        exits = [
            NamedRef(leaf, name or f"scratch semaphore {k}")
            for k, (leaf, name) in enumerate(zip(leaves, names))
            if k in scratch and _jax.semaphore_kind(getattr(leaf, "aval", None)) is not None
        ]
        Instrumenter(plan).kernel(jaxpr, consts, leaves, names, exits)

    # jax names the kernel after the function (as safedma.checked keeps it).
    sanitized.__name__ = kernel_name
    sanitized.__qualname__ = getattr(checked_body, "__qualname__", kernel_name)
    setattr(sanitized, _KERNEL_MARK, True)
    return sanitized


def _refuse_semaphore_operands(
    kernel: str, leaves: Sequence[Any], names: Sequence[str | None], scratch: set[int]
) -> None:
    """jax's TPU interpreter runs one kernel at a time, its semaphores living only while
    it runs: a semaphore taken or returned by a kernel (a DMA future, started in one
    ``pallas_call`` and waited in another) fails deep inside the interpreter, sanitized
    or not. Refuse it here, by name, instead."""
    for k, leaf in enumerate(leaves):
        if k in scratch or _jax.semaphore_kind(getattr(leaf, "aval", None)) is None:
            continue
        name = names[k] if k < len(names) and names[k] else f"operand {k}"
        raise SanitizerUnsupportedError(
            f"kernel {kernel} takes or returns the semaphore {name} (a DMA future: a copy "
            "started in one pallas_call and waited in another). jax's TPU interpreter runs "
            "one kernel at a time and cannot hand a semaphore from one to the next, with or "
            "without the sanitizer, so this program cannot be sanitized in interpret mode. "
            "Run it sanitized on a TPU, or check its protocol on the CPU with "
            "safedma.testing.verify, which follows futures across pallas_calls."
        )


#: The keyword the drain buffer takes when the caller's scratch is a mapping.
_DRAIN_KEY = "_safedma_sanitizer_drain_buffer"


def _with_drain_buffer(scratch: object) -> object:
    """The caller's scratch with the exit drain's SMEM buffer after it (last positional
    argument, or a keyword of its own when the scratch is a mapping)."""
    buffer = pltpu.SMEM(BUFFER, jnp.int32)
    if scratch is None:
        return (buffer,)
    if isinstance(scratch, Mapping):
        return {**cast("Mapping[str, object]", scratch), _DRAIN_KEY: buffer}
    return (*cast("Sequence[object]", scratch), buffer)


def _scratch_leaves(args: tuple[Any, ...], kwargs: Mapping[str, Any], scratch: int) -> set[int]:
    """Positions (in the flat leaves of ``(args, kwargs)``) of the kernel's scratch."""
    operands = len(args) - scratch
    found: set[int] = set()
    position = 0
    for k, arg in enumerate(args):
        count = len(jax.tree_util.tree_leaves(arg))
        if k >= operands:
            found.update(range(position, position + count))
        position += count
    total = len(jax.tree_util.tree_leaves((args, dict(kwargs))))
    found.update(range(position, total))
    return found


def _leaf_names(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[str | None]:
    """The name of each flat leaf of ``(args, kwargs)``: its parameter, with the path
    inside a pytree parameter (``sems.sync``, ``bufs[1]``), as safedma's checks name refs."""
    params: list[inspect.Parameter] = list(signature.parameters.values()) if signature else []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    names: list[str | None] = []
    for k, arg in enumerate(args):
        if k < len(positional):
            base: str | None = positional[k].name
        elif star is not None:
            base = f"{star}[{k - len(positional)}]"
        else:
            base = None
        names += _paths(base, arg)
    for key in sorted(kwargs):  # jax flattens a dict in key order
        names += _paths(str(key), kwargs[key])
    return names


def _paths(base: str | None, value: object) -> list[str | None]:
    flat = cast(
        "list[tuple[tuple[object, ...], object]]",
        jax.tree_util.tree_flatten_with_path(value)[0],  # pyright: ignore[reportUnknownMemberType]
    )
    if base is None:
        return [None] * len(flat)
    return [base + "".join(map(str, path)) for path, _ in flat]
