"""Every private jax name the GPU checker reads, in one place, each with the reason.

Pallas GPU (``jax.experimental.pallas.mosaic_gpu``) is private below its public
module and changes between jax releases. Each name is looked up lazily, when a
GPU program is checked, so ``import safedma.testing`` never imports it, and a
release that moved one fails as :class:`~safedma.testing.PrivateJaxApiError`
naming the name and the jax version. Generic jaxpr helpers (closed jaxprs, scan
splits, binding a scalar primitive) are the TPU verifier's, in
``safedma.testing._verify.jax_internals``.
"""

from __future__ import annotations

import functools
import importlib
import contextlib
import dataclasses
import sys
from collections.abc import Generator, Sequence
from types import FrameType
from typing import Any, Literal, cast

from safedma.testing._private import moved

__all__ = [
    "CALLBACK_LOGGERS",
    "BlockedBarrierWait",
    "barrier_arrivals",
    "blocked_barrier_waits",
    "interpret_available",
    "interpret_mode",
    "reset_interpreter",
    "stop_interpreter",
    "gpu_mesh_of",
    "gpu_compiler_params",
    "is_indexer",
    "is_shape_preserving",
    "plgpu_available",
    "slice_parts",
    "transformed_shape",
    "memory_space_name",
]

_PLGPU = "jax.experimental.pallas.mosaic_gpu"
_GPU_CORE = "jax._src.pallas.mosaic_gpu.core"
_INDEXING = "jax._src.state.indexing"
_JAX_CORE = "jax.core"
_GPU_CALLBACKS = "jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks"
# The logger jax reports a failing host callback on ("jax.io_callback failed"), with the
# exception attached: public logging, but the name is jax's module path.
CALLBACK_LOGGERS = ("jax._src.callback",)
_GPU_SHARED_MEMORY = "jax._src.pallas.mosaic_gpu.interpret.shared_memory"


@functools.cache
def plgpu_available() -> bool:
    """Whether this jax has the Pallas GPU names the checker reads.

    Why: jax 0.10's plgpu lacks ``kernel(..., out_type=)`` and the ``mpmd_map``
    kernel call; the probe asks for the names themselves, not a version.
    """
    try:
        plgpu = importlib.import_module(_PLGPU)
        core = importlib.import_module(_GPU_CORE)
    except Exception:
        return False
    needed = ("kernel", "copy_gmem_to_smem", "barrier_wait", "commit_smem", "Barrier")
    if not all(hasattr(plgpu, n) for n in needed):
        return False
    return hasattr(core, "BarrierType") and hasattr(core, "Mesh")


def _gpu_core() -> Any:
    try:
        return importlib.import_module(_GPU_CORE)
    except ImportError as err:
        raise moved(_GPU_CORE, err) from err


def _attr(module: Any, name: str) -> Any:
    value = getattr(module, name, None)
    if value is None:
        raise moved(f"{module.__name__}.{name}", "attribute missing")
    return value


def barrier_arrivals(aval: Any) -> tuple[int, bool] | None:
    """(num_arrivals, cluster barrier?) of a barrier ref aval, else None.

    Why: a barrier is a ref whose dtype is the private ``BarrierType`` (or
    ``ClusterBarrierType``) carrying ``num_arrivals``; jax has no public accessor.
    """
    dtype = getattr(getattr(aval, "inner_aval", aval), "dtype", None)
    if dtype is None:
        return None
    core = _gpu_core()
    if isinstance(dtype, _attr(core, "BarrierType")):
        return int(dtype.num_arrivals), False
    cluster = getattr(core, "ClusterBarrierType", None)
    if cluster is not None and isinstance(dtype, cluster):
        return int(dtype.num_arrivals), True
    return None


def memory_space_name(aval: Any) -> str:
    """ "gmem", "smem", "tmem", "registers" ... of a ref aval, lower case.

    Why: the GPU ``MemorySpace`` enum is private; its value is the name.
    """
    space = getattr(aval, "memory_space", None)
    if space is None:
        return "gmem"
    return str(getattr(space, "value", space)).lower()


def gpu_mesh_of(mesh: Any) -> Any | None:
    """``mesh`` if it is a Pallas GPU ``Mesh`` (``plgpu.kernel``), else None.

    Why: ``mpmd_map`` carries the private mesh object that holds the grid, the
    cluster and the number of threads (warpgroups).
    """
    core = _gpu_core()
    return mesh if isinstance(mesh, _attr(core, "Mesh")) else None


def gpu_compiler_params(params: dict[str, Any]) -> Any | None:
    """The GPU ``CompilerParams`` of a ``pallas_call`` equation, else None.

    Why: ``compiler_params`` is a private dataclass (or a dict by backend in some
    releases); its class tells a GPU kernel from a TPU one.
    """
    cp: Any = params.get("compiler_params")
    if isinstance(cp, dict):
        cp = cast("dict[str, Any]", cp).get("mosaic_gpu")
    if cp is None:
        return None
    core = _gpu_core()
    return cp if isinstance(cp, _attr(core, "CompilerParams")) else None


def is_indexer(transform: Any) -> bool:
    """Whether a ref transform is an ``NDIndexer`` (``.at[...]``, ``ref[...]``).

    Why: ``NDIndexer`` lives in ``jax._src.state.indexing``.
    """
    try:
        indexing = importlib.import_module(_INDEXING)
    except ImportError as err:
        raise moved(_INDEXING, err) from err
    return isinstance(transform, _attr(indexing, "NDIndexer"))


def is_slice(index: Any) -> bool:
    """Whether one index of an ``NDIndexer`` is a ``Slice`` (``pl.ds``)."""
    indexing = importlib.import_module(_INDEXING)
    return isinstance(index, _attr(indexing, "Slice"))


def slice_parts(index: Any) -> tuple[Any, Any, Any]:
    """(start, size, stride) of a ``Slice``; its fields are private."""
    return index.start, index.size, index.stride


# Transforms that keep every element where it is in the logical view:
# the swizzle of a buffer changes its bytes' placement, not its indices.
_SHAPE_PRESERVING = ("UnswizzleRef", "IdentityTransform")


def is_shape_preserving(transform: Any) -> bool:
    """Whether a ref transform leaves logical indices unchanged.

    Why: ``UnswizzleRef`` (private, ``jax._src.pallas.mosaic_gpu.core``) changes the
    physical layout only; indices after it address the same elements.
    """
    return type(transform).__name__ in _SHAPE_PRESERVING


def _shaped_array() -> Any:
    """``jax.core.ShapedArray``, the abstract value a transform's ``transform_type`` takes.

    Why: ``jax.core`` drops names release by release (most are deprecated there), and
    jax leaves it partly unannotated.
    """
    try:
        core = importlib.import_module(_JAX_CORE)
    except ImportError as err:
        raise moved(_JAX_CORE, err) from err
    return _attr(core, "ShapedArray")


def transformed_shape(transform: Any, shape: Sequence[int], dtype: Any) -> tuple[int, ...] | None:
    """The shape a non-indexing transform (untile, reshape, bitcast) gives a view, or None.

    Why: ``Transform.transform_type`` is private protocol; a transform without it
    (or one that fails on a plain array type) leaves the checker with an inexact
    region.
    """
    fn = getattr(transform, "transform_type", None)
    if fn is None:
        return None
    try:
        out = fn(_shaped_array()(tuple(shape), dtype))
        return tuple(int(d) for d in out.shape)
    except Exception:
        return None


# --- GPU interpret mode (simulate_gpu) -------------------------------------------


@functools.cache
def interpret_available() -> bool:
    """Whether this jax runs Pallas GPU kernels in its GPU interpreter on a CPU.

    Why: ``InterpretGPUParams`` and ``force_gpu_interpret_mode`` are public in plgpu
    from the release that has the interpreter; the probe asks for them, and for the
    private names a hang is diagnosed and a failed run reset with.
    """
    if not plgpu_available():
        return False
    try:
        plgpu = importlib.import_module(_PLGPU)
        callbacks = importlib.import_module(_GPU_CALLBACKS)
        shared = importlib.import_module(_GPU_SHARED_MEMORY)
    except Exception:
        return False
    public = all(hasattr(plgpu, n) for n in ("InterpretGPUParams", "force_gpu_interpret_mode"))
    barrier = getattr(shared, "Barrier", None)
    private = (
        hasattr(callbacks, "reset_gpu_interpret_mode_state")
        and hasattr(callbacks, "_get_shared_memory")
        and callable(getattr(barrier, "_wait", None))
    )
    return public and private


@contextlib.contextmanager
def interpret_mode(
    *, detect_races: bool, uninitialized_memory: Literal["nan", "zero"]
) -> Generator[None, None, None]:
    """Every Pallas GPU kernel traced in this thread runs in the GPU interpreter.

    Why: ``force_gpu_interpret_mode`` sets a thread-local config that is part of
    jit's cache key, so kernels traced before (or jitted elsewhere) are traced again.
    Races raise at the access that finds them (``on_race="raise"``).
    """
    # Any: a checker that reads the module from its name would judge these names
    # against the installed jax, which may predate them (interpret_available guards).
    plgpu: Any = importlib.import_module(_PLGPU)
    params = plgpu.InterpretGPUParams(
        detect_races=detect_races,
        on_race="raise",
        uninitialized_memory=uninitialized_memory,
    )
    with plgpu.force_gpu_interpret_mode(params):
        yield


def reset_interpreter() -> None:
    """Drop the interpreter's global state, as jax asks after a failed run.

    Why: ``reset_gpu_interpret_mode_state`` is private; a run that failed or was
    stopped leaves shared memory and race state behind for the next kernel.
    """
    callbacks = importlib.import_module(_GPU_CALLBACKS)
    _attr(callbacks, "reset_gpu_interpret_mode_state")()


def stop_interpreter(reason: Exception) -> bool:
    """Fail the running interpreted kernel with ``reason``; False if none is running.

    Why: a barrier wait blocks on a condition variable with no timeout. jax's own
    failure path (``set_failed`` on the private shared-memory object) records the
    failure and wakes every waiter, which then raises; ``top_level=False`` keeps
    this thread from joining the interpreter's clean-up barrier.
    """
    callbacks = importlib.import_module(_GPU_CALLBACKS)
    memory = getattr(callbacks, "_shared_memory", None)
    if memory is None:
        return False
    memory.set_failed(reason, None, top_level=False)
    return True


@dataclasses.dataclass(frozen=True)
class BlockedBarrierWait:
    """A thread of the interpreted kernel blocked in ``barrier_wait``, read from its frame.

    ``phase``: the phase it waits to complete (0 first); ``arrivals``: arrivals so
    far in that phase, of ``num_arrivals``; ``alone``: its block runs one
    warpgroup and the waiter is it, so nothing else can arrive (TMA copies land
    when issued in the interpreter); ``barrier``: the interpreter's barrier
    object's id; ``source_info``: jax's record of the wait's line.
    """

    thread: str
    barrier: int
    phase: int
    arrivals: int
    num_arrivals: int
    alone: bool
    source_info: Any


def blocked_barrier_waits() -> list[BlockedBarrierWait]:
    """Every thread now blocked in the interpreter's barrier wait.

    Why: the interpreter keeps no list of waiters; the waiting frames of
    ``Barrier._wait`` (private) hold the barrier, the thread and the wait's
    source info as locals. ``sys._current_frames`` is CPython's documented way
    to read another thread's stack.
    """
    shared = importlib.import_module(_GPU_SHARED_MEMORY)
    code = _attr(_attr(shared, "Barrier"), "_wait").__code__
    out: list[BlockedBarrierWait] = []
    for top in list(sys._current_frames().values()):  # pyright: ignore[reportPrivateUsage]
        frame: FrameType | None = top
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        if frame is None:
            continue
        local = frame.f_locals
        barrier, thread, info = local.get("self"), local.get("thread"), local.get("logging_info")
        if barrier is None or thread is None or getattr(barrier, "aborted", False):
            continue
        observed = local.get("last_observed_phase")
        phase = int(observed) if isinstance(observed, int) else int(barrier.phase)
        if phase != int(barrier.phase):  # that phase completed: it is about to return
            continue
        out.append(
            BlockedBarrierWait(
                thread=str(thread),
                barrier=id(barrier),
                phase=phase,
                arrivals=int(barrier.arrivals_count),
                num_arrivals=int(barrier.num_arrivals),
                alone=type(thread).__name__ == "Warpgroup"
                and int(getattr(barrier, "num_pallas_threads_per_block", 0)) == 1,
                source_info=getattr(info, "source_info", None),
            )
        )
    return out
