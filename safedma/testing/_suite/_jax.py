"""Every jax internal the suite verifier uses, in one place, each with the reason.

jax has no public hook that runs when a compiled program executes. The program a
run executes is known where jax lowers it, and its concrete arguments where jax
executes it; the two meet at the executable:

* ``pxla.lower_sharding_computation(jaxpr, ...)`` lowers every ``jax.jit`` program
  (a user's jit, an eager primitive, which jax runs as a jit of that primitive, an
  eager ``shard_map``, and ahead-of-time ``.trace().lower()``, as ``simulate``
  uses): its jaxpr is recorded here when it calls a kernel.
* ``MeshComputation.compile`` turns that lowering into an executable: the
  executable is tied to the recorded program.
* ``ExecuteReplicated.__call__`` runs the executable with its concrete arguments,
  before jax hands them to XLA (donated buffers are still readable): the observer
  is called with the program and those arguments.

jax's C++ dispatch skips Python after a program's first call when the program
has no side effects (a compiled TPU kernel); interpret-mode kernels have them
(host callbacks), so on CPU every run comes through here. Either way, every
program is seen on its first run.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import jax

from safedma._private_jax import PrivateModule, optional_name
from safedma.testing._private import moved
from safedma.testing._user_frames import traceback_frames, user_frame_of

__all__ = [
    "KERNEL_PRIMITIVES",
    "Kernel",
    "Program",
    "RunFailed",
    "RunObserver",
    "Traced",
    "install",
    "jax_busy_here",
    "observer_running",
    "trace",
]

#: The primitives that run a Pallas TPU kernel: ``pallas_call``, and ``mpmd_map``
#: (``pl.kernel``/``pl.core_map`` over a TensorCore or SparseCore mesh).
KERNEL_PRIMITIVES: Final = frozenset({"pallas_call", "mpmd_map"})

# The private modules are imported on their first use (PrivateModule): importing the
# suite verifier reads no private name, and one a jax release removed fails where it is
# used, as PrivateJaxApiError naming it.
# Why: Jaxpr (and ClosedJaxpr in jax 0.10, which 0.12 folded into Jaxpr), Var and
# jaxpr_as_fun, the function that runs a jaxpr by binding its equations again, are the
# program representation; jax exposes none of them publicly.
_core: Any = PrivateModule("jax._src.core", user="safedma.testing")

# jax's pytree and tracing functions are partly unannotated: typed here once.
tree_flatten = cast(
    "Callable[[object], tuple[list[Any], Any]]", getattr(jax.tree_util, "tree_flatten")
)
tree_unflatten = cast(
    "Callable[[Any, Sequence[object]], Any]", getattr(jax.tree_util, "tree_unflatten")
)
tree_leaves = cast("Callable[[object], list[Any]]", getattr(jax.tree_util, "tree_leaves"))
_tree_structure = cast("Callable[[object], Any]", getattr(jax.tree_util, "tree_structure"))
_make_jaxpr = cast("Callable[..., Callable[..., tuple[Any, Any]]]", getattr(jax, "make_jaxpr"))
zeros = cast("Callable[[tuple[int, ...], Any], jax.Array]", getattr(jax.numpy, "zeros"))
# Why: pxla holds the three points above (lowering, compiling, executing).
_pxla = PrivateModule("jax._src.interpreters.pxla", user="safedma.testing")


@functools.cache
def _closed_jaxpr() -> type[Any] | None:
    """jax 0.10's ClosedJaxpr; None where jax folded it into Jaxpr (0.12)."""
    closed: type[Any] | None = optional_name(_core, "ClosedJaxpr")
    return closed


@functools.cache
def _jaxpr_types() -> tuple[type[Any], ...]:
    """The classes a program (or a parameter holding one) is an instance of."""
    return tuple(t for t in (_core.Jaxpr, _closed_jaxpr()) if t is not None)


def _open(jaxpr: Any) -> Any:
    """The open jaxpr (equations, invars) of a Jaxpr or ClosedJaxpr."""
    closed = _closed_jaxpr()
    return jaxpr.jaxpr if closed is not None and isinstance(jaxpr, closed) else jaxpr


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """The jaxprs among an equation's parameters (jit, shard_map, cond branches, loops)."""
    for value in params.values():
        items: Sequence[Any] = (
            cast("Sequence[Any]", value) if isinstance(value, (tuple, list)) else (value,)
        )
        for item in items:
            if isinstance(item, _jaxpr_types()):
                yield item


def _kernel_eqns(jaxpr: Any) -> Iterator[tuple[Any, list[Any]]]:
    """Every kernel equation of ``jaxpr``, at any depth, with the frames of the
    equations around it (jax records a nested body's frames only up to that body)."""
    stack: list[tuple[Any, list[Any]]] = [(_open(jaxpr), [])]
    while stack:
        current, outer = stack.pop()
        for eqn in current.eqns:
            if eqn.primitive.name in KERNEL_PRIMITIVES:
                yield eqn, outer
                continue  # a kernel's body is the kernel, not another kernel call
            subs = list(_sub_jaxprs(eqn.params))
            if subs:
                frames = traceback_frames(eqn.source_info) + outer
                stack.extend((_open(s), frames) for s in subs)


def calls_a_kernel(jaxpr: Any) -> bool:
    """Whether ``jaxpr`` runs a Pallas TPU kernel anywhere (through jit, shard_map,
    cond, loops, custom derivatives)."""
    return next(_kernel_eqns(jaxpr), None) is not None


@dataclass(frozen=True)
class Kernel:
    """A kernel call of a program: its name and the user's line that called it."""

    name: str
    line: str

    def __str__(self) -> str:
        return f"{self.name} (called at {self.line})" if self.line else self.name


def _kernel_name(eqn: Any) -> str:
    # Why: the kernel's name is a pallas_call parameter ("name" in some versions,
    # "name_and_src_info" in others); with none given, the kernel function's own name
    # from the kernel jaxpr's debug info ("my_kernel at file.py:12").
    params: dict[str, Any] = eqn.params
    name = params.get("name")
    if name is None:
        name = getattr(params.get("name_and_src_info"), "name", None)
    if not name:
        info = getattr(getattr(params.get("jaxpr"), "debug_info", None), "func_src_info", None)
        if isinstance(info, str) and info:
            name = info.split(" at ")[0]
    return str(name or ("pl.kernel" if eqn.primitive.name == "mpmd_map" else "kernel"))


def _kernels(jaxpr: Any) -> tuple[Kernel, ...]:
    found: dict[Kernel, None] = {}
    for eqn, outer in _kernel_eqns(jaxpr):
        line = user_frame_of(traceback_frames(eqn.source_info) + outer, whole_kernel=False)
        found[Kernel(_kernel_name(eqn), line or "")] = None
    return tuple(found)


@dataclass(eq=False)
class Program:
    """A lowered program that calls kernels, as it is known when one of its runs starts.

    ``name`` is jax's name for it (``run`` for ``jax.jit(run)``, ``wrapped`` for an
    eager ``pallas_call``); ``constants`` is how many leading arguments of a run
    are the program's own constants (jax 0.12 passes them as arguments).
    """

    name: str
    constants: int
    kernels: tuple[Kernel, ...]
    _jaxpr: Any = field(repr=False)
    _text: str | None = field(default=None, repr=False)

    def function(self) -> Callable[..., Any]:
        """The program as a Python function of its (non-constant) arguments."""
        # Why: jaxpr_as_fun binds the recorded equations again, so tracing it gives
        # the same program with the same source lines.
        as_fun: Callable[..., Callable[..., Any]] = getattr(_core, "jaxpr_as_fun")
        return as_fun(self._jaxpr)

    def arguments(self, run_args: Sequence[object]) -> list[object]:
        """The program's own arguments among a run's (the constants dropped)."""
        return list(run_args[self.constants :])

    def argument_count(self) -> int:
        return len(_open(self._jaxpr).invars)

    def text(self) -> str:
        """The program as jax prints it: equal texts are the same program."""
        if self._text is None:
            self._text = str(self._jaxpr)
        return self._text

    def constant_values(self) -> list[object]:
        """The values of the program's constants (equal texts may close over others)."""
        return list(getattr(self._jaxpr, "consts", None) or [])

    def kernel_bodies(self) -> list[object]:
        """The kernel jaxprs the program's kernel calls run."""
        return [_kernel_body(eqn) for eqn, _ in _kernel_eqns(self._jaxpr)]

    def replacing_kernels(self, replacement: Callable[[object], Traced | None]) -> Program:
        """The same program with each kernel call whose kernel jaxpr ``replacement``
        maps to a trace run as that trace instead (on the call's own operands, into
        its own results); the program itself when it has none."""
        memo: dict[int, Any] = {}
        jaxpr = _replaced(self._jaxpr, replacement, memo)
        if jaxpr is self._jaxpr:
            return self
        # named as the program that ran names them (the replacement's body may be a
        # partial, which jax 0.10 leaves unnamed)
        return Program(self.name, self.constants, self.kernels, jaxpr)


def _kernel_body(eqn: Any) -> object:
    # Why: a pallas_call equation's "jaxpr" parameter is the kernel it runs.
    params: dict[str, Any] = eqn.params
    return params.get("jaxpr")


@dataclass(frozen=True)
class Traced:
    """A function traced on a list of arguments: its jaxpr, and its results' structure
    and shapes (flat)."""

    _jaxpr: Any = field(repr=False)
    _out_tree: Any = field(repr=False)
    out_shapes: tuple[jax.ShapeDtypeStruct, ...]

    def __call__(self, leaves: Sequence[object]) -> Any:
        """Run the traced program on ``leaves`` (arrays, or tracers of a trace under
        way): its equations are bound again with the same parameters, so the kernels
        they call are the very jaxprs :meth:`lone_kernel` names."""
        # Why: jaxpr_as_fun binds the recorded equations again (the module docstring).
        as_fun: Callable[..., Callable[..., Any]] = getattr(_core, "jaxpr_as_fun")
        flat = as_fun(self._jaxpr)(*leaves)
        return tree_unflatten(self._out_tree, list(flat))

    def lone_kernel(self) -> object | None:
        """The kernel jaxpr of the trace's one ``pallas_call``, when the trace is that
        call alone, on the trace's own arguments into its own results; else None."""
        open_ = _open(self._jaxpr)
        if len(open_.eqns) != 1 or open_.constvars:
            return None
        eqn = open_.eqns[0]
        own = list(eqn.invars) == list(open_.invars) and list(eqn.outvars) == list(open_.outvars)
        return _kernel_body(eqn) if own and eqn.primitive.name == "pallas_call" else None

    def inlined(self, invars: Sequence[Any], outvars: Sequence[Any]) -> list[Any] | None:
        """The trace's equations, reading ``invars`` and writing ``outvars`` (those of
        an equation it takes the place of); None when the trace cannot stand in for
        it (other counts, constants, a result that no equation of its own writes)."""
        open_ = _open(self._jaxpr)
        if open_.constvars or len(open_.invars) != len(invars):
            return None
        results = list(open_.outvars)
        written = {id(v) for e in open_.eqns for v in e.outvars}
        if len(results) != len(outvars) or len({id(v) for v in results}) != len(results):
            return None
        if not all(isinstance(v, _core.Var) and id(v) in written for v in results):
            return None
        renamed: dict[int, Any] = {id(v): new for v, new in zip(open_.invars, invars)}
        renamed.update({id(v): new for v, new in zip(results, outvars)})

        def atom(v: Any) -> Any:
            return renamed.get(id(v), v) if isinstance(v, _core.Var) else v

        # Why: JaxprEqn.replace keeps an equation's primitive, parameters, effects and
        # source line, with other variables.
        return [
            e.replace(invars=[atom(v) for v in e.invars], outvars=[atom(v) for v in e.outvars])
            for e in open_.eqns
        ]


def trace(function: Callable[..., Any], leaves: Sequence[object]) -> Traced:
    """``function(*leaves)`` traced (the leaves may be tracers of a trace under way)."""
    jaxpr, shapes = _make_jaxpr(function, return_shape=True)(*leaves)
    out_shapes = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in tree_leaves(shapes))
    return Traced(jaxpr, _tree_structure(shapes), out_shapes)


def _replaced(
    jaxpr: Any, replacement: Callable[[object], Traced | None], memo: dict[int, Any]
) -> Any:
    """``jaxpr`` with its kernel calls replaced (at any depth); itself when none is."""
    done = memo.get(id(jaxpr))
    if done is not None:
        return done
    open_ = _open(jaxpr)
    eqns: list[Any] = []
    changed = False
    for eqn in open_.eqns:
        if eqn.primitive.name in KERNEL_PRIMITIVES:
            traced = replacement(_kernel_body(eqn))
            inlined = None if traced is None else traced.inlined(eqn.invars, eqn.outvars)
            if inlined is not None:
                eqns.extend(inlined)
                changed = True
                continue
            eqns.append(eqn)
            continue
        params = _params_replaced(eqn.params, replacement, memo)
        if params is not None:
            eqn = eqn.replace(params=params)
            changed = True
        eqns.append(eqn)
    result = jaxpr
    if changed:
        # Why: Jaxpr.replace keeps a jaxpr's variables, effects and debug info (and, on
        # jax 0.12, its constants); a jax 0.10 ClosedJaxpr takes the new open jaxpr.
        new_open = open_.replace(eqns=eqns)
        result = new_open if open_ is jaxpr else jaxpr.replace(jaxpr=new_open)
    memo[id(jaxpr)] = result
    return result


def _params_replaced(
    params: dict[str, Any], replacement: Callable[[object], Traced | None], memo: dict[int, Any]
) -> dict[str, Any] | None:
    """An equation's parameters with the kernel calls of their jaxprs replaced; None
    when none is."""
    new: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, _jaxpr_types()):
            replaced = _replaced(value, replacement, memo)
            if replaced is not value:
                new[key] = replaced
        elif isinstance(value, (tuple, list)):
            items = cast("Sequence[Any]", value)
            if any(isinstance(v, _jaxpr_types()) for v in items):
                swapped = [
                    _replaced(v, replacement, memo) if isinstance(v, _jaxpr_types()) else v
                    for v in items
                ]
                if any(a is not b for a, b in zip(swapped, items)):
                    new[key] = cast("type[Any]", type(items))(swapped)
    return {**params, **new} if new else None


RunObserver = Callable[[Program, Sequence[object]], None]
RunFailed = Callable[[Program, BaseException], None]

_lock = threading.Lock()
_busy = threading.local()
# MeshComputation -> (jaxpr weakly, name, constants): a lowering that may never run
# (compile_for_tpu) must not keep its program alive.
_lowered: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], str]] = weakref.WeakKeyDictionary()
# id(LoadedExecutable) -> (the MeshExecutable weakly, its Program): an executable
# keeps its program until it is freed.
_executables: dict[int, tuple[weakref.ref[Any], Program]] = {}


def jax_busy_here() -> bool:
    """Whether this thread is inside the observer (verify's own jax runs are not runs
    of the suite)."""
    return bool(getattr(_busy, "on", False))


@contextlib.contextmanager
def observer_running() -> Generator[None, None, None]:
    """Runs on this thread meanwhile are the observer's own, not the suite's."""
    before = jax_busy_here()
    _busy.on = True
    try:
        yield
    finally:
        _busy.on = before


def _lowering_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def lower_sharding_computation(closed_jaxpr: Any, *args: Any, **kwargs: Any) -> Any:
        computation = original(closed_jaxpr, *args, **kwargs)
        if calls_a_kernel(closed_jaxpr):
            name = args[1] if len(args) > 1 else kwargs.get("fun_name", "")
            with _lock:
                _lowered[computation] = (weakref.ref(closed_jaxpr), str(name))
        return computation

    return lower_sharding_computation


def _compile_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 (jax's name)
        executable = original(self, *args, **kwargs)
        with _lock:
            lowered = _lowered.get(self)
        if lowered is None:
            return executable
        jaxpr = lowered[0]()
        if jaxpr is None:
            return executable
        # Why: MeshComputation.const_args are the hoisted constants a run passes first.
        constants = len(getattr(self, "const_args", None) or ())
        program = Program(lowered[1], constants, _kernels(jaxpr), jaxpr)
        # Why: MeshExecutable.xla_executable is the executable ExecuteReplicated runs.
        key = id(executable.xla_executable)
        with _lock:
            _executables[key] = (weakref.ref(executable), program)
        weakref.finalize(executable, _forget, key, program)
        return executable

    return compile


def _forget(key: int, program: Program) -> None:
    with _lock:
        entry = _executables.get(key)
        if entry is not None and entry[1] is program:
            del _executables[key]


def _execute_hook(
    original: Callable[..., Any], observer: RunObserver, failed: RunFailed
) -> Callable[..., Any]:
    def __call__(self: Any, *args: Any) -> Any:  # noqa: N807 (jax's name)
        # Why: ExecuteReplicated.xla_executable ties this run to its MeshExecutable.
        xla = self.xla_executable
        with _lock:
            entry = _executables.get(id(xla))
        program: Program | None = None
        if entry is not None and not jax_busy_here():
            executable = entry[0]()
            if executable is not None and executable.xla_executable is xla:
                program = entry[1]
                with observer_running():
                    observer(program, args)
        if program is None:
            return original(self, *args)
        try:
            return original(self, *args)
        except BaseException as err:
            failed(program, err)
            raise

    return __call__


def install(observer: RunObserver, failed: RunFailed) -> Callable[[], None]:
    """Call ``observer(program, args)`` before every run of a program that calls a
    kernel, and ``failed(program, error)`` when the run itself raises; returns the
    function that puts jax back as it was."""
    # Why: the three private points named in the module docstring; patched on the
    # module itself (optional_name reads it, and an import failure is PrivateJaxApiError).
    pxla = _pxla.loaded()
    lower = optional_name(pxla, "lower_sharding_computation")
    mesh_computation: Any = optional_name(pxla, "MeshComputation")
    execute: Any = optional_name(pxla, "ExecuteReplicated")
    missing = [
        n
        for n, v in (
            ("lower_sharding_computation", lower),
            ("MeshComputation", mesh_computation),
            ("ExecuteReplicated", execute),
        )
        if v is None
    ]
    if missing or lower is None:
        raise moved(f"jax._src.interpreters.pxla.{', '.join(missing)}", "attribute missing")
    compile_original = mesh_computation.__dict__["compile"]
    call_original = execute.__dict__["__call__"]
    setattr(pxla, "lower_sharding_computation", _lowering_hook(lower))
    setattr(mesh_computation, "compile", _compile_hook(compile_original))
    setattr(execute, "__call__", _execute_hook(call_original, observer, failed))

    def uninstall() -> None:
        setattr(pxla, "lower_sharding_computation", lower)
        setattr(mesh_computation, "compile", compile_original)
        setattr(execute, "__call__", call_original)
        with _lock:
            _lowered.clear()
            _executables.clear()

    return uninstall
