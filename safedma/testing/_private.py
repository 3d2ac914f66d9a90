"""The only place in safedma.testing that touches private JAX APIs.

Two features need JAX internals that have no public spelling:

* Mosaic identity: reading a Mosaic kernel back out of a ``tpu_custom_call``
  needs an MLIR context that knows JAX's dialects (to parse the exported
  StableHLO) and the Mosaic TPU dialect (to parse the kernel bytecode); we
  borrow ``jax._src.interpreters.mlir`` and ``jax._src.lib.tpu``.
* Strict simulation: turning TPU interpret mode's prints and hangs into errors
  needs probes on a few classes of ``jax._src.pallas.mosaic.interpret``
  (see :func:`interpret_probes`).

Each use checks that what it needs is still there and fails with a
:class:`PrivateJaxApiError` naming the JAX version when it moved.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import inspect
import itertools
import logging
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from types import ModuleType
from typing import Any, Literal, Protocol, cast

import jax
from jax.experimental.pallas import tpu as _pltpu
from jax.extend.mlir import ir

__all__ = [
    "TESTED_JAX_VERSIONS",
    "DmaStart",
    "InterpretObserver",
    "InterpretRun",
    "LeftoverCount",
    "PrivateJaxApiError",
    "RaceReport",
    "WaitStart",
    "current_interpret_run",
    "force_interpret_params",
    "interpret_probes",
    "quiet_callback_failures",
    "mosaic_ir_context",
    "races_raise_natively",
    "strict_interpret_params",
]

#: JAX releases this module was written against and tested with.
TESTED_JAX_VERSIONS: tuple[str, ...] = ("0.10.2", "0.12.0.1")


class PrivateJaxApiError(RuntimeError):
    """A private JAX API that safedma.testing relies on is missing.

    Raised instead of an ``ImportError``/``AttributeError`` deep in a test so
    that the failure says which JAX internals moved and which versions are
    known to work.
    """


def _moved(what: str, detail: object) -> PrivateJaxApiError:
    return PrivateJaxApiError(
        f"safedma.testing needs the private JAX API {what}, which jax "
        f"{jax.__version__} does not provide ({detail}). It is known to work "
        f"with jax {', '.join(TESTED_JAX_VERSIONS)}; update "
        "safedma/testing/_private.py for this JAX release."
    )


def _private_module(name: str) -> ModuleType:
    # Some of these (jax._src.lib.tpu) are module attributes bound by the
    # parent's __init__, not importable submodules; accept either.
    parent_name, _, attr = name.rpartition(".")
    try:
        parent = importlib.import_module(parent_name)
    except ImportError as err:
        raise _moved(name, err) from err
    value = getattr(parent, attr, None)
    if isinstance(value, ModuleType):
        return value
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise _moved(name, err) from err


def _private_callable(module: ModuleType, attr: str) -> Callable[..., object]:
    value: object = getattr(module, attr, None)
    if not callable(value):
        raise _moved(f"{module.__name__}.{attr}", "attribute missing")
    return value


@contextlib.contextmanager
def mosaic_ir_context() -> Generator[ir.Context, None, None]:
    """Enter an MLIR context that parses exported StableHLO and Mosaic bytecode.

    It has JAX's dialects (for the StableHLO), the Mosaic TPU dialect (the
    kernel bytecode uses its types) and accepts unregistered ops (serialised
    Mosaic ops are ``stable_mosaic.*``, which no dialect registers).  Since
    jax 0.12 ``make_ir_context`` hands out a cached per-thread context that JAX
    reuses for its own lowering, so we take the uncached ``_create_ir_context``
    where it exists; otherwise (jax 0.10, where ``make_ir_context`` is
    uncached, or a release that renamed it) we put the unregistered-dialects
    flag back on exit in case the context is shared.  Registering the TPU
    dialect is idempotent and what JAX's own Pallas lowering does.
    """
    jmlir = _private_module("jax._src.interpreters.mlir")
    jtpu = _private_module("jax._src.lib.tpu")
    # A callable's __name__ is not part of its type (ty reports it), so keep the name.
    name = "_create_ir_context" if hasattr(jmlir, "_create_ir_context") else "make_ir_context"
    factory = _private_callable(jmlir, name)
    register_tpu = _private_callable(jtpu, "register_dialect")
    ctx = factory()
    if not isinstance(ctx, ir.Context):
        raise _moved(
            f"{jmlir.__name__}.{name}",
            f"returned {type(ctx).__name__}, not an MLIR Context",
        )
    register_tpu(ctx)
    allowed = ctx.allow_unregistered_dialects
    ctx.allow_unregistered_dialects = True
    try:
        with ctx:
            yield ctx
    finally:
        ctx.allow_unregistered_dialects = allowed


# ---------------------------------------------------------------------------
# TPU interpret mode probes (used by safedma.testing._simulate).
#
# Interpret mode keeps its simulated TPU state in module globals of
# ``jax._src.pallas.mosaic.interpret``.  What safedma needs to turn its prints
# and hangs into errors is not exposed publicly, so we wrap a few methods
# that the interpreter looks up *at run time* (never functions captured by an
# ``io_callback`` at trace time, so jit caching cannot bypass the probes):
#
# * ``shared_memory.Semaphore.wait``: who waits on which semaphore, for what
#   value (R3).  DMA waits pass ``has_tasks=True``; semaphore waits do not.
# * ``interpret_pallas_call.DMA.__init__``: which semaphores each started
#   copy signals, on which devices, started where (hints for R2 and R3).
# * ``shared_memory.SharedMemory.get_sempahores_with_nonzero_count`` (sic):
#   called once per device by ``_validate`` at kernel exit; jax prints only
#   the first result, we record all of them (R2, R4).
# * ``race_detection_state.RaceDetectionState.check_read``/``check_write``:
#   jax 0.12 raises ``RuntimeError("RACE DETECTED ...")`` (``on_race="raise"``);
#   jax 0.10 only prints the report and sets ``races_found``, so there we
#   shadow ``print`` in that module with one that raises the same
#   ``RuntimeError``, which makes both versions stop at the first race (R1).
# * ``pallas_call_p.bind`` (in ``jax._src.pallas.pallas_call``): the forced
#   interpret mode (``pltpu.force_tpu_interpret_mode``) is read when
#   ``pl.pallas_call(...)`` is *built*, so a call built outside the forced
#   context keeps its own ``interpret=``; substituting the strict parameters
#   where the primitive is bound (trace time, before effects are computed)
#   makes them win for every pallas_call traced in the block.
# * ``SharedMemory.set_failed(exc, top_level=False)``: the interpreter's own
#   failure flag, polled every 0.1 s by every ``Semaphore.wait`` loop and on
#   entry to every interpreter callback; the watchdog sets it (R3).
# ---------------------------------------------------------------------------

_INTERPRET = "jax._src.pallas.mosaic.interpret"


@dataclasses.dataclass(frozen=True, eq=False)
class InterpretRun:
    """The simulated TPU state of one interpreted kernel (jax's ``SharedMemory``).

    Opaque on purpose: it only lets the watchdog fail the run and tell
    barrier semaphores from the others.
    """

    _memory: Any

    @property
    def key(self) -> int:
        return id(self._memory)

    def fail(self, error: Exception) -> None:
        """Make every device of this run raise ``error`` at its next interpreter step.

        ``top_level=False``: the caller is not one of the device threads, so it
        must not take a place in the clean-up barrier.
        """
        self._memory.set_failed(error, top_level=False)

    def abort_barriers(self) -> None:
        """Break the interpreter's start and clean-up barriers (last resort)."""
        for name in ("barrier", "clean_up_barrier"):
            barrier = getattr(self._memory, name, None)
            if isinstance(barrier, threading.Barrier):
                barrier.abort()

    def is_barrier_semaphore(self, semaphore: object) -> bool:
        fixed: Mapping[object, object] = getattr(self._memory, "fixed_id_sem", None) or {}
        return any(value is semaphore for value in fixed.values())


@dataclasses.dataclass(frozen=True)
class WaitStart:
    """A device began waiting on a semaphore (``dma_wait`` or ``semaphore_wait``)."""

    run: InterpretRun
    semaphore_id: int
    device_id: int
    core_id: int
    value: int
    is_dma: bool
    is_barrier: bool
    location: str | None
    read_count: Callable[[], int]


@dataclasses.dataclass(frozen=True)
class DmaStart:
    """A copy was started (in eager mode it has also run by the time it is reported)."""

    run: InterpretRun
    src_device_id: int
    dst_device_id: int
    send_semaphore_id: int | None
    recv_semaphore_id: int
    location: str | None


@dataclasses.dataclass(frozen=True)
class LeftoverCount:
    """A semaphore with a non-zero count on one core at kernel exit."""

    run: InterpretRun
    semaphore_id: int
    device_id: int
    core_id: int
    count: int
    is_barrier: bool


@dataclasses.dataclass(frozen=True)
class RaceReport:
    """A race found by interpret mode's happens-before detector."""

    access: Literal["read", "write"]
    accessor: tuple[int, int]
    buffer: tuple[object, ...]
    location: str | None
    message: str


class InterpretObserver(Protocol):
    """Receives probe events; called from the interpreter's device threads."""

    def wait_started(self, token: int, wait: WaitStart) -> None: ...
    def wait_finished(self, token: int) -> None: ...
    def dma_started(self, dma: DmaStart) -> None: ...
    def semaphores_at_exit(
        self, run: InterpretRun, device_id: int, counts: Sequence[LeftoverCount]
    ) -> None: ...
    def race_detected(self, race: RaceReport) -> None: ...


def _interpret_modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    ipc = _private_module(f"{_INTERPRET}.interpret_pallas_call")
    shm = _private_module(f"{_INTERPRET}.shared_memory")
    rds = _private_module(f"{_INTERPRET}.race_detection_state")
    return ipc, shm, rds


def _private_class(module: ModuleType, name: str, methods: Sequence[str]) -> Any:
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise _moved(f"{module.__name__}.{name}", "class missing")
    for method in methods:
        if not callable(getattr(cls, method, None)):
            raise _moved(f"{module.__name__}.{name}.{method}", "method missing")
    return cls


def _parameters(fn: object) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(cast("Callable[..., object]", fn)).parameters)
    except (TypeError, ValueError):
        return ()


def _require_parameters(where: str, fn: object, names: Sequence[str]) -> None:
    have = _parameters(fn)
    missing = [n for n in names if n not in have]
    if missing:
        raise _moved(where, f"parameters {missing} missing; it takes {list(have)}")


def _location(source_info: object) -> str | None:
    if source_info is None:
        return None
    try:
        summarize = _private_callable(
            _private_module("jax._src.source_info_util"), "summarize"
        )
        return str(summarize(source_info))
    except Exception:  # only for messages; never let it break a run
        return None


def _logging_location(logging_info: object) -> str | None:
    return _location(getattr(logging_info, "source_info", None))


def races_raise_natively() -> bool:
    """True where interpret mode raises on a race itself (jax >= 0.11: ``on_race``)."""
    _, _, rds = _interpret_modules()
    state = getattr(rds, "RaceDetectionState", None)
    fields = getattr(state, "__dataclass_fields__", {})
    return "on_race" in fields


def strict_interpret_params(
    uninitialized_memory: Literal["nan", "zero"] = "nan",
) -> _pltpu.InterpretParams:
    """Interpret mode with race detection, races fatal and DMAs run when started."""
    extra: dict[str, Any] = {}
    if "on_race" in getattr(_pltpu.InterpretParams, "__dataclass_fields__", {}):
        extra["on_race"] = "raise"
    return _pltpu.InterpretParams(
        detect_races=True,
        dma_execution_mode="eager",
        uninitialized_memory=uninitialized_memory,
        **extra,
    )


def current_interpret_run() -> InterpretRun | None:
    """The simulated state of the kernel being interpreted now, if any."""
    ipc, _, _ = _interpret_modules()
    memory = getattr(ipc, "_shared_memory", None)
    return None if memory is None else InterpretRun(memory)


_probe_lock = threading.Lock()
_wait_tokens = itertools.count(1)


def _race_print(*args: object, **kwargs: Any) -> None:
    text = " ".join(str(a) for a in args)
    if text.startswith("RACE DETECTED"):
        raise RuntimeError(text)
    builtins.print(*args, **kwargs)


@contextlib.contextmanager
def interpret_probes(observer: InterpretObserver) -> Generator[None, None, None]:
    """Report interpret-mode waits, copies, exit counts and races to ``observer``.

    Installed for the ``with`` block only, and by one caller at a time.
    Raises :class:`PrivateJaxApiError` if the interpreter internals moved.
    """
    ipc, shm, rds = _interpret_modules()
    semaphore = _private_class(shm, "Semaphore", ["wait"])
    memory = _private_class(
        shm, "SharedMemory", ["get_sempahores_with_nonzero_count", "set_failed"]
    )
    dma = _private_class(ipc, "DMA", ["__init__"])
    races = _private_class(rds, "RaceDetectionState", ["check_read", "check_write"])
    _require_parameters(
        f"{shm.__name__}.Semaphore.wait", semaphore.wait,
        ["value", "global_core_id", "has_tasks", "logging_info"],
    )
    _require_parameters(
        f"{shm.__name__}.SharedMemory.set_failed", memory.set_failed, ["top_level"]
    )
    for field in ("id", "src_device_id", "dst_device_id", "src_sem", "dst_sem",
                  "source_info"):
        if field not in getattr(dma, "__dataclass_fields__", {}):
            raise _moved(f"{ipc.__name__}.DMA.{field}", "field missing")
    check_names = {m: _parameters(getattr(races, m)) for m in ("check_read", "check_write")}
    for method, names in check_names.items():
        if "buffer_key" not in names or not ({"thread"} <= set(names)
                                             or {"device_id", "local_core_id"} <= set(names)):
            raise _moved(f"{rds.__name__}.RaceDetectionState.{method}",
                         f"unexpected parameters {list(names)}")
    native_raise = races_raise_natively()

    if not _probe_lock.acquire(blocking=False):
        raise RuntimeError(
            "safedma.testing.simulate is already running; interpret mode has one "
            "global state per process, so simulations cannot run concurrently"
        )

    orig_wait = semaphore.wait
    orig_nonzero = memory.get_sempahores_with_nonzero_count
    orig_dma_init = getattr(dma, "__init__")
    orig_checks = {m: getattr(races, m) for m in check_names}

    def wait(self: Any, value: Any, global_core_id: Any, *args: Any, **kwargs: Any) -> Any:
        token = next(_wait_tokens)
        gci = int(global_core_id)
        cores = int(getattr(self.shared_memory, "num_cores_per_device", 1) or 1)
        run = InterpretRun(self.shared_memory)

        def read_count() -> int:
            with self.cv:
                return int(self.count_by_core[gci])

        try:
            observer.wait_started(token, WaitStart(
                run=run, semaphore_id=int(self.id), device_id=gci // cores,
                core_id=gci % cores, value=int(value),
                is_dma=bool(kwargs.get("has_tasks", False)),
                is_barrier=run.is_barrier_semaphore(self),
                location=_logging_location(kwargs.get("logging_info")),
                read_count=read_count,
            ))
            return orig_wait(self, value, global_core_id, *args, **kwargs)
        finally:
            observer.wait_finished(token)

    def nonzero(self: Any, device_id: Any) -> Any:
        result = orig_nonzero(self, device_id)
        run = InterpretRun(self)
        cores = int(getattr(self, "num_cores_per_device", 1) or 1)
        counts = [
            LeftoverCount(
                run=run, semaphore_id=int(sem.id), device_id=int(gci) // cores,
                core_id=int(gci) % cores, count=int(sem.count_by_core[gci]),
                is_barrier=run.is_barrier_semaphore(sem),
            )
            for sem, gci in result
        ]
        observer.semaphores_at_exit(run, int(device_id), counts)
        return result

    def dma_init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_dma_init(self, *args, **kwargs)
        src_sem = self.src_sem
        observer.dma_started(DmaStart(
            run=InterpretRun(self.dst_sem.shared_memory),
            src_device_id=int(self.src_device_id),
            dst_device_id=int(self.dst_device_id),
            send_semaphore_id=None if src_sem is None else int(src_sem.id),
            recv_semaphore_id=int(self.dst_sem.id),
            location=_location(self.source_info),
        ))

    def make_check(method: str) -> Callable[..., Any]:
        orig = orig_checks[method]
        signature = inspect.signature(orig)
        access: Literal["read", "write"] = "read" if method == "check_read" else "write"

        def check(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig(self, *args, **kwargs)
            except RuntimeError as err:
                message = str(err)
                if not message.startswith("RACE DETECTED"):
                    raise
                try:
                    bound = signature.bind(self, *args, **kwargs).arguments
                    if "thread" in bound:
                        who = tuple(int(v) for v in bound["thread"])
                    else:
                        who = (int(bound["device_id"]), int(bound["local_core_id"]))
                    accessor = (who[0], who[1] if len(who) > 1 else 0)
                    buffer = tuple(bound.get("buffer_key", ()))
                    location = _location(bound.get("source_info"))
                except Exception:
                    accessor, buffer, location = (-1, -1), (), None
                observer.race_detected(RaceReport(
                    access=access, accessor=accessor, buffer=buffer,
                    location=location, message=message,
                ))
                raise

        return check

    try:
        setattr(semaphore, "wait", wait)
        setattr(memory, "get_sempahores_with_nonzero_count", nonzero)
        setattr(dma, "__init__", dma_init)
        for method in check_names:
            setattr(races, method, make_check(method))
        if not native_raise:
            setattr(rds, "print", _race_print)
        yield
    finally:
        setattr(semaphore, "wait", orig_wait)
        setattr(memory, "get_sempahores_with_nonzero_count", orig_nonzero)
        setattr(dma, "__init__", orig_dma_init)
        for method, orig in orig_checks.items():
            setattr(races, method, orig)
        if not native_raise and getattr(rds, "print", None) is _race_print:
            delattr(rds, "print")
        _probe_lock.release()


@contextlib.contextmanager
def force_interpret_params(params: _pltpu.InterpretParams) -> Generator[None, None, None]:
    """Trace every ``pallas_call`` in the block with ``interpret=params``.

    Also pallas_calls built before the block (``pl.pallas_call(...)`` reads the
    forced mode when it is built, not when it is called), whatever ``interpret=``
    they were built with.
    """
    module = _private_module("jax._src.pallas.pallas_call")
    primitive = getattr(module, "pallas_call_p", None)
    if primitive is None or not callable(getattr(primitive, "bind", None)):
        raise _moved(f"{module.__name__}.pallas_call_p.bind", "primitive missing")
    shadowed = "bind" in vars(primitive)
    orig = primitive.bind

    def bind(*args: Any, **kwargs: Any) -> Any:
        if "interpret" in kwargs:
            kwargs["interpret"] = params
        return orig(*args, **kwargs)

    primitive.bind = bind
    try:
        with _pltpu.force_tpu_interpret_mode(params):
            yield
    finally:
        if shadowed:
            primitive.bind = orig
        else:
            del primitive.bind


@contextlib.contextmanager
def quiet_callback_failures(markers: Sequence[str]) -> Generator[None, None, None]:
    """Drop jax's "jax.io_callback failed" log records for errors that contain a marker.

    Each device thread that fails logs a full traceback; for failures that
    simulate reports itself (races, the watchdog) that is only noise.
    """
    logger = logging.getLogger("jax._src.callback")

    class _Quiet(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            error = record.exc_info[1] if record.exc_info else None
            text = str(error) if error is not None else ""
            return not any(marker in text for marker in markers)

    quiet = _Quiet()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
