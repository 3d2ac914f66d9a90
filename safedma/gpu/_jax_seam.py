"""Every jax name the typed GPU layer calls, in one place, each with the reason.

Pallas Mosaic GPU (``jax.experimental.pallas.mosaic_gpu``, "plgpu") is experimental:
its functions move and change their signatures between jax releases, and safedma
supports it from jax 0.12 only. Each name is looked up when a kernel calls the typed
layer, never at import: ``import safedma`` and ``import safedma.gpu`` do not import
plgpu, and a jax without these names fails as
:class:`~safedma.UnsupportedByJaxError` (no Pallas GPU at all) or
:class:`~safedma.PrivateJaxApiError` (one private name moved), naming the name and the
installed jax.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from types import ModuleType
from typing import Any

__all__ = [
    "available",
    "barrier_arrive",
    "barrier_of",
    "barrier_wait",
    "commit_smem",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
    "enclosing_mesh",
    "fori_loop",
    "num_arrivals",
    "read",
    "require",
    "view",
    "wait_smem_to_gmem",
    "write",
]

_PLGPU = "jax.experimental.pallas.mosaic_gpu"
_GPU_CORE = "jax._src.pallas.mosaic_gpu.core"
# The plgpu functions the typed layer lowers to: the probe asks for each by name.
_CALLED = (
    "barrier_arrive",
    "barrier_wait",
    "commit_smem",
    "copy_gmem_to_smem",
    "copy_smem_to_gmem",
    "wait_smem_to_gmem",
)


@functools.cache
def available() -> bool:
    """Whether this jax has the Pallas GPU API the typed layer lowers to.

    Why a probe and not a version: jax 0.10's plgpu has these functions but its
    ``kernel`` takes no ``out_type`` and its barriers carry no ``BarrierType`` dtype
    with ``num_arrivals``; the probe asks for exactly what the layer reads.
    """
    try:
        plgpu = importlib.import_module(_PLGPU)
        core = importlib.import_module(_GPU_CORE)
    except Exception:
        return False
    if not all(callable(getattr(plgpu, name, None)) for name in (*_CALLED, "kernel")):
        return False
    try:
        kernel_params = inspect.signature(plgpu.kernel).parameters
    except (TypeError, ValueError):
        return False
    return "out_type" in kernel_params and hasattr(core, "BarrierType")


def require(what: str) -> None:
    """Raise :class:`~safedma.UnsupportedByJaxError` unless :func:`available`."""
    if available():
        return
    import jax

    from safedma._errors import UnsupportedByJaxError

    raise UnsupportedByJaxError(
        f"{what} needs the Pallas Mosaic GPU API of jax 0.12 or later "
        f"(jax.experimental.pallas.mosaic_gpu); jax {jax.__version__} does not have it. "
        "Upgrade jax to use safedma.gpu."
    )


def _module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise _moved(name, err) from err


def _moved(what: str, detail: object) -> Exception:
    from safedma._private_jax import missing_private_name

    return missing_private_name(what, detail, "safedma.gpu")


def _plgpu(name: str) -> Any:
    value = getattr(_module(_PLGPU), name, None)
    if value is None:
        raise _moved(f"{_PLGPU}.{name}", "attribute missing")
    return value


def num_arrivals(barrier_ref: object) -> int | None:
    """``num_arrivals`` of a ``plgpu.Barrier`` scratch ref, or None for another ref.

    Why: a barrier ref's dtype is the private ``BarrierType`` (in
    ``jax._src.pallas.mosaic_gpu.core``) holding ``num_arrivals``; plgpu has no
    public accessor.
    """
    barrier_type = getattr(_module(_GPU_CORE), "BarrierType", None)
    if barrier_type is None:
        raise _moved(f"{_GPU_CORE}.BarrierType", "attribute missing")
    aval = getattr(barrier_ref, "aval", None)
    dtype = getattr(getattr(aval, "inner_aval", aval), "dtype", None)
    if dtype is None:
        dtype = getattr(barrier_ref, "dtype", None)
    if isinstance(dtype, barrier_type):
        return int(getattr(dtype, "num_arrivals"))
    return None


def barrier_of(aval: object) -> tuple[int, bool] | None:
    """``(num_arrivals, cluster barrier?)`` of a barrier ref's aval, else None.

    Why: the raw trace-time check (``safedma/_raw_gpu.py``) reads a barrier from a jaxpr
    variable; its dtype is the private ``BarrierType`` or ``ClusterBarrierType`` (in
    ``jax._src.pallas.mosaic_gpu.core``). Quiet where they are missing: the check then
    says nothing.
    """
    dtype = getattr(getattr(aval, "inner_aval", aval), "dtype", None)
    if dtype is None:
        return None
    try:
        core = importlib.import_module(_GPU_CORE)
    except Exception:
        return None
    for name, cluster in (("BarrierType", False), ("ClusterBarrierType", True)):
        kind = getattr(core, name, None)
        if isinstance(kind, type) and isinstance(dtype, kind):
            arrivals = getattr(dtype, "num_arrivals", None)
            return (arrivals, cluster) if isinstance(arrivals, int) else None
    return None


def enclosing_mesh() -> tuple[int, int] | None:
    """``(threads, blocks per cluster)`` of the ``plgpu.kernel`` being traced, or None.

    Why: ``plgpu.kernel`` traces the body under its private ``Mesh`` (in
    ``jax._src.pallas.mosaic_gpu.core``), held by jax's own frames as ``mesh``; the
    warpgroups it runs share the body's barriers and arrive on them too.
    """
    try:
        mesh_type = getattr(importlib.import_module(_GPU_CORE), "Mesh", None)
    except Exception:
        return None
    if not isinstance(mesh_type, type):
        return None
    frame = inspect.currentframe()
    while frame is not None:
        mesh = frame.f_locals.get("mesh") if "mesh" in _names(frame.f_code) else None
        if isinstance(mesh, mesh_type):
            threads = getattr(mesh, "num_threads", None) or 1
            blocks = 1
            for size in getattr(mesh, "cluster", ()) or ():
                blocks *= int(size)
            return int(threads), blocks
        frame = frame.f_back
    return None


def _names(code: Any) -> tuple[str, ...]:
    return (*code.co_varnames, *code.co_freevars, *code.co_cellvars)


def copy_gmem_to_smem(src: object, dst: object, barrier: object) -> None:
    """``plgpu.copy_gmem_to_smem(src, dst, barrier)``: a TMA load, one barrier arrival."""
    _plgpu("copy_gmem_to_smem")(src, dst, barrier)


def copy_smem_to_gmem(src: object, dst: object) -> None:
    """``plgpu.copy_smem_to_gmem(src, dst)``: a TMA store committed as its own group."""
    _plgpu("copy_smem_to_gmem")(src, dst)


def barrier_wait(barrier: object) -> None:
    """``plgpu.barrier_wait(barrier)``: wait for the barrier's next phase."""
    _plgpu("barrier_wait")(barrier)


def barrier_arrive(barrier: object) -> None:
    """``plgpu.barrier_arrive(barrier)``: one arrival from this thread."""
    _plgpu("barrier_arrive")(barrier)


def commit_smem() -> None:
    """``plgpu.commit_smem()``: make this thread's SMEM writes visible to the TMA."""
    _plgpu("commit_smem")()


def wait_smem_to_gmem(n: int, read_only: bool) -> None:
    """``plgpu.wait_smem_to_gmem(n, wait_read_only=read_only)``."""
    _plgpu("wait_smem_to_gmem")(n, wait_read_only=read_only)


def read(ref: Any, index: object) -> Any:
    """``ref[index]``: a load from one buffer of a stacked SMEM ref (Pallas ``get``)."""
    return ref[index]


def write(ref: Any, index: object, value: object) -> None:
    """``ref[index] = value``: a store to one buffer of a stacked SMEM ref (Pallas ``swap``)."""
    ref[index] = value


def view(ref: Any, index: object) -> Any:
    """``ref.at[index]``: the view a copy takes of one buffer (or one barrier)."""
    return ref.at[index]


def fori_loop(lower: int, upper: int, body: Any) -> None:
    """``jax.lax.fori_loop(lower, upper, body, None)``: the loop a hand-written kernel runs.

    Why here: jax leaves ``fori_loop`` partly unannotated.
    """
    import jax

    getattr(jax.lax, "fori_loop")(lower, upper, body, None)
