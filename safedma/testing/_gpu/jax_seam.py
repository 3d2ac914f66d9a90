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
from collections.abc import Sequence
from typing import Any, cast

from safedma.testing._private import moved

__all__ = [
    "barrier_arrivals",
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
