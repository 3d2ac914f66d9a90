"""``pltpu.emit_pipeline`` and ``pltpu.sync_copy`` inside checked kernels.

``emit_pipeline`` issues and waits its own block copies (raw pltpu, invisible to
safedma), so it coexists with the kernel-scope checks as it is. What safedma
adds: :func:`emit_pipeline` checks the pipeline *body* as a kernel of its own
(a copy the body starts must be waited within the same step, as in any kernel
body), and :func:`sync_copy` checks its refs like a :class:`~safedma.LocalCopy`
(a copy and wait with a semaphore jax allocates). Both lower to exactly the
pltpu call. On jax 0.12, lowering either on a CPU needs a TPU generation:
``safedma.testing.abstract_mesh(..., tpu="v5p")``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from safedma._arguments import check_callable, shown

from safedma._checks import check_add, check_data_ref, check_same_layout
from safedma._entry_points import checked
from safedma._refs import DataRef

__all__ = ["sync_copy", "emit_pipeline"]

# Typed once: jax leaves these partly unannotated.
_sync_copy = cast("Callable[..., None]", getattr(pltpu, "sync_copy"))
_emit_pipeline = cast("Callable[..., Callable[..., Any]]", getattr(pltpu, "emit_pipeline"))


def sync_copy(src: DataRef, dst: DataRef, *, add: bool = False) -> None:
    """Copy ``src`` to ``dst`` and wait: ``pltpu.sync_copy(src, dst)``, with the
    shape, dtype and ref checks of a :class:`~safedma.LocalCopy`. ``add=True`` (a
    SparseCore scatter-add into ``dst.at[indices]`` or gather-add from
    ``src.at[indices]``) is checked as ``LocalCopy.start(add=True)`` is (T5)."""
    check_data_ref(src, "sync_copy source")
    check_data_ref(dst, "sync_copy destination")
    check_same_layout(src, dst, "sync_copy")
    check_add(add, src, dst)
    if add:
        _sync_copy(src, dst, add=True)
    else:
        _sync_copy(src, dst)


def _check_grid(grid: object) -> None:
    """A pipeline's grid: a tuple of positive ints or integer scalars (traced step counts)."""
    expected = "a tuple of positive ints or integer scalar jax arrays, such as (4,) or (n, 2)"
    if isinstance(grid, int) and not isinstance(grid, bool):
        raise TypeError(
            f"safedma.emit_pipeline(): grid must be {expected}, got {shown(grid)}. "
            f"Write ({grid},) for one dimension."
        )
    if not isinstance(grid, (tuple, list)):
        raise TypeError(f"safedma.emit_pipeline(): grid must be {expected}, got {shown(grid)}.")
    given = cast("Sequence[object]", grid)
    for k, dim in enumerate(tuple(given)):
        if isinstance(dim, bool) or not isinstance(dim, int):
            dtype = getattr(dim, "dtype", None)
            if (
                getattr(dim, "shape", None) == ()
                and dtype is not None
                and jnp.issubdtype(dtype, jnp.integer)
            ):
                continue
            raise TypeError(
                f"safedma.emit_pipeline(): grid must be {expected}, got {shown(given)}: "
                f"dimension {k} is {shown(dim)}."
            )
        if dim < 1:
            raise ValueError(
                f"safedma.emit_pipeline(): grid must be {expected}, got {shown(given)}: "
                f"dimension {k} is {dim}. A pipeline with no steps is a missing pipeline call."
            )


def emit_pipeline(
    body: Callable[..., None], *, grid: tuple[int | jax.Array, ...], **options: Any
) -> Callable[..., None]:
    """``pltpu.emit_pipeline(body, grid=grid, **options)`` with ``body`` checked like
    a kernel body each time it is traced (``in_specs``, ``out_specs`` and every
    other option are passed on as given). Call the result with the HBM refs, as
    jax's pipeline. A grid dimension may be traced (a step count read in the
    kernel), as jax's own ``grid: tuple[int | jax.Array, ...]`` allows."""
    check_callable(body, "body", "safedma.emit_pipeline()")
    _check_grid(grid)
    pipeline = _emit_pipeline(checked(body), grid=grid, **options)

    def run(*refs: DataRef | Any, **kwargs: Any) -> None:
        pipeline(*refs, **kwargs)

    return run
