"""Typed scratch declarations for ``scratch_shapes`` and ``run_scoped``.

Each function returns the plain pltpu declaration, typed as ``Scratch[T]``
where ``T`` is the brand the kernel receives for it, so that
:func:`run_scoped` passes a correctly branded ref to its body.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, cast, overload

import jax
import numpy as np
from jax.typing import DTypeLike
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma._arguments import check_callable, check_shape, shown
from safedma._compat import ArrayAval, RefAval
from safedma._refs import (
    DataRef,
    RegularSem,
    RegularSemArray,
    RegularSemArray2,
    SemArray,
    SemArray2,
    SemArray3,
    SemArray4,
    SemRef,
)
from safedma._public import publish

__all__ = [
    "Scratch",
    "dma_semaphore",
    "dma_semaphores",
    "regular_semaphore",
    "regular_semaphores",
    "vmem",
    "smem",
    "run_scoped",
]

T = TypeVar("T")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")
T5 = TypeVar("T5")
T6 = TypeVar("T6")
R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)


class Scratch(Generic[T_co]):
    """A pltpu scratch declaration whose ref, inside the kernel, is a ``T_co``.

    Only a type: values are the pltpu declarations themselves. Covariant: a list of
    different scratch held in a variable (``scratch = [vmem(...), dma_semaphores(2)]``)
    is a ``list[Scratch[object]]`` under mypy (its join), which grid specs and
    ``pallas_call`` accept, as they accept the list written inline.
    """

    __slots__ = ()

    if TYPE_CHECKING:
        # What jax's ScratchShape protocol asks for, which every pltpu declaration
        # has: grid specs typed with it (pltpu.PrefetchScalarGridSpec(scratch_shapes=...))
        # then accept a Scratch under mypy and pyright.
        def get_array_aval(self) -> ArrayAval:
            raise NotImplementedError

        def get_ref_aval(self) -> RefAval:
            raise NotImplementedError

        # ``scratch @ mesh`` places the scratch on one mesh of a multi-mesh ``pl.kernel``
        # (vLLM's SparseCore collectives); jax's declarations support it in 0.10.2 and 0.12.
        def __matmul__(self, mesh: object, /) -> Scratch[T_co]:
            raise NotImplementedError


def _array_shape(shape: int | tuple[int, ...], max_rank: int, what: str) -> tuple[int, ...]:
    given = cast(object, shape)  # checked at run time too, for unchecked callers
    dims: tuple[object, ...]
    if isinstance(given, tuple):
        dims = cast("tuple[object, ...]", given)
    else:
        dims = (given,)
    if not 1 <= len(dims) <= max_rank or any(
        isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims
    ):
        raise ValueError(
            f"{what} takes a positive int length or a tuple of 1 to {max_rank} positive ints, "
            f"got {shape!r}. For one semaphore use the singular form."
        )
    return cast("tuple[int, ...]", dims)


def dma_semaphore() -> Scratch[SemRef]:
    """One DMA semaphore."""
    return cast(Scratch[SemRef], pltpu.SemaphoreType.DMA(()))


@overload
def dma_semaphores(shape: int | tuple[int], /) -> Scratch[SemArray]: ...
@overload
def dma_semaphores(shape: tuple[int, int], /) -> Scratch[SemArray2]: ...
@overload
def dma_semaphores(shape: tuple[int, int, int], /) -> Scratch[SemArray3]: ...
@overload
def dma_semaphores(shape: tuple[int, int, int, int], /) -> Scratch[SemArray4]: ...
def dma_semaphores(shape: int | tuple[int, ...], /) -> Scratch[Any]:
    """An array of DMA semaphores: ``dma_semaphores(n)`` or ``dma_semaphores((a, b))``.

    Select one with as many positions as the rank: ``sems.at[i]``, ``sems.at[i, j]``.
    """
    dims = _array_shape(shape, 4, "safedma.dma_semaphores()")
    return cast("Scratch[Any]", pltpu.SemaphoreType.DMA(dims))


def regular_semaphore() -> Scratch[RegularSem]:
    """One REGULAR semaphore."""
    return cast(Scratch[RegularSem], pltpu.SemaphoreType.REGULAR(()))


@overload
def regular_semaphores(shape: int | tuple[int], /) -> Scratch[RegularSemArray]: ...
@overload
def regular_semaphores(shape: tuple[int, int], /) -> Scratch[RegularSemArray2]: ...
def regular_semaphores(shape: int | tuple[int, ...], /) -> Scratch[Any]:
    """An array of REGULAR semaphores: ``regular_semaphores(n)`` or ``((a, b))``.

    Select one with as many positions as the rank: ``flags.at[i]``, ``flags.at[i, j]``.
    """
    dims = _array_shape(shape, 2, "safedma.regular_semaphores()")
    return cast("Scratch[Any]", pltpu.SemaphoreType.REGULAR(dims))


def _buffer(shape: object, dtype: object, where: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    dims = check_shape(shape, "shape", where)
    if dtype is None:  # np.dtype(None) is float64, which a TPU buffer never means
        raise TypeError(
            f"{where}: dtype must be a dtype such as jnp.float32 or 'bfloat16', got None."
        )
    try:
        kind: np.dtype[Any] = np.dtype(cast("Any", dtype))
    except TypeError as error:
        raise TypeError(
            f"{where}: dtype must be a dtype such as jnp.float32 or 'bfloat16', got "
            f"{shown(dtype)} ({error})."
        ) from None
    return dims, kind


def vmem(shape: Sequence[int], dtype: DTypeLike) -> Scratch[DataRef]:
    """A VMEM buffer."""
    dims, kind = _buffer(shape, dtype, "safedma.vmem()")
    return cast(Scratch[DataRef], pltpu.VMEM(dims, kind))


def smem(shape: Sequence[int], dtype: DTypeLike) -> Scratch[DataRef]:
    """An SMEM buffer (scalars)."""
    dims, kind = _buffer(shape, dtype, "safedma.smem()")
    return cast(Scratch[DataRef], pltpu.SMEM(dims, kind))


def is_scratch(value: object) -> bool:
    """Whether ``value`` is a scratch declaration jax allocates (what ``safedma.vmem``,
    ``dma_semaphores`` and ``pltpu.VMEM(...)`` return: jax asks each for its ref aval)."""
    return callable(getattr(value, "get_ref_aval", None))


def check_scratch_tree(value: object, parameter: str, where: str) -> None:
    """Every leaf of ``value`` (a scratch declaration, or a list, tuple or dict of them)
    must be a scratch declaration."""
    for path, leaf in _leaves_with_paths(value):
        if not is_scratch(leaf):
            raise TypeError(
                f"{where}: {parameter}{path} must be a scratch declaration "
                "(safedma.vmem(shape, dtype), safedma.smem(...), safedma.dma_semaphore(), "
                f"safedma.dma_semaphores(n), ... or a pltpu one), got {shown(leaf)}."
            )


def _leaves_with_paths(value: object) -> list[tuple[str, object]]:
    """``(path text, leaf)`` for each leaf of the pytree ``value``, scratch declarations as
    leaves (jax leaves the key types of ``tree_flatten_with_path`` partly unannotated)."""
    flat = jax.tree_util.tree_flatten_with_path(value, is_leaf=is_scratch)[0]  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    pairs = cast("list[tuple[tuple[object, ...], object]]", flat)
    return [("".join(map(str, path)), leaf) for path, leaf in pairs]


_Axes: TypeAlias = "Hashable | tuple[Hashable, ...]"


@overload
def run_scoped(
    body: Callable[[T], R], scratch: Scratch[T], /, *, collective_axes: _Axes = ()
) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2], R],
    scratch: Scratch[T],
    scratch2: Scratch[T2],
    /,
    *,
    collective_axes: _Axes = (),
) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2, T3], R],
    scratch: Scratch[T],
    scratch2: Scratch[T2],
    scratch3: Scratch[T3],
    /,
    *,
    collective_axes: _Axes = (),
) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2, T3, T4], R],
    scratch: Scratch[T],
    scratch2: Scratch[T2],
    scratch3: Scratch[T3],
    scratch4: Scratch[T4],
    /,
    *,
    collective_axes: _Axes = (),
) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2, T3, T4, T5], R],
    scratch: Scratch[T],
    scratch2: Scratch[T2],
    scratch3: Scratch[T3],
    scratch4: Scratch[T4],
    scratch5: Scratch[T5],
    /,
    *,
    collective_axes: _Axes = (),
) -> R: ...
@overload
def run_scoped(
    body: Callable[[T, T2, T3, T4, T5, T6], R],
    scratch: Scratch[T],
    scratch2: Scratch[T2],
    scratch3: Scratch[T3],
    scratch4: Scratch[T4],
    scratch5: Scratch[T5],
    scratch6: Scratch[T6],
    /,
    *,
    collective_axes: _Axes = (),
) -> R: ...
@overload
def run_scoped(
    body: Callable[..., R], /, *, collective_axes: _Axes = (), **named: Scratch[Any]
) -> R: ...
def run_scoped(
    body: Callable[..., R],
    /,
    *scratch: Scratch[Any],
    collective_axes: _Axes = (),
    **named: Scratch[Any],
) -> R:
    """``pl.run_scoped`` with typed scratch: allocate, call ``body``, free.

    Positional scratch (one to six) is matched to ``body``'s parameters by the
    type checker; the keyword form ``run_scoped(body, buf=vmem(...), sem=...)``
    passes each by name (the checker cannot match names to brands: annotate
    ``body``'s parameters). ``collective_axes`` allocates the scratch shared
    across those mesh axes, as in ``pl.run_scoped``.
    """
    check_callable(body, "body", "safedma.run_scoped()")
    for k, one in enumerate(scratch):
        check_scratch_tree(one, f"scratch {k + 1}", "safedma.run_scoped()")
    for key, one in named.items():
        check_scratch_tree(one, key, "safedma.run_scoped()")
    if collective_axes != ():
        result: R = pl.run_scoped(body, *scratch, collective_axes=collective_axes, **named)
    else:
        result = pl.run_scoped(body, *scratch, **named)
    return result


publish(globals(), __name__)  # public classes print as safedma.X
