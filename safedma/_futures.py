"""DMA futures: a copy started by one ``pallas_call`` and waited by another.

The raw pattern (jax's TPU async tests, vLLM's KV transfer) returns the copy's
DMA semaphore and its in-flight destination as outputs of the start kernel
(``pltpu.SemaphoreType.DMA(())`` as an ``out_shape``, ``memory_space=
pltpu.SEMAPHORE``), aliases the source to an output so XLA keeps it alive and
unchanged, and passes all three to the done kernel, which waits and returns the
destination aliased. Seen per kernel, the start kernel leaves a copy in flight
and the done kernel waits a copy it never started: the kernel-scope checks
would reject both halves. :func:`start_async` and :func:`finish_async` build
exactly those two ``pallas_call`` s, tell each kernel scope about the hand-over,
and check what the trace can see instead:

* the start body must start at least one copy on the future's semaphore, and
  the done body must wait on it (``started_elsewhere()``, :func:`wait_bytes`);
* a future is finished once: a second :func:`finish_async` of the same future
  is a :class:`FutureConsumedTwiceError`;
* inside :func:`checked_futures`, a future neither finished nor handed on (as a
  loop carry, or returned) is a :class:`FutureDroppedError` when the function
  returns. A future rebuilt by jax (out of a loop carry) is not tracked again.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast, final

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._arguments import check_callable, check_instance, shown
from safedma._entry_points import pallas_call
from safedma._errors import FutureConsumedTwiceError, FutureDroppedError, FutureNotWaitedError
from safedma._describe import SourceLine, call_site, copies_of
from safedma._ledger import current_block, settle_semaphore, started_on, waited_on
from safedma._public import publish

__all__ = ["DmaFuture", "start_async", "finish_async", "checked_futures"]

P = ParamSpec("P")
R = TypeVar("R")

_ANY_SPEC = pl.BlockSpec(memory_space=pl.ANY)
_SEM_SPEC = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)


class _State:
    __slots__ = ("started_at", "name", "finishes", "handed_on")

    def __init__(self, started_at: SourceLine | None, name: str) -> None:
        self.started_at = started_at
        self.name = name
        # Every finish so far, with the block (jax trace) it is in: a finish in a branch
        # between two in one block must not hide the first of those two.
        self.finishes: list[tuple[SourceLine, object]] = []
        self.handed_on = False


_registry: contextvars.ContextVar[list[_State] | None] = contextvars.ContextVar(
    "safedma_futures", default=None
)


@final
class DmaFuture:
    """A copy in flight between two ``pallas_call`` s: finish it once with
    :func:`finish_async`.

    ``sources`` are the copy's inputs (kept alive by aliasing), ``buffer`` its
    destination (valid only after :func:`finish_async`), ``sem`` its DMA
    semaphore. A jax pytree, so it can be a loop carry or a jit output.
    """

    __slots__ = ("sources", "buffer", "sem", "_state", "_space")

    def __init__(
        self,
        sources: tuple[jax.Array, ...],
        buffer: jax.Array,
        sem: jax.Array,
        state: _State,
        space: Any = None,
    ) -> None:
        self.sources = sources
        self.buffer = buffer
        self.sem = sem
        self._state = state
        self._space = space  # the buffer's memory space (None: pl.ANY)

    def __repr__(self) -> str:
        where = f" started at {self._state.started_at}" if self._state.started_at else ""
        return f"DmaFuture({self._state.name}{where})"


def _flatten(future: DmaFuture) -> tuple[tuple[Any, ...], tuple[str, Any]]:
    state = future._state  # pyright: ignore[reportPrivateUsage]
    state.handed_on = True
    aux = (state.name, future._space)  # pyright: ignore[reportPrivateUsage]
    return (future.sources, future.buffer, future.sem), aux


def _unflatten(aux: tuple[str, Any], children: Sequence[Any]) -> DmaFuture:
    sources, buffer, sem = children
    name, space = aux
    return DmaFuture(tuple(sources), buffer, sem, _State(None, name), space)


jax.tree_util.register_pytree_node(DmaFuture, _flatten, _unflatten)  # pyright: ignore[reportUnknownMemberType]


def _body_name(body: Callable[..., None]) -> str:
    return str(getattr(body, "__name__", type(body).__name__))


def _defined_at(body: Callable[..., None]) -> str:
    """``file:line`` of the body's ``def`` (looking through partials), for error messages."""
    inner: object = inspect.unwrap(body)
    while isinstance(inner, functools.partial):
        inner = cast("functools.partial[None]", inner).func
    code = getattr(inner, "__code__", None)
    if code is None:
        return "an unknown place"
    return f"{code.co_filename}:{code.co_firstlineno}"


def _name_like(
    kernel: Callable[..., None], body: Callable[..., None], layout: Callable[[list[str]], list[str]]
) -> None:
    """Give the generated kernel ``body``'s name, and a signature whose parameter
    names are ``body``'s arranged as the kernel receives them (for error messages)."""
    name = _body_name(body)
    # setattr: a callable's __name__ is not part of its type (ty reports the assignment).
    setattr(kernel, "__name__", name)
    setattr(kernel, "__qualname__", str(getattr(body, "__qualname__", name)))
    try:
        names = list(inspect.signature(body).parameters)
    except (TypeError, ValueError):
        return
    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in layout(names)]
    setattr(kernel, "__signature__", inspect.Signature(params))


def start_async(
    body: Callable[..., None],
    *sources: jax.Array,
    dst: jax.ShapeDtypeStruct,
    dst_memory_space: Any = None,
    compiler_params: object = None,
    name: str | None = None,
) -> DmaFuture:
    """Run ``body(*source_refs, dst_ref, sem)`` as a kernel that starts a copy and
    returns it in flight.

    ``body`` starts one or more copies into ``dst_ref`` on ``sem`` and does
    not wait them. The ``pallas_call`` is the raw one: outputs ``(*sources
    aliased, dst, DMA semaphore)``, ``input_output_aliases={i: i}``, sources and
    ``dst`` in ``pl.ANY`` (``dst_memory_space=pltpu.VMEM`` puts ``dst`` in
    VMEM, TPU v5 and later).
    """
    check_callable(body, "body", "safedma.start_async()", _BODY_FIX)
    for k, source in enumerate(sources):
        if not _is_shaped(source):
            raise TypeError(
                f"safedma.start_async(): source {k} must be an array (the copy's input), got "
                f"{shown(source)}."
            )
    if not _is_shaped(dst):
        raise TypeError(
            "safedma.start_async(): dst must be a jax.ShapeDtypeStruct giving the copy's "
            f"destination shape and dtype, got {shown(dst)}. Pass "
            "dst=jax.ShapeDtypeStruct(shape, dtype)."
        )
    if dst_memory_space is not None and not callable(dst_memory_space):
        raise TypeError(
            "safedma.start_async(): dst_memory_space must be a memory space such as "
            f"pltpu.VMEM, or None for pl.ANY, got {shown(dst_memory_space)}."
        )
    n = len(sources)
    kernel_name = _body_name(body)
    here = call_site()

    def start_kernel(*refs: Any) -> None:
        ins, dst_ref, sem = refs[:n], refs[2 * n], refs[2 * n + 1]
        settle_semaphore(sem)
        body(*ins, dst_ref, sem)
        if not started_on(sem):
            raise FutureNotWaitedError(
                f"start kernel {kernel_name!r} started no copy on the future's semaphore "
                f"(kernel defined at {_defined_at(body)}, run by start_async at {here}): its "
                "done kernel would wait forever. Start the copy on the `sem` it is given."
            )

    _name_like(
        start_kernel,
        body,
        lambda names: [*names[:n], *(f"aliased_{m}" for m in names[:n]), *names[n:]],
    )
    if dst_memory_space is None:
        dst_shape: Any = dst
        dst_spec = _ANY_SPEC
    else:
        dst_shape = dst_memory_space(dst.shape, dst.dtype)
        dst_spec = pl.BlockSpec(memory_space=dst_memory_space)
    options: dict[str, Any] = {}
    if compiler_params is not None:
        options["compiler_params"] = compiler_params
    if name is not None:
        options["name"] = name
    out_shape = (
        *(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in sources),
        dst_shape,
        pltpu.SemaphoreType.DMA(()),
    )
    # Typed here: options held in a dict[str, Any] make pallas_call's overloads ambiguous.
    call: Callable[..., tuple[jax.Array, ...]] = pallas_call(
        start_kernel,
        cast("tuple[jax.ShapeDtypeStruct, ...]", out_shape),
        in_specs=[_ANY_SPEC] * n,
        out_specs=(*([_ANY_SPEC] * n), dst_spec, _SEM_SPEC),
        input_output_aliases={i: i for i in range(n)},
        **options,
    )
    outputs = call(*sources)
    state = _State(here, kernel_name)
    registry = _registry.get()
    if registry is not None:
        registry.append(state)
    return DmaFuture(tuple(outputs[:n]), outputs[n], outputs[n + 1], state, dst_memory_space)


def finish_async(
    body: Callable[..., None],
    future: DmaFuture,
    *,
    compiler_params: object = None,
    name: str | None = None,
) -> jax.Array:
    """Run ``body(*source_refs, buffer_ref, sem)`` as the kernel that waits the
    future's copy; return the finished buffer.

    ``body`` waits on ``sem`` (``LocalCopy(src, buf, sem).started_elsewhere()
    .wait()`` or ``safedma.wait_bytes(sem, buf)``). The ``pallas_call`` takes
    ``(*sources, buffer, sem)`` and aliases ``buffer`` to its one output.
    A future is finished once.
    """
    check_callable(body, "body", "safedma.finish_async()", _BODY_FIX)
    check_instance(
        future,
        "future",
        "safedma.finish_async()",
        DmaFuture,
        "the safedma.DmaFuture that safedma.start_async() returned",
    )
    state = future._state  # pyright: ignore[reportPrivateUsage]
    here = call_site()
    block = current_block()
    # Finishes in two branches of a lax.cond run one at a time: only a second finish in
    # the same straight-line block surely runs after the first (others: verify's).
    earlier = next((at for at, where in state.finishes if where is block), None)
    if earlier is not None:
        raise FutureConsumedTwiceError(
            f"{future!r} was finished at {earlier} and again at {here}: its copy "
            "is waited once, so the second done kernel would wait forever. Finish each "
            "future once (once in each branch of a lax.cond); start another copy for "
            "another result."
        )
    state.finishes.append((here, block))
    n = len(future.sources)
    kernel_name = _body_name(body)

    def done_kernel(*refs: Any) -> None:
        ins, buffer, sem = refs[:n], refs[n], refs[n + 1]
        settle_semaphore(sem)
        body(*ins, buffer, sem)
        if not waited_on(sem):
            raise FutureNotWaitedError(
                f"done kernel {kernel_name!r} never waited the future's semaphore (kernel "
                f"defined at {_defined_at(body)}, run by finish_async at {here}): its copy "
                "would still be in flight when the buffer is returned. Wait it with "
                "LocalCopy(src, buf, sem).started_elsewhere().wait() or "
                "safedma.wait_bytes(sem, buf)."
            )

    _name_like(done_kernel, body, lambda names: [*names, f"aliased_{names[n]}"])
    buffer_spec = _ANY_SPEC
    options: dict[str, Any] = {}
    if compiler_params is not None:
        options["compiler_params"] = compiler_params
    if name is not None:
        options["name"] = name
    space = future._space  # pyright: ignore[reportPrivateUsage]
    out_shape: Any = jax.ShapeDtypeStruct(future.buffer.shape, future.buffer.dtype)
    if space is not None:
        buffer_spec = pl.BlockSpec(memory_space=space)
        out_shape = space(future.buffer.shape, future.buffer.dtype)
    done: Callable[..., jax.Array] = pallas_call(
        done_kernel,
        cast("jax.ShapeDtypeStruct", out_shape),
        in_specs=[*([_ANY_SPEC] * n), buffer_spec, _SEM_SPEC],
        out_specs=buffer_spec,
        input_output_aliases={n: 0},
        **options,
    )
    return done(*future.sources, future.buffer, future.sem)


_BODY_FIX = "Pass the kernel function itself (def body(src_ref, dst_ref, sem): ...)."


def _is_shaped(value: object) -> bool:
    """Whether ``value`` has an array's shape and dtype (an array, a ShapeDtypeStruct)."""
    return isinstance(getattr(value, "shape", None), tuple) and hasattr(value, "dtype")


def _is_future(value: object) -> bool:
    return isinstance(value, DmaFuture)


def checked_futures(fn: Callable[P, R]) -> Callable[P, R]:
    """Check, each time ``fn`` runs (or is traced), that every future it starts is
    finished or handed on (returned, or carried through a loop) before it returns."""
    check_callable(fn, "fn", "safedma.checked_futures()")

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        started: list[_State] = []
        token = _registry.set(started)
        try:
            result = fn(*args, **kwargs)
        finally:
            _registry.reset(token)
        # Returning a future hands it on: look for one in the result.
        for leaf in jax.tree_util.tree_leaves(result, is_leaf=_is_future):
            if isinstance(leaf, DmaFuture):
                leaf._state.handed_on = True  # pyright: ignore[reportPrivateUsage]
        dropped = [s for s in started if not s.finishes and not s.handed_on]
        if dropped:
            # Futures started at one site (a loop) are one line with a count.
            sites = collections.Counter((s.name, s.started_at) for s in dropped)
            lines = "\n".join(
                f"  - {copies_of(n, 'futures')}{name}, started at {where}"
                for (name, where), n in sites.items()
            )
            raise FutureDroppedError(
                f"{getattr(fn, '__name__', fn)!r}: {len(dropped)} DMA future(s) were started and "
                f"never finished:\n{lines}\nIts copy is never waited (a TPU crashes at exit, "
                "and XLA may drop the start kernel as unused). Pass each future to "
                "safedma.finish_async(), or return it to finish it later."
            )
        return result

    return run


publish(globals(), __name__)  # public classes print as safedma.X
