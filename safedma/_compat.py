"""Everything that depends on the jax version or on jax internals, in one place.

safedma supports jax 0.10.2 through 0.12.x. The public pltpu calls it lowers
to have the same spelling across that range as long as the deprecated
``device_id_type`` argument is never passed (0.12 warns on it; the default is
the mesh form in both) and the ``pltpu.semaphore_*`` aliases removed in 0.12
are avoided (``pl.semaphore_*`` exists in both). What cannot be done through
public APIs -- recognising a ref and its semaphore kind, and reading the mesh
axes in scope -- is done here, and ``tests/test_compat.py`` fails loudly if a
jax release moves any of it.
"""

from __future__ import annotations

import contextlib
import enum
import warnings
from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax._src import core as _jax_core
from jax._src.pallas import core as _pallas_core
from jax._src.pallas import primitives as _pallas_primitives
from jax._src.pallas.mosaic import core as _mosaic_core
from jax._src import indexing as _indexing
from jax._src.state import indexing as _state_indexing
from jax._src.state import types as _state_types
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

__all__ = [
    "JAX_VERSION",
    "SemaphoreKind",
    "ref_kind",
    "is_ref",
    "root_of",
    "static_int",
    "view_selections",
    "axes_in_scope",
    "make_local_descriptor",
    "make_remote_descriptor",
    "semaphore_signal",
    "semaphore_wait",
    "semaphore_read",
    "barrier_semaphore",
]


def _parse_version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


JAX_VERSION: tuple[int, ...] = _parse_version(jax.__version__)
MIN_JAX = (0, 10, 2)
if JAX_VERSION < MIN_JAX or JAX_VERSION >= (0, 13):
    raise ImportError(
        f"safedma supports jax 0.10.2 to 0.12.x; jax {jax.__version__} is installed. "
        "Install a supported version, e.g. pip install 'jax[tpu]>=0.10.2,<0.13'."
    )


class SemaphoreKind(enum.Enum):
    """What a ref holds, as far as DMA code cares."""

    DATA = "data ref"
    DMA = "DMA semaphore"
    REGULAR = "REGULAR semaphore"
    BARRIER = "BARRIER semaphore"


_DMA_DTYPE: Any = _mosaic_core.dma_semaphore
_REGULAR_DTYPE: Any = _pallas_core.semaphore
_BARRIER_DTYPE: Any = _pallas_core.barrier_semaphore


def is_ref(value: object) -> bool:
    """True for a Pallas ref (a kernel argument, scratch, or a ``.at[...]`` view)."""
    if isinstance(value, _state_types.TransformedRef):
        return True
    return isinstance(getattr(value, "aval", None), _state_types.AbstractRef)


def ref_kind(ref: object) -> SemaphoreKind:
    """The kind of a ref, from its dtype; call only on values for which is_ref holds.

    A view (``ref.at[...]``) has its root's kind, and reading the root's dtype
    avoids computing the view's type. Kinds are cached per dtype: this runs
    for every ref of every copy.
    """
    dtype = getattr(root_of(ref), "dtype", None)
    if dtype is None:
        return SemaphoreKind.DATA
    try:
        return _kind_by_dtype[dtype]
    except KeyError:
        kind = _kind_of_dtype(dtype)
        _kind_by_dtype[dtype] = kind
        return kind
    except TypeError:  # an unhashable dtype-like
        return _kind_of_dtype(dtype)


_kind_by_dtype: dict[object, SemaphoreKind] = {}


def _kind_of_dtype(dtype: Any) -> SemaphoreKind:
    try:
        if jnp.issubdtype(dtype, _DMA_DTYPE):
            return SemaphoreKind.DMA
        if jnp.issubdtype(dtype, _BARRIER_DTYPE):
            return SemaphoreKind.BARRIER
        if jnp.issubdtype(dtype, _REGULAR_DTYPE):
            return SemaphoreKind.REGULAR
    except TypeError:
        return SemaphoreKind.DATA
    return SemaphoreKind.DATA


def root_of(ref: object) -> object:
    """The underlying kernel ref of a ``.at[...]`` view (the view itself otherwise).

    ``pl.select_ref`` makes a view over a tuple of candidates; its root is the
    first candidate's (candidates are checked to be of one kind and layout).
    """
    if isinstance(ref, _state_types.TransformedRef):
        inner = cast(object, ref.ref)
        if isinstance(inner, tuple):
            candidates = cast("tuple[object, ...]", inner)
            return root_of(candidates[0]) if candidates else candidates
        return inner
    return ref


# Its candidates are unannotated in jax; typed here.
_select_ref = cast("Callable[..., object]", getattr(pl, "select_ref"))


def select_ref(index: object, candidates: tuple[object, ...]) -> object:
    return _select_ref(index, *candidates)


def ref_layout(ref: object) -> tuple[tuple[object, ...], object]:
    """``(shape, dtype)`` of a ref or view, as ``ref.shape`` and ``ref.dtype`` give them.

    For the common view, one ``.at[...]`` index of a kernel ref, the shape
    comes from the indexer and the dtype from the root ref: asking the view
    itself computes its whole abstract type, which was the largest part of
    safedma's trace-time cost per copy. ``tests/test_compat.py`` checks the
    two agree.
    """
    if isinstance(ref, _state_types.TransformedRef):
        transforms = ref.transforms
        if len(transforms) == 1 and isinstance(transforms[0], _state_indexing.NDIndexer):
            indexer = transforms[0]
            if indexer.int_indexer_shape == ():  # integer indices drop their dimension
                slices = (i for i in indexer.indices if isinstance(i, _indexing.Slice))
                return tuple(i.size for i in slices), ref.ref.dtype
            return tuple(indexer.get_indexer_shape()), ref.ref.dtype
    return tuple(getattr(ref, "shape", ())), getattr(ref, "dtype", None)


def static_int(value: object) -> int | None:
    """The value of an index known while tracing (a Python int, or a literal jax
    turned into a constant tracer), else None.

    ``ref.at[5]`` stores 5 as a constant tracer; ``get_const()`` (jax 0.10.2 and
    0.12) gives it back. A traced index (``pl.program_id``, SMEM reads) has none.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    get_const = getattr(value, "get_const", None)
    if get_const is None:
        if getattr(value, "shape", None) == () and hasattr(value, "__index__"):
            try:
                return int(value.__index__())  # numpy integer scalars  # pyright: ignore
            except TypeError:
                return None
        return None
    try:
        const = get_const()
    except Exception:  # a tracer kind without a constant
        return None
    if const is None or getattr(const, "shape", ()) != ():
        return None
    try:
        return int(const)
    except (TypeError, ValueError):
        return None


def view_selections(ref: object) -> tuple[tuple[int, ...], list[tuple[int, object, int]]]:
    """The root's shape and, for each position index of a ``.at[...]`` view, in
    order, ``(dimension, index, size of that dimension)``.

    Slices narrow a dimension; positions drop it. Views made by anything other
    than indexing (reshape, bitcast) end the walk: their later indices are not
    reported.
    """
    root = root_of(ref)
    shape = tuple(int(d) for d in getattr(root, "shape", ()))
    if not isinstance(ref, _state_types.TransformedRef):
        return shape, []
    positions: list[tuple[int, object, int]] = []
    current = list(shape)
    for transform in ref.transforms:
        if not isinstance(transform, _state_indexing.NDIndexer):
            break
        if transform.int_indexer_shape != ():  # array indices: not a plain selection
            break
        narrowed: list[int] = []
        for dim, (index, size) in enumerate(zip(transform.indices, current)):
            if isinstance(index, _indexing.Slice):
                narrowed.append(int(index.size))
                start = static_int(index.start)
                if start is not None:
                    positions.append((dim, (start, int(index.size)), size))
            else:
                positions.append((dim, index, size))
        current = narrowed
    return shape, positions


# Unannotated in jax; typed here so callers need no mypy configuration.
_get_axis_env: Callable[[], Any] = _jax_core.get_axis_env


def axes_in_scope() -> Mapping[str, int]:
    """The named mesh axes in scope (from ``shard_map``), in mesh order, with sizes."""
    sizes = _get_axis_env().axis_sizes
    return {str(name): int(size) for name, size in sizes.items()}


# Lowering. These are the calls a careful author writes by hand; nothing else
# is emitted. device_id_type is never passed: MESH is the default everywhere.
# jax leaves their ref and semaphore parameters unannotated, which pyright strict
# reports at each use (reportUnknownMemberType); safedma's own signatures are typed.

def make_local_descriptor(src: object, dst: object, sem: object) -> Any:
    return pltpu.make_async_copy(src, dst, sem)  # pyright: ignore[reportUnknownMemberType]


class LogicalId(dict[str, Any]):
    """A device named by its logical id (``device_id_type=LOGICAL``), not mesh coordinates.

    An empty ``dict`` to the type checker (so ``Device.pltpu_device_id`` keeps its
    type), recognised here by its class. jax 0.12 deprecates ``device_id_type``
    but has no other spelling for a logical id yet: the deprecation warning
    (about safedma's own call, not the user's) is silenced for these calls only.
    """

    def __init__(self, index: Any) -> None:
        super().__init__()
        self.index: Any = index


# Private: jax 0.12 deprecates the public pl.DeviceIdType (and warns on each access)
# along with device_id_type=, which is still the only way to pass a logical id.
_LOGICAL: Any = _pallas_primitives.DeviceIdType.LOGICAL


@contextlib.contextmanager
def _logical_ids() -> Generator[None, None, None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*device_id_type.*", category=DeprecationWarning)
        yield


def make_remote_descriptor(
    src: object, dst: object, send_sem: object, recv_sem: object, device_id: Any
) -> Any:
    if isinstance(device_id, LogicalId):
        with _logical_ids():
            return pltpu.make_async_remote_copy(  # pyright: ignore[reportUnknownMemberType]
                src, dst, send_sem, recv_sem, device_id=device_id.index,
                device_id_type=_LOGICAL,
            )
    return pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=device_id)  # pyright: ignore[reportUnknownMemberType]


def semaphore_signal(sem: object, inc: Any, device_id: Any) -> None:
    if device_id is None:
        pl.semaphore_signal(sem, inc)  # pyright: ignore[reportUnknownMemberType]
    elif isinstance(device_id, LogicalId):
        with _logical_ids():
            pl.semaphore_signal(  # pyright: ignore[reportUnknownMemberType]
                sem, inc, device_id=device_id.index, device_id_type=_LOGICAL
            )
    else:
        pl.semaphore_signal(sem, inc, device_id=device_id)  # pyright: ignore[reportUnknownMemberType]


def semaphore_wait(sem: object, value: Any) -> None:
    pl.semaphore_wait(sem, value)  # pyright: ignore[reportUnknownMemberType]


def semaphore_read(sem: object) -> jax.Array:
    result: jax.Array = pl.semaphore_read(sem)  # pyright: ignore[reportUnknownMemberType]
    return result


# Typed as a plain callable: jax 0.10.2 leaves it unannotated, 0.12 does not.
_get_barrier_semaphore: Callable[[], object] = pltpu.get_barrier_semaphore


def barrier_semaphore() -> object:
    return _get_barrier_semaphore()
