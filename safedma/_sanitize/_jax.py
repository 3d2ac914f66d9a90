"""Every jax internal the sanitizer uses, in one place, each with why (jax 0.10.2 and 0.12).

The sanitizer re-emits a kernel body from its jaxpr, so it needs what jax keeps
private about jaxprs (equations' tracebacks, literals, the parameters of
control-flow primitives, re-tracing a block with given ref types), the
semaphore-read primitive, and one rule in jax's TPU interpreter. Each private
name is looked up once here; :func:`check_private_names` fails with
:class:`~safedma.testing.PrivateJaxApiError`-style text naming what moved.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import _compat
from safedma._private_jax import PrivateModule, optional_name
from safedma._sanitize._units import Backend

# The private modules are imported on their first use (PrivateModule): importing the
# sanitizer reads no private name, and one a jax release removed fails where it is used,
# as PrivateJaxApiError naming it. Type checkers see jax's own modules.
if TYPE_CHECKING:
    # Private: jaxpr classes (Literal, DropVar, Primitive), the trace state; no public
    # spelling.
    from jax._src import core as _core

    # Private: each re-bound equation keeps its user's traceback (user_context), so Mosaic
    # locations, interpret-mode errors and simulate's messages still name the user's line.
    from jax._src import source_info_util as _source_info

    # Private: tracing a block (a run_scoped body) for given ref types, as jax's own
    # run_scoped does (trace_to_jaxpr_dynamic, the same signature in 0.10.2 and 0.12).
    from jax._src import api_util as _api_util
    from jax._src import linear_util as _lu
    from jax._src.interpreters import partial_eval as _pe

    # Private: semaphore_read_p (the chip's read; pl.semaphore_read takes a view, the
    # sanitizer has a root and its transforms from the jaxpr), run_scoped_p (re-bound with
    # an instrumented body).
    from jax._src.pallas import primitives as _pallas_primitives

    # Private: mutable_array_checks, switched off while a block is traced (as jax's own
    # run_scoped does).
    from jax._src import config as _config

    # Private: the barrier semaphore's dtype, which has no public name.
    from jax._src.pallas import core as _pallas_core

    # Private: the token set a failed computation with ordered effects leaves behind
    # (forget_failed_effects).
    from jax._src import dispatch as _dispatch
else:
    _core = PrivateModule("jax._src.core")
    _source_info = PrivateModule("jax._src.source_info_util")
    _api_util = PrivateModule("jax._src.api_util")
    _lu = PrivateModule("jax._src.linear_util")
    _pe = PrivateModule("jax._src.interpreters.partial_eval")
    _pallas_primitives = PrivateModule("jax._src.pallas.primitives")
    _config = PrivateModule("jax._src.config")
    _pallas_core = PrivateModule("jax._src.pallas.core")
    _dispatch = PrivateModule("jax._src.dispatch")

__all__ = [
    "DEBUG_CALLBACK_LOGGER",
    "Backend",
    "asarray",
    "fori_loop",
    "is_tracer",
    "semaphore_wait",
    "switch",
    "tree_flatten",
    "tree_flatten_with_path",
    "tree_map",
    "tree_unflatten",
    "interpret_read",
    "axes_in_scope",
    "sub_jaxprs",
    "is_literal",
    "bind_default",
    "bind_run_scoped",
    "block",
    "check_private_names",
    "eqn_frames",
    "forget_failed_effects",
    "interpret_backend",
    "is_drop_var",
    "literal_value",
    "make_body_jaxpr",
    "read_semaphore",
    "register_interpret_read",
    "scan_counts",
    "semaphore_kind",
    "trace_block",
    "user_context",
]

# Private: the logger jax's debug callback logs a raising callback's traceback to
# ("jax.debug.callback failed", once per device), before raising it (jax 0.10.2 and 0.12).
DEBUG_CALLBACK_LOGGER = "jax._src.debugging"

# ---------------------------------------------------------------- typed views
# jax leaves these public functions partly unannotated; pyright strict reports every
# use (reportUnknownMemberType). Typed once here; each is the jax function itself.

tree_flatten = cast(
    "Callable[[object], tuple[list[Any], Any]]", getattr(jax.tree_util, "tree_flatten")
)
tree_unflatten = cast(
    "Callable[[Any, Sequence[Any]], Any]", getattr(jax.tree_util, "tree_unflatten")
)
tree_map = cast(
    "Callable[[Callable[[Any], Any], object], object]", getattr(jax.tree_util, "tree_map")
)
tree_flatten_with_path = cast(
    "Callable[[object], tuple[list[tuple[tuple[object, ...], object]], Any]]",
    getattr(jax.tree_util, "tree_flatten_with_path"),
)
asarray = cast("Callable[..., jax.Array]", getattr(jnp, "asarray"))
switch = cast("Callable[[Any, Sequence[Callable[[], Any]]], Any]", getattr(jax.lax, "switch"))
fori_loop = cast(
    "Callable[[int, int, Callable[[Any, Any], Any], Any], Any]", getattr(jax.lax, "fori_loop")
)
semaphore_wait = cast("Callable[[Any, Any], None]", getattr(pl, "semaphore_wait"))


def is_tracer(value: object) -> bool:
    """Whether ``value`` is being traced (under ``jax.jit``, ``shard_map``, ...)."""
    # Private: jax.core.Tracer is deprecated in the public API; jax._src.core keeps it.
    return isinstance(value, _core.Tracer)


# ---------------------------------------------------------------- jaxprs


def block(value: Any) -> tuple[Any, list[Any]]:
    """``(open jaxpr, consts)`` of a sub-jaxpr parameter. Why: jax 0.10.2 holds
    ClosedJaxpr objects (``.jaxpr``, ``.consts``) or open Jaxprs (run_scoped);
    jax 0.12 has one Jaxpr class that carries its ``.consts``."""
    inner = getattr(value, "jaxpr", value)
    if inner is None or not hasattr(inner, "eqns"):
        inner = value
    consts = list(getattr(value, "consts", None) or ())
    return inner, consts


def sub_jaxprs(params: Any) -> list[Any]:
    """The open jaxprs an equation's parameters hold (any depth of tuples)."""
    found: list[Any] = []

    def visit(value: object) -> None:
        if isinstance(value, (tuple, list)):
            for item in cast("Sequence[object]", value):
                visit(item)
            return
        inner = getattr(value, "jaxpr", None)
        if inner is not None and hasattr(inner, "eqns"):
            found.append(inner)
        elif hasattr(value, "eqns") and hasattr(value, "invars"):
            found.append(value)

    for value in cast("dict[str, object]", params).values():
        visit(value)
    return found


def is_literal(var: object) -> bool:
    # Private: a jaxpr input can be a Literal (a constant inlined into the equation).
    return isinstance(var, _core.Literal)


def literal_value(var: Any) -> Any:
    return var.val


def is_drop_var(var: object) -> bool:
    # Private: an unused equation output is a DropVar, which has no value to keep.
    return isinstance(var, _core.DropVar)


def bind_default(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    """Bind ``eqn``'s primitive again on ``invals``, as jax's own eval_jaxpr does.
    Why: ``Primitive.get_bind_params`` returns (subfuns, params) in jax 0.10.2 and the
    params alone in 0.12."""
    got: Any = eqn.primitive.get_bind_params(eqn.params)
    if hasattr(got, "keys"):
        subfuns: list[Any] = []
        params: dict[str, Any] = dict(got)
    else:
        subfuns, params = list(got[0]), dict(got[1])
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def user_context(eqn: Any) -> AbstractContextManager[object]:
    """Trace what follows as if at ``eqn``'s own line (its traceback and name stack)."""
    info = eqn.source_info
    return cast(
        "AbstractContextManager[object]",
        _source_info.user_context(info.traceback, name_stack=info.name_stack),
    )


def eqn_frames(eqn: Any) -> list[Any]:
    """The frames jax recorded where ``eqn`` was traced, innermost first. Why: the
    traceback's ``frames`` are private to jax."""
    traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
    try:
        return list(traceback.frames) if traceback is not None else []
    except Exception:
        return []


def make_body_jaxpr(fn: Callable[..., None], leaves: Sequence[Any]) -> tuple[Any, list[Any]]:
    """Trace ``fn(*leaves)`` (kernel refs) to ``(open jaxpr, consts)`` with the public
    ``jax.make_jaxpr``; it returns a ClosedJaxpr in jax 0.10.2 and a Jaxpr in 0.12."""
    make_jaxpr = cast(
        "Callable[[Callable[..., None]], Callable[..., Any]]", getattr(jax, "make_jaxpr")
    )
    closed: Any = make_jaxpr(fn)(*leaves)
    return block(closed)


def trace_block(
    fn: Callable[..., Sequence[Any]], avals: Sequence[Any], name: str
) -> tuple[Any, list[Any]]:
    """Trace ``fn`` on fresh values of ``avals`` (a run_scoped body's allocations) into
    ``(open jaxpr, consts)`` whose constvars are the outer values ``fn`` uses, as jax's
    own run_scoped does. Why here: jax 0.12 traces it with ``trace_to_jaxpr_nocache`` on a
    flat tree (its ``trace_to_jaxpr_dynamic`` lifts outer values to invars instead);
    0.10.2 with ``trace_to_jaxpr_dynamic``."""

    def listed(*args: Any) -> list[Any]:
        return list(fn(*args))

    debug_info: Callable[..., Any] = getattr(_api_util, "debug_info")
    debug = debug_info(name, fn, tuple(avals), {})
    with _config.mutable_array_checks(False):
        nocache: Callable[..., Any] | None = getattr(_pe, "trace_to_jaxpr_nocache", None)
        if nocache is not None:
            # Private, jax 0.12 only (with trace_to_jaxpr_nocache): flattened avals.
            flattree = PrivateModule("jax._src.flattree")
            flatten: Callable[..., Any] = getattr(flattree, "flatten")
            registry: Any = getattr(jax.tree_util, "default_registry")
            flat = flatten((tuple(avals), {}), registry=registry)
            jaxpr: Any = nocache(listed, flat, debug)[0]
            return jaxpr, list(jaxpr.consts)
        wrap_init: Callable[..., Any] = getattr(_lu, "wrap_init")
        dynamic: Callable[..., Any] = getattr(_pe, "trace_to_jaxpr_dynamic")
        traced: tuple[Any, Any, Any] = dynamic(wrap_init(listed, debug_info=debug), list(avals))
        return traced[0], list(traced[2])


def bind_run_scoped(eqn: Any, jaxpr: Any, consts: Sequence[Any]) -> list[Any]:
    """``run_scoped_p`` bound again with an instrumented body (its closed-over values
    first, as jax's run_scoped binds them)."""
    params = dict(eqn.params)
    params["jaxpr"] = jaxpr
    out = eqn.primitive.bind(*consts, **params)
    return list(out)


def scan_counts(eqn: Any, operands: int) -> tuple[int, int]:
    """``(number of consts, number of carries)`` of a scan equation. Why: jax 0.10.2
    names them ``num_consts``/``num_carry``; 0.12 keeps a flat tree ``ft_in`` of the
    three groups (consts, carry, xs)."""
    params = eqn.params
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    groups = params["ft_in"].update(list(range(operands))).unpack()
    consts, carry = (list(g) for g in list(groups)[:2])
    return len(consts), len(carry)


def axes_in_scope() -> dict[str, int]:
    """The named mesh axes in scope (``shard_map``), in order, with sizes. Why: jax
    keeps the axis environment private (``core.get_axis_env``, 0.10.2 and 0.12)."""
    get_env: Callable[[], Any] = getattr(_core, "get_axis_env")
    sizes: dict[object, object] = dict(get_env().axis_sizes)
    return {name: int(cast(int, size)) for name, size in sizes.items() if isinstance(name, str)}


# ---------------------------------------------------------------- semaphores


def semaphore_kind(aval: Any) -> str | None:
    """ "DMA", "REGULAR", "BARRIER" or None (data) for a ref's aval."""
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        dtype = getattr(getattr(aval, "inner_aval", None), "dtype", None)
    if dtype is None:
        return None
    try:
        if jnp.issubdtype(dtype, pltpu.dma_semaphore):
            return "DMA"
        # Private: the barrier semaphore's dtype has no public name.
        barrier = optional_name(_pallas_core, "barrier_semaphore")
        if barrier is not None and jnp.issubdtype(dtype, barrier):
            return "BARRIER"
        if jnp.issubdtype(dtype, pl.semaphore):
            return "REGULAR"
    except TypeError:
        return None
    return None


def _read_args(root: Any, transforms: Sequence[Any]) -> tuple[list[Any], Any]:
    # pl.semaphore_read's own operand tree: [ref, transforms] (jax 0.10.2 and 0.12).
    return tree_flatten([root, tuple(transforms)])


def read_semaphore(root: Any, transforms: Sequence[Any], backend: Backend) -> jax.Array:
    """The semaphore's count, read inside the kernel: jax's ``semaphore_read`` (Mosaic
    ``tpu.sem_read`` on the chip; jax's generic interpreter discharges it), or in jax's
    TPU interpreter, which has no rule for it, the sanitizer's own read."""
    leaves, tree = _read_args(root, transforms)
    if backend is Backend.TPU_INTERPRET:
        primitive: Any = interpret_read()
    else:
        primitive = _pallas_primitives.semaphore_read_p
    return cast(jax.Array, primitive.bind(*leaves, args_tree=tree))


@functools.cache
def interpret_read() -> Any:
    """The sanitizer's own read for jax's TPU interpreter (made on first use: it is a
    private jax class). A primitive of its own rather than a rule for jax's
    semaphore_read_p: jax lowers a jitted kernel after the trace that built it has
    returned, so a rule for jax's primitive could not be scoped to sanitized kernels; this
    one is only ever bound by them, and its rule is registered once, through the
    interpreter's extension point for new primitives."""
    primitive: Any = _core.Primitive("safedma_sanitizer_semaphore_read")
    primitive.def_abstract_eval(_read_abstract_eval)
    return primitive


def _read_abstract_eval(*avals: Any, args_tree: Any) -> Any:
    del avals, args_tree
    return _core.ShapedArray((), jnp.dtype("int32"))


def forget_failed_effects() -> None:
    """Take the error a failed computation with ordered effects (every interpret-mode
    kernel has some) left for the next one: jax re-raises it at the next such call, and
    at exit. ``jax.effects_barrier`` raises it; jax 0.12 then forgets it, jax 0.10.2 keeps
    it (its token set is cleared only after every token succeeded), so the private
    token set (``dispatch.runtime_tokens``) is cleared here."""
    try:
        jax.effects_barrier()
    except Exception:  # the failure being reported as a safedma error
        _dispatch.runtime_tokens.clear()


# ---------------------------------------------------------------- which backend


def interpret_backend(given: object = None) -> Backend:
    """Where the kernel being traced will run. ``given``: the ``interpret=`` of the call
    when the caller knows it; else the ``interpret`` of the innermost ``pl.pallas_call``
    being traced. Either way, ``pltpu.force_tpu_interpret_mode`` (which
    ``safedma.testing.simulate`` uses) wins, as in jax. (The typed API's seam reads
    jax for this: ``safedma._compat.interpret_mode``.)"""
    value = _compat.interpret_mode(given)
    if not value:
        return Backend.CHIP
    if isinstance(value, pltpu.InterpretParams):
        return Backend.TPU_INTERPRET
    return Backend.HLO_INTERPRET


# ---------------------------------------------------------------- jax's TPU interpreter

_IPC = "jax._src.pallas.mosaic.interpret.interpret_pallas_call"
_registered = False
_register_lock = threading.Lock()


def _interpreter() -> Any:
    import importlib  # noqa: PLC0415

    return importlib.import_module(_IPC)


def _moved(what: str) -> RuntimeError:
    return RuntimeError(
        f"safedma's sanitizer needs the private jax name {_IPC}.{what} to run sanitized "
        f"kernels in TPU interpret mode, and jax {jax.__version__} does not have it "
        "(known to work with jax 0.10.2 and 0.12.0.1). Run the kernel without sanitize= "
        "in interpret mode, or on a TPU."
    )


def check_private_names() -> None:
    """Fail now, naming it, if this jax moved a name the interpreter rule needs."""
    ipc = _interpreter()
    for name in ("_interpret_impls", "TOKEN_SHAPE_DTYPE", "_get_shared_memory", "callback"):
        if not hasattr(ipc, name):
            raise _moved(name)
    if not hasattr(getattr(ipc, "state_discharge", None), "transform_array"):
        raise _moved("state_discharge.transform_array")
    code = getattr(getattr(ipc, "_interpret_jaxpr", None), "__code__", None)
    if code is None or not {"ctx", "token"} <= set(code.co_varnames):
        raise _moved("_interpret_jaxpr (its locals ctx and token)")


def register_interpret_read() -> None:
    """Give jax's TPU interpreter its rule for the sanitizer's read (once per process)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        check_private_names()
        impls: dict[Any, Any] = _interpreter()._interpret_impls
        impls[interpret_read()] = _interpret_read
        _registered = True


def _interpreter_state() -> tuple[Any, Any]:
    """The ``ctx`` and ``token`` of the interpreter equation being interpreted.

    Private: the interpreter calls a rule of ``_interpret_impls`` through
    ``jax.make_jaxpr`` from ``_interpret_jaxpr``, without its context; that frame's
    locals hold the device (``ctx.device_id``, ``ctx.local_core_id``) and the token that
    orders the interpreter's host callbacks (0.10.2 and 0.12 alike)."""
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_interpret_jaxpr" and code.co_filename.endswith(
            "interpret_pallas_call.py"
        ):
            return frame.f_locals["ctx"], frame.f_locals["token"]
        frame = frame.f_back  # type: ignore[assignment]
    raise _moved("_interpret_jaxpr (not on the stack of an interpreter rule)")


def _interpret_read(*leaves: Any, args_tree: Any) -> Any:
    """The rule: a host callback that reads the count on this device's core, ordered
    after the interpreter's earlier callbacks by their token. Later callbacks are
    ordered after it through the values that depend on the count (the spin loop's
    exit, the branch that waits)."""
    ipc = _interpreter()
    ctx, token = _interpreter_state()
    sem, transforms = tree_unflatten(args_tree, list(leaves))
    sem_id = ipc.state_discharge.transform_array(sem, transforms)
    _, count = ipc.callback.io_callback(
        _host_read,
        (ipc.TOKEN_SHAPE_DTYPE, jax.ShapeDtypeStruct((), jnp.int32)),
        token,
        ctx.device_id,
        ctx.local_core_id,
        sem_id,
    )
    return count


_last_counts: dict[tuple[int, int, int], int] = {}
_last_lock = threading.Lock()


def _host_read(token: Any, device_id: Any, core_id: Any, sem_id: Any) -> tuple[Any, Any]:
    """Read a semaphore of jax's simulated TPU, as a ``Semaphore.wait`` would find it.

    With ``dma_execution_mode="on_wait"`` the interpreter runs a copy only when its
    semaphore is waited; a read runs the copies pending on it first, as a wait does,
    so the count shows what has landed. A read that finds the count where the last
    read of this core left it, with nothing pending, waits up to 1 ms for a signal
    before it answers, so a spinning device does not starve the others."""
    memory = _interpreter()._get_shared_memory()
    memory.check_failed()
    core = memory.get_global_core_id(int(device_id), int(core_id))
    (sem,), _ = memory.get_semaphores_and_increment_clock([int(sem_id)], core)
    ran = _run_pending(sem, core)
    with sem.cv:
        count = int(sem.count_by_core[core])
    key = (id(memory), int(sem_id), core)
    with _last_lock:
        unchanged = _last_counts.get(key) == count
    if unchanged and not ran:
        with sem.cv:
            sem.cv.wait(timeout=1e-3)
            count = int(sem.count_by_core[core])
    with _last_lock:
        if len(_last_counts) > 100_000:
            _last_counts.clear()
        _last_counts[key] = count
    return token, np.int32(count)


def _run_pending(sem: Any, core: int) -> bool:
    """Run the copies queued on ``sem`` for ``core`` (``on_wait`` mode); whether any ran."""
    with sem.cv:
        tasks = list(sem.tasks[core])
        sem.tasks[core].clear()
    for task in tasks:
        task()
    return bool(tasks)
