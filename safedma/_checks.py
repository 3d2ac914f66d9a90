"""Trace-time validation of the values handed to safedma.

The type checker stops most mistakes; these checks stop the rest (code that
is unannotated, cast, or ``Any``-typed) while the kernel is traced, with a
message naming the refs involved and the fix, instead of a Mosaic verifier
error, a hang or a NaN later.
"""

from __future__ import annotations

import jax

from safedma import _compat
from safedma._compat import SemaphoreKind
from safedma._describe import describe_ref, shape_text
from safedma._scope import entry_config
from safedma._sem_arrays import check_static_indices, how_to_select_one
from safedma._errors import (
    CopyDtypeMismatchError,
    CopyShapeMismatchError,
    MissingSemaphoreError,
    NotARefError,
    PriorityError,
    SemaphoreKindError,
    SemaphoreShapeError,
    UnsupportedDmaError,
)

__all__ = [
    "check_data_ref",
    "check_semaphore",
    "check_same_layout",
    "check_static_sizes",
    "check_priority",
    "check_add",
    "check_no_add",
    "check_push_stream",
]

_WHERE_SEMAPHORES_COME_FROM = {
    SemaphoreKind.DMA: "a SemRef: a kernel parameter from safedma.dma_semaphore() scratch, "
    "or sems.at[i] of a SemArray",
    SemaphoreKind.REGULAR: "a RegularSem: a kernel parameter from safedma.regular_semaphore() "
    "scratch, or sems.at[i] of a RegularSemArray",
    SemaphoreKind.BARRIER: "the BarrierSem from safedma.barrier_semaphore()",
}


def _value_summary(value: object) -> str:
    if isinstance(value, jax.Array) or hasattr(value, "aval"):
        shape = getattr(value, "shape", "?")
        dtype = getattr(value, "dtype", "?")
        return f"an array value of shape {shape} and dtype {dtype}"
    return f"{type(value).__name__} {value!r}"


def check_data_ref(value: object, role: str) -> None:
    """``value`` must be a data ref (not a value, not a semaphore)."""
    if not _compat.is_ref(value):
        raise NotARefError(
            f"{role} must be a data ref, got {_value_summary(value)}. Pass the kernel's "
            "ref (or a view of it, ref.at[...]) instead of a value read from it (ref[...])."
        )
    kind = _compat.ref_kind(value)
    if kind is not SemaphoreKind.DATA:
        raise SemaphoreKindError(
            f"{role} must be a data ref, got a {kind.value} ({describe_ref(value)}). "
            "Data and semaphore arguments are swapped: copies move data refs and are "
            "tracked by semaphores."
        )


def check_semaphore(
    value: object, role: str, allowed: tuple[SemaphoreKind, ...], *, what_for: str
) -> None:
    """``value`` must be one semaphore ref (shape ()) of one of the ``allowed`` kinds."""
    expected = " or ".join(f"a {kind.value}" for kind in allowed)
    if value is None:
        raise MissingSemaphoreError(
            f"{role} is missing: {what_for} needs {expected}. Pass "
            f"{_WHERE_SEMAPHORES_COME_FROM[allowed[0]]}."
        )
    if not _compat.is_ref(value):
        raise NotARefError(
            f"{role} must be {expected} ref, got {_value_summary(value)}: this looks like a "
            "semaphore's value (read(sem) or sem[()]) or a number, not the semaphore "
            f"itself. Pass {_WHERE_SEMAPHORES_COME_FROM[allowed[0]]}."
        )
    kind = _compat.ref_kind(value)
    if kind not in allowed:
        if kind is SemaphoreKind.DATA:
            problem = f"a data ref ({describe_ref(value)})"
        else:
            problem = f"a {kind.value} ({describe_ref(value)})"
        raise SemaphoreKindError(
            f"{role} must be {expected}, got {problem}; {what_for} cannot use it. "
            f"Pass {_WHERE_SEMAPHORES_COME_FROM[allowed[0]]}."
        )
    check_static_indices(value, role)
    shape, _ = _compat.ref_layout(value)
    if shape != ():
        raise SemaphoreShapeError(
            f"{role} must be one semaphore, got an array of {shape[0] if len(shape) == 1 else shape} "
            f"semaphores ({describe_ref(value)}). {how_to_select_one(value, shape)}"
        )


def _shapes_differ(src: tuple[object, ...], dst: tuple[object, ...]) -> bool:
    """Whether two copy shapes certainly differ: in rank, or in a size known while tracing.

    A dynamic-size copy (``pl.ds(start, n)`` with ``n`` read from SMEM) has a traced
    size; reading ``n`` once per side gives two tracers that may well be equal at run
    time, so only static sizes are compared (comparing tracers cannot even be asked).
    """
    if len(src) != len(dst):
        return True
    for a, b in zip(src, dst):
        if a is b:
            continue
        static_a, static_b = _compat.static_int(a), _compat.static_int(b)
        if static_a is not None and static_b is not None and static_a != static_b:
            return True
    return False


def _static_against_traced(src: tuple[object, ...], dst: tuple[object, ...]) -> int | None:
    """The first dimension whose size is fixed while tracing on one side and traced on the
    other (shapes of one rank), else None. Mosaic rejects such a copy on TPU even when the
    traced size is equal at run time: its DMA verifier compares the memref types, where a
    traced size is ``?``."""
    for axis, (a, b) in enumerate(zip(src, dst)):
        if a is not b and _compat.is_static_size(a) != _compat.is_static_size(b):
            return axis
    return None


def check_same_layout(src: object, dst: object, what: str, *, sizes: bool = True) -> None:
    """Source and destination of a copy must agree in shape and dtype (T1, T2).

    ``sizes``: also reject a size fixed while tracing opposite a traced one
    (:func:`check_static_sizes`); False for a descriptor that may only be waited, where
    the jax version's wait lowering does not compare the two shapes."""
    src_shape, src_dtype = _compat.ref_layout(src)
    dst_shape, dst_dtype = _compat.ref_layout(dst)
    if _shapes_differ(src_shape, dst_shape):
        raise CopyShapeMismatchError(
            f"{what}: source {describe_ref(src)} and destination {describe_ref(dst)} have "
            f"different shapes {shape_text(src_shape)} and {shape_text(dst_shape)}. "
            "A DMA copies a block as it is: "
            "slice one side with .at[pl.ds(start, size)] (or reshape the buffer) so both "
            "shapes match."
        )
    if sizes:
        check_static_sizes(src, dst, what)
    if src_dtype != dst_dtype:
        raise CopyDtypeMismatchError(
            f"{what}: source {describe_ref(src)} and destination {describe_ref(dst)} have "
            f"different dtypes {src_dtype} and {dst_dtype}. A DMA does not convert: copy "
            "into a buffer of the source's dtype and convert with .astype() in the kernel."
        )


def check_static_sizes(src: object, dst: object, what: str) -> None:
    """No dimension of a copy may be fixed while tracing on one side and traced on the
    other (T1): Mosaic's verifier rejects the copy's start, and on jax versions whose
    wait lowering compares the shapes (``_compat.waits_compare_shapes``) its wait too."""
    src_shape, _ = _compat.ref_layout(src)
    dst_shape, _ = _compat.ref_layout(dst)
    if len(src_shape) != len(dst_shape):
        return  # check_same_layout's
    axis = _static_against_traced(src_shape, dst_shape)
    if axis is not None:
        static, traced = ("source", "destination")
        if not _compat.is_static_size(src_shape[axis]):
            static, traced = traced, static
        raise CopyShapeMismatchError(
            f"{what}: source {describe_ref(src)} and destination {describe_ref(dst)} have "
            f"shapes {shape_text(src_shape)} and {shape_text(dst_shape)}: dimension {axis} "
            f"has a size fixed while tracing on the {static} and a size computed in the "
            f"kernel (a jax value) on the {traced}. Mosaic rejects such a copy on TPU "
            '("DMA source and target shape mismatch") even when the two sizes are equal '
            f"at run time: slice the {static} with the same traced size "
            "(.at[pl.ds(start, size)]), or give both sides a Python int size."
        )


def check_priority(priority: object, *, remote: bool) -> None:
    """A DMA priority is 0 or 1, and 0 for a remote copy (T4)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PriorityError(
            f"priority must be the Python int 0 or 1, got {priority!r}; it is fixed when "
            "the kernel is compiled."
        )
    if remote and priority != 0:
        raise PriorityError(
            f"a remote copy can only be started with priority 0, got priority={priority}. "
            "Drop the priority argument."
        )
    if priority not in (0, 1):
        raise PriorityError(
            f"priority must be 0 (default) or 1, got {priority}. TPU DMA engines have two "
            "queues; pass priority=1 only for copies that must overtake the others."
        )


def check_no_add(add: object) -> None:
    """``add=True`` (DMA accumulate) has no TPU lowering (T5)."""
    if add is not False:
        raise UnsupportedDmaError(
            f"add={add!r}: DMA accumulate is not implemented for TPU (interpret mode would "
            "silently do a plain copy instead). Copy into a VMEM buffer and add there: "
            "acc[...] += buf[...]."
        )


def check_add(add: object, src: object, dst: object) -> None:
    """``add=True`` on a local copy (T5): only SparseCore lowers DMA accumulate, and only
    as an indirect copy, rows picked by an array of indices on one side (a scatter-add
    ``dst.at[indices]`` into VMEM_SHARED, a gather-add ``src.at[indices]``); a TensorCore
    copy, or a window of rows, has none. A kernel an entry point knows to run on
    TensorCores (``sd.pallas_call``, ``sd.core_kernel`` over TensorCore meshes) has none
    even for an indexed side: jax's TensorCore lowering rejects it."""
    config = entry_config()
    on_tensor_core = config is not None and config.tensor_core
    if add is False or (
        add is True
        and not on_tensor_core
        and (_compat.indexes_by_array(src) or _compat.indexes_by_array(dst))
    ):
        return
    where = (
        " This kernel runs on TensorCores (a pallas_call, or sd.core_kernel over a "
        "TensorCore mesh), so an indexed side does not help."
        if on_tensor_core
        else ""
    )
    raise UnsupportedDmaError(
        f"add={add!r}: DMA accumulate is not implemented for TPU TensorCores, nor for a copy "
        "of a contiguous window (interpret mode would silently do a plain copy instead). "
        "Copy into a VMEM buffer and add there: acc[...] += buf[...]. (On SparseCore, "
        "add=True is a scatter-add or gather-add: index one side by an array of row indices, "
        f"dst.at[indices] in VMEM_SHARED or src.at[indices].){where}"
    )


def check_push_stream(src: object, dst: object, role: str) -> None:
    """A local copy without a semaphore (T6) is legal only as a SparseCore push stream on
    jax 0.12: from VMEM to HBM, VMEM_SHARED or SMEM, or from VMEM_SHARED to SMEM, not
    indexed by an array (jax's rule); jax tracks its completion without a semaphore and
    warns when one is given. Everywhere else a missing semaphore fails lowering."""
    config = entry_config()
    src_space, dst_space = _compat.memory_space_of(src), _compat.memory_space_of(dst)
    spaces = f"{describe_ref(src)} ({src_space}) -> {describe_ref(dst)} ({dst_space})"
    if not _compat.push_streams_supported():
        why = (
            f"jax 0.12 lets a SparseCore push stream go without one; this is jax {jax.__version__}"
        )
    elif config is not None and config.tensor_core:
        why = (
            "this kernel runs on TensorCores (a pallas_call, or sd.core_kernel over a "
            "TensorCore mesh), where every copy needs one"
        )
    elif not _compat.is_push_stream(src, dst):
        why = (
            "only a SparseCore push stream, from VMEM to HBM, VMEM_SHARED or SMEM or from "
            f"VMEM_SHARED to SMEM, goes without one, and this copy is {spaces}"
        )
    elif _compat.indexes_by_array(src) or _compat.indexes_by_array(dst):
        why = "a SparseCore scatter or gather (a side indexed by an array) needs one too"
    else:
        return
    raise MissingSemaphoreError(
        f"{role} is missing: a local copy needs a DMA semaphore ({why}). Pass "
        f"{_WHERE_SEMAPHORES_COME_FROM[SemaphoreKind.DMA]}."
    )
