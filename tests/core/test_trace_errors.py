"""Trace-time errors on copy and semaphore arguments (T1-T6, T9), and backups of the S-rows.

The kernel-scope checks on starts and waits (T7, T8, escaping handles) are in
``test_ledger.py`` and ``test_control_flow.py``.

Every test traces a misusing kernel (``jax.eval_shape``: the kernel body runs,
nothing is lowered or executed) and checks the safedma exception type and the
words of its message that an author needs: the refs involved (kernel parameter
name, dtype, shape) and the fix.

The S-rows must fail under mypy/pyright; the tests here are for code that is
not type-checked (unannotated kernels, ``typing.cast(Any, ...)``), which must
still fail at trace time with the matching safedma error.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from tests.support.tracing import DMA, F32, SHAPE, TWO_DMA, VMEM, assert_mentions, ring, trace
from tests.support.tracing import trace_on_mesh


# ------------------------------------------------------------- T1: shapes differ


# LocalCopy(source, destination, semaphore) with the arguments by kernel parameter name
# (None for missing) and the scratch after x_ref, o_ref: one mistake each, the error
# (also the builtin class existing `except` clauses catch) and the words it owes.
_LOCAL_MISUSE: dict[
    str,
    tuple[tuple[str | None, ...], list[object], type[Exception], type[Exception], tuple[str, ...]],
] = {
    "t1_shape_mismatch": (
        ("x_ref", "buf", "sem"),
        [safedma.vmem((1, 8, 128), F32), DMA],
        safedma.CopyShapeMismatchError,
        ValueError,
        (
            "LocalCopy",
            "x_ref float32[2,8,128]",
            "buf float32[1,8,128]",
            "(2, 8, 128) and (1, 8, 128)",
            ".at[pl.ds(start, size)]",
            "shapes match",
        ),
    ),
    "t2_dtype_mismatch": (
        ("x_ref", "buf", "sem"),
        [safedma.vmem(SHAPE, jnp.bfloat16), DMA],
        safedma.CopyDtypeMismatchError,
        TypeError,
        (
            "LocalCopy",
            "x_ref float32[2,8,128]",
            "buf bfloat16[2,8,128]",
            "float32 and bfloat16",
            "does not convert",
            ".astype()",
        ),
    ),
    "s3_regular_semaphore": (
        ("x_ref", "buf", "sem"),
        [VMEM, safedma.regular_semaphore()],
        safedma.SemaphoreKindError,
        TypeError,
        (
            "LocalCopy semaphore must be a DMA semaphore",
            "got a REGULAR semaphore (sem semaphore[])",
            "a local copy cannot use it",
            "safedma.dma_semaphore()",
        ),
    ),
    "t6_none_semaphore": (
        ("x_ref", "buf", None),
        [VMEM, DMA],
        safedma.MissingSemaphoreError,
        ValueError,
        (
            "LocalCopy semaphore is missing",
            "DMA semaphore",
            "safedma.dma_semaphore()",
            "sems.at[i]",
        ),
    ),
    "s6_data_ref_as_semaphore": (
        ("x_ref", "buf", "o_ref"),
        [VMEM, DMA],
        safedma.SemaphoreKindError,
        TypeError,
        (
            "LocalCopy semaphore must be a DMA semaphore",
            "got a data ref (o_ref float32[2,8,128])",
            "safedma.dma_semaphore()",
        ),
    ),
}


@pytest.mark.parametrize("case", list(_LOCAL_MISUSE))
def test_local_copy_argument_mismatched_missing_or_of_the_wrong_kind(case: str) -> None:
    names, scratch, error, builtin, words = _LOCAL_MISUSE[case]

    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        refs = {"x_ref": x_ref, "o_ref": o_ref, "buf": buf, "sem": sem}
        safedma.LocalCopy(*(None if n is None else refs[n] for n in names)).start().wait()

    with pytest.raises(error) as err:
        trace(kernel, scratch)
    assert_mentions(err, *words)
    assert isinstance(err.value, builtin)  # existing `except ValueError/TypeError` keeps working


def test_t1_local_shape_mismatch_of_views() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0], buf.at[0, pl.ds(0, 4)], sem).start().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(
        err, "x_ref.at[...] float32[8,128]", "buf.at[...] float32[4,128]", "(8, 128) and (4, 128)"
    )


def test_t1_shape_mismatch_is_caught_on_a_wait_only_path() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf.at[0], sem).started_elsewhere().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "x_ref float32[2,8,128]", "buf.at[...] float32[8,128]")


def test_t1_remote_shape_mismatch() -> None:
    # Today this hangs interpret mode.
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref.at[0], o_ref, send_sem, recv_sem).start().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(
        err,
        "RemoteCopy",
        "x_ref.at[...] float32[8,128]",
        "o_ref float32[2,8,128]",
        "(8, 128) and (2, 8, 128)",
        ".at[pl.ds(start, size)]",
    )


# A size fixed while tracing (a Python int) opposite a size computed in the kernel (any jax
# value, even a constant one): Mosaic's DMA verifier compares the memref types, where the
# traced size is `?`, and rejects the copy on TPU whatever the run-time value ("Pallas
# encountered an internal verification error. Please file a bug").
_STATIC_AGAINST_TRACED: dict[str, Callable[[Any, Any], tuple[Any, Any]]] = {
    "traced_destination": lambda x, pid: (x.at[0], x.at[1, pl.ds(0, pid + 8)]),
    "traced_source": lambda x, pid: (x.at[0, pl.ds(0, pid + 8)], x.at[1]),
    "constant_jax_size": lambda x, pid: (x.at[0, pl.ds(0, jnp.int32(8))], x.at[1]),
}


@pytest.mark.parametrize("case", sorted(_STATIC_AGAINST_TRACED))
def test_t1_a_static_size_opposite_a_traced_size_is_caught(case: str) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        src, dst = _STATIC_AGAINST_TRACED[case](x_ref, pl.program_id(0))
        safedma.LocalCopy(src, dst, sem).start().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace(kernel, [DMA], grid=(1,))
    side = "destination" if case == "traced_destination" else "source"
    static = "source" if side == "destination" else "destination"
    assert_mentions(
        err,
        "dimension 0 has a size fixed while tracing on the " + static,
        "DMA source and target shape mismatch",
        f"slice the {static} with the same traced size",
    )


def test_t1_a_static_size_opposite_a_traced_size_is_caught_on_a_remote_copy() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        rows = jax.lax.axis_index("x") + 8
        ring(x_ref.at[0], o_ref.at[0, pl.ds(0, rows)], send_sem, recv_sem).start().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "RemoteCopy", "(8, 128) and (?, 128)", "dimension 0")


@pytest.mark.parametrize(
    "sizes",
    [
        lambda n: (pl.ds(0, n), pl.ds(0, n)),  # one traced size on both sides
        lambda n: (pl.ds(0, n), pl.ds(0, n + 0)),  # two traced sizes
        lambda n: (pl.ds(0, 8), pl.ds(0, np.int32(8))),  # numpy ints are static in jax
    ],
    ids=["same_traced", "two_traced", "numpy_int"],
)
def test_t1_sizes_of_one_kind_on_both_sides_trace(sizes: Callable[[Any], tuple[Any, Any]]) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        a, b = sizes(pl.program_id(0) + 8)
        safedma.LocalCopy(x_ref.at[0, a], o_ref.at[1, b], sem).start().wait()

    trace(kernel, [DMA], grid=(1,))


# ------------------------------------------------------------- T2: dtypes differ


def test_t2_local_dtype_mismatch_of_views() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(buf.at[1], o_ref.at[0], sem).start().wait()

    with pytest.raises(safedma.CopyDtypeMismatchError) as err:
        trace(kernel, [safedma.vmem(SHAPE, jnp.int32), DMA])
    assert_mentions(err, "buf.at[...] int32[8,128]", "o_ref.at[...] float32[8,128]", ".astype()")


def test_t2_remote_dtype_mismatch_into_vmem() -> None:
    def kernel(x_ref, o_ref, buf, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, buf, send_sem, recv_sem).start().wait()

    with pytest.raises(safedma.CopyDtypeMismatchError) as err:
        trace_on_mesh(kernel, [safedma.vmem(SHAPE, jnp.int32), *TWO_DMA])
    assert_mentions(err, "RemoteCopy", "x_ref float32[2,8,128]", "buf int32[2,8,128]", ".astype()")


def _send_to(make_device: Callable[[], safedma.Device]) -> Callable[..., None]:
    """A kernel that sends x_ref to ``make_device()``'s o_ref."""

    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem)
        copy.to(make_device()).start().wait()

    return kernel


# ------------------------------------------------- T3: device id does not fit the mesh

_T3_1D: list[tuple[str, Callable[[], safedma.Device], tuple[str, ...]]] = [
    (
        "arity",
        lambda: safedma.mesh_coords(0, 1),
        (
            "mesh_coords got 2 coordinate(s)",
            "1-D mesh",
            "{'x': 4}",
            "one coordinate per axis",
            "safedma.device(axis=index)",
        ),
    ),
    (
        "unknown_axis",
        lambda: safedma.device(y=0),
        ("unknown mesh axis 'y'", "['x']", "jax.shard_map"),
    ),
    (
        "index_too_large",
        lambda: safedma.device(x=4),
        ("device index 4", "axis 'x' of size 4", "0 to 3", "% 4", "safedma.neighbour"),
    ),
    (
        "index_negative",
        lambda: safedma.device(x=-1),
        ("device index -1", "axis 'x' of size 4", "% 4"),
    ),
    (
        "mesh_coords_index_too_large",
        lambda: safedma.mesh_coords(5),
        ("device index 5", "axis 'x' of size 4"),
    ),
    ("no_axis", lambda: safedma.device(), ("needs at least one axis", "device(x=0)", "{'x': 4}")),
]


_T3_2D: list[tuple[str, Callable[[], safedma.Device], tuple[str, ...]]] = [
    (
        "too_few_coords",
        lambda: safedma.mesh_coords(0),
        ("mesh_coords got 1 coordinate(s)", "2-D mesh", "{'x': 2, 'y': 4}"),
    ),
    (
        "too_many_coords",
        lambda: safedma.mesh_coords(0, 1, 2),
        ("mesh_coords got 3 coordinate(s)", "2-D mesh"),
    ),
    ("unknown_axis", lambda: safedma.device({"z": 0}), ("unknown mesh axis 'z'", "['x', 'y']")),
    (
        "x_out_of_range",
        lambda: safedma.device({"x": 2, "y": 0}),
        ("device index 2", "axis 'x' of size 2", "0 to 1", "% 2"),
    ),
    (
        "y_out_of_range",
        lambda: safedma.device(y=4),
        ("device index 4", "axis 'y' of size 4", "% 4"),
    ),
    (
        "coord_out_of_range",
        lambda: safedma.mesh_coords(0, 4),
        ("device index 4", "axis 'y' of size 4"),
    ),
]


_T3 = [(i, m, w, (4,)) for i, m, w in _T3_1D] + [(i, m, w, (2, 4)) for i, m, w in _T3_2D]


@pytest.mark.parametrize(
    ("make_device", "words", "mesh_shape"),
    [(m, w, shape) for _, m, w, shape in _T3],
    ids=[f"{len(shape)}d-{i}" for i, _, _, shape in _T3],
)
def test_t3_device_id_on_a_1d_or_2d_mesh(
    make_device: Callable[[], safedma.Device], words: tuple[str, ...], mesh_shape: tuple[int, ...]
) -> None:
    with pytest.raises(safedma.DeviceIdError) as err:
        collective_id = 0 if mesh_shape == (4,) else None  # as each mesh's tests always ran
        trace_on_mesh(
            _send_to(make_device), TWO_DMA, mesh_shape=mesh_shape, collective_id=collective_id
        )
    assert_mentions(err, *words)


def test_t3_device_out_of_range_in_remote_signal() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        safedma.signal(sem, device=safedma.device(x=7))

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel, [safedma.regular_semaphore()])
    assert_mentions(err, "device index 7", "axis 'x' of size 4", "% 4")


def test_t3_device_without_a_mesh_in_scope() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem)
        copy.to(safedma.device(x=0)).start().wait()

    with pytest.raises(safedma.DeviceIdError) as err:
        trace(kernel, TWO_DMA)
    assert_mentions(err, "safedma.device()", "mesh axes in scope", "jax.shard_map(..., mesh=mesh)")


@pytest.mark.parametrize("query", ["my_index", "axis_size", "neighbour"])
def test_t3_unknown_axis_in_mesh_queries(query: str) -> None:
    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        getattr(safedma, query)("z")

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel)
    assert_mentions(err, "unknown mesh axis 'z'", "['x']")


# ------------------------------------------------------------------- T4: priority


@pytest.mark.parametrize("priority", [2, -1, 7])
def test_t4_local_priority_out_of_range(priority: int) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).start(priority=priority).wait()

    with pytest.raises(safedma.PriorityError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, f"got {priority}", "0 (default) or 1", "priority=1")


@pytest.mark.parametrize("priority", [True, 1.0, "1"])
def test_t4_priority_not_a_python_int(priority: object) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).start(priority=priority).wait()

    with pytest.raises(safedma.PriorityError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "Python int 0 or 1", repr(priority))


def test_t4_remote_copy_with_nonzero_priority() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start(priority=1).wait()

    with pytest.raises(safedma.PriorityError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "remote copy", "priority 0", "priority=1", "Drop the priority argument")


# ---------------------------------------------------------------- T5: add=True


@pytest.mark.parametrize("add", [True, 1])
def test_t5_local_copy_with_add(add: object) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).start(add=add).wait()

    with pytest.raises(safedma.UnsupportedDmaError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(
        err, f"add={add!r}", "not implemented for TPU", "plain copy", "acc[...] += buf[...]"
    )
    assert isinstance(err.value, NotImplementedError)


def test_t5_remote_copy_with_add() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start(add=True).wait()

    with pytest.raises(safedma.UnsupportedDmaError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(
        err, "add=True", "DMA accumulate is not implemented for TPU", "acc[...] += buf[...]"
    )


# ------------------------------------------------------- T6: copy without a semaphore


def test_t6_local_copy_without_semaphore_argument() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf).start().wait()

    with pytest.raises(TypeError, match="missing 1 required positional argument: 'sem'"):
        trace(kernel, [VMEM, DMA])


# ------------------------------------------------- T9: barrier without collective_id


def _barrier_round(x_ref, o_ref):  # type: ignore[no-untyped-def]
    barrier = safedma.barrier_semaphore()
    safedma.signal(barrier, device=safedma.neighbour("x"))
    safedma.wait(barrier)


@pytest.mark.parametrize("params", [None, pltpu.CompilerParams()], ids=["no_params", "no_id"])
def test_t9_barrier_semaphore_without_collective_id(params: object) -> None:
    with pytest.raises(safedma.MissingCollectiveIdError) as err:
        trace(_barrier_round, compiler_params=params)
    assert_mentions(
        err,
        "barrier_semaphore()",
        "no collective_id",
        "compiler_params=pltpu.CompilerParams(collective_id=0)",
        "safedma.pallas_call",
    )
    assert isinstance(err.value, ValueError)


def test_t9_barrier_semaphore_without_collective_id_on_a_mesh() -> None:
    with pytest.raises(safedma.MissingCollectiveIdError) as err:
        trace_on_mesh(_barrier_round, collective_id=None)
    assert_mentions(err, "collective_id=0")


def test_t9_barrier_semaphore_through_pl_pallas_call() -> None:
    # safedma.checked under a plain pl.pallas_call reads the call's compiler_params.
    with pytest.raises(safedma.MissingCollectiveIdError) as err:
        trace_on_mesh(_barrier_round, entry="pl.pallas_call(safedma.checked)", collective_id=None)
    assert_mentions(err, "collective_id=0", "pl.pallas_call")


def test_t9_barrier_semaphore_through_pl_pallas_call_with_an_id_traces() -> None:
    trace_on_mesh(_barrier_round, entry="pl.pallas_call(safedma.checked)", collective_id=3)


def test_t9_is_not_checked_outside_any_pallas_call() -> None:
    # A checked body traced on its own (no pallas_call around it) has no call to read.
    from safedma import _compat

    assert _compat.enclosing_pallas_call_params() is _compat.NOT_FOUND


# ============================================================================
# Trace-time backups of the S-rows (code the type checker did not see)
# ============================================================================

# --------------------------------------- S1: a semaphore *value* where a ref belongs

_SEM_VALUES: list[tuple[str, Callable[[Any], object], str]] = [
    ("semaphore_read", lambda sem: pl.semaphore_read(sem), "dtype int32"),
    ("safedma_read", lambda sem: safedma.read(sem), "dtype int32"),
    ("sem_getitem", lambda sem: sem[()], "an array value of shape ()"),
    ("jnp_scalar", lambda sem: jnp.int32(0), "dtype int32"),
    ("python_int", lambda sem: 0, "int 0"),
]
_SEM_VALUE_IDS = [i for i, _, _ in _SEM_VALUES]
_SEM_VALUE_ARGS = [(f, w) for _, f, w in _SEM_VALUES]
_S1_FIX = ("not the semaphore itself", "safedma.dma_semaphore()", "sems.at[i]")


@pytest.mark.parametrize(("value_of", "words"), _SEM_VALUE_ARGS, ids=_SEM_VALUE_IDS)
def test_s1_semaphore_value_as_remote_send_semaphore(
    value_of: Callable[[Any], object], words: str
) -> None:
    # The seed: a value read from a semaphore passed where the semaphore ref belongs.
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, value_of(send_sem), recv_sem).start().wait()

    with pytest.raises(safedma.NotARefError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "RemoteCopy send semaphore", words, *_S1_FIX)
    assert isinstance(err.value, TypeError)


@pytest.mark.parametrize(("value_of", "words"), _SEM_VALUE_ARGS, ids=_SEM_VALUE_IDS)
def test_s1_semaphore_value_as_remote_receive_semaphore(
    value_of: Callable[[Any], object], words: str
) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, value_of(recv_sem)).start().wait()

    with pytest.raises(safedma.NotARefError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "RemoteCopy receive semaphore", words, *_S1_FIX)


@pytest.mark.parametrize(("value_of", "words"), _SEM_VALUE_ARGS, ids=_SEM_VALUE_IDS)
def test_s1_semaphore_value_as_local_semaphore(
    value_of: Callable[[Any], object], words: str
) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, value_of(sem)).start().wait()

    with pytest.raises(safedma.NotARefError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(err, "LocalCopy semaphore", words, *_S1_FIX)


@pytest.mark.parametrize("op", ["signal", "wait"])
def test_s1_semaphore_value_to_signal_or_wait(op: str) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        getattr(safedma, op)(safedma.read(sem))

    with pytest.raises(safedma.NotARefError) as err:
        trace(kernel, [safedma.regular_semaphore()])
    assert_mentions(
        err, f"{op}() semaphore", "not the semaphore itself", "safedma.regular_semaphore()"
    )


# ------------------------------------ S2: a semaphore array where one semaphore belongs

_S2_FIX = ("must be one semaphore", "Select one with sems.at[i]")


def test_s2_semaphore_array_to_local_copy() -> None:
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems).start().wait()

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace(kernel, [VMEM, safedma.dma_semaphores(2)])
    assert_mentions(
        err, "LocalCopy semaphore", "array of 2 semaphores", "sems dma_sem[2]", *_S2_FIX
    )
    assert isinstance(err.value, ValueError)


def test_s2_semaphore_array_on_a_wait_only_path() -> None:
    # Today: no Python check at all on this path (Mosaic verifier / callback TypeError).
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems).started_elsewhere().wait()

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace(kernel, [VMEM, safedma.dma_semaphores(2)])
    assert_mentions(err, "sems dma_sem[2]", *_S2_FIX)


def test_s2_semaphore_slice_is_still_an_array() -> None:
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems.at[pl.ds(0, 1)]).start().wait()

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace(kernel, [VMEM, safedma.dma_semaphores(2)])
    assert_mentions(err, "array of 1 semaphores", "sems.at[...] dma_sem[1]", *_S2_FIX)


def test_s2_half_indexed_2d_semaphore_array() -> None:
    def kernel(x_ref, o_ref, buf, sems):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sems.at[0]).start().wait()

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace(kernel, [VMEM, pltpu.SemaphoreType.DMA((2, 3))])
    assert_mentions(
        err,
        "array of 3 semaphores",
        "sems.at[...]",
        "must be one semaphore",
        "Select one with sems.at[i, j]",
    )


@pytest.mark.parametrize("which", ["send", "recv"])
def test_s2_semaphore_array_to_remote_copy(which: str) -> None:
    def kernel(x_ref, o_ref, send_sems, recv_sems):  # type: ignore[no-untyped-def]
        send = send_sems if which == "send" else send_sems.at[0]
        recv = recv_sems if which == "recv" else recv_sems.at[0]
        ring(x_ref, o_ref, send, recv).start().wait()

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace_on_mesh(kernel, [safedma.dma_semaphores(2), safedma.dma_semaphores(2)])
    role = "send" if which == "send" else "receive"
    assert_mentions(err, f"RemoteCopy {role} semaphore", f"{which}_sems dma_sem[2]", *_S2_FIX)


@pytest.mark.parametrize("op", ["signal", "wait"])
def test_s2_regular_semaphore_array_to_signal_or_wait(op: str) -> None:
    def kernel(x_ref, o_ref, sems):  # type: ignore[no-untyped-def]
        getattr(safedma, op)(sems)

    with pytest.raises(safedma.SemaphoreShapeError) as err:
        trace(kernel, [safedma.regular_semaphores(2)])
    assert_mentions(err, f"{op}() semaphore", "sems semaphore[2]", *_S2_FIX)


def test_s2_indexing_a_single_semaphore_again_fails_in_jax() -> None:
    # safedma cannot intercept `sem.at[0]` (brands are plain refs at run time):
    # jax's own ValueError fires, at trace time. Statically, SemRef has no `.at`.
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem.at[0]).start().wait()

    with pytest.raises(ValueError, match="indices"):
        trace(kernel, [VMEM, DMA])


# ------------------------------------------------------- S3: wrong semaphore kind


def test_s3_barrier_semaphore_to_local_copy() -> None:
    def kernel(x_ref, o_ref, buf):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, safedma.barrier_semaphore()).start().wait()

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace(kernel, [VMEM], compiler_params=pltpu.CompilerParams(collective_id=0))
    assert_mentions(err, "got a BARRIER semaphore", "safedma.dma_semaphore()")


def test_s3_regular_semaphore_as_remote_send_semaphore() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).start().wait()

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace_on_mesh(kernel, [safedma.regular_semaphore(), DMA])
    assert_mentions(
        err,
        "RemoteCopy send semaphore",
        "REGULAR semaphore (send_sem semaphore[])",
        "a remote copy cannot use it",
    )


def test_s3_barrier_semaphore_as_remote_receive_semaphore() -> None:
    def kernel(x_ref, o_ref, send_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, safedma.barrier_semaphore()).start().wait()

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace_on_mesh(kernel, [DMA])
    assert_mentions(err, "RemoteCopy receive semaphore", "BARRIER semaphore")


@pytest.mark.parametrize("op", ["signal", "wait"])
def test_s3_dma_semaphore_to_signal_or_wait(op: str) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        getattr(safedma, op)(sem)

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace(kernel, [DMA])
    assert_mentions(
        err,
        f"{op}() semaphore must be a REGULAR semaphore or a BARRIER semaphore",
        "got a DMA semaphore (sem dma_sem[])",
        "safedma.regular_semaphore()",
    )


# ----------------------------------------------- S4: half-built remote copy (cast to Any)

_HALF_BUILT: list[tuple[str, Callable[[Any, Any], Any], tuple[str, ...]]] = [
    (
        "no_send_sem",
        lambda copy, send: copy.to(safedma.neighbour("x")),
        ("send semaphore (call .with_send_sem(sem))",),
    ),
    (
        "no_device",
        lambda copy, send: copy.with_send_sem(send),
        ("target device (call .to(device))",),
    ),
    ("neither", lambda copy, send: copy, (".with_send_sem(sem)", ".to(device)")),
]


@pytest.mark.parametrize("action", ["start", "started_elsewhere", "incoming"])
@pytest.mark.parametrize(
    ("build", "words"), [(b, w) for _, b, w in _HALF_BUILT], ids=[i for i, _, _ in _HALF_BUILT]
)
def test_s4_half_built_remote_copy(
    build: Callable[[Any, Any], Any], words: tuple[str, ...], action: str
) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        copy = typing.cast(Any, build(safedma.RemoteCopy(x_ref, o_ref, recv_sem), send_sem))
        getattr(copy, action)()

    with pytest.raises(safedma.IncompleteCopyError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    verb = "cannot start" if action == "start" else "cannot be waited"
    assert_mentions(
        err,
        "RemoteCopy x_ref float32[2,8,128] -> o_ref float32[2,8,128]",
        verb,
        *words,
        "A remote copy needs both",
        "LocalCopy",
    )
    assert isinstance(err.value, TypeError)


@pytest.mark.parametrize("target", [(1,), {"x": 1}, 1], ids=["tuple", "dict", "int"])
def test_s4_s7_remote_copy_to_a_raw_device_id(target: object) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem)
        copy.to(target).start().wait()

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(
        err,
        "RemoteCopy.to() takes a safedma.Device",
        repr(target),
        "safedma.device(x=i)",
        "safedma.neighbour('x')",
    )


# ----------------------------------------------------- S5: waiting on the wrong side


@pytest.mark.parametrize("method", ["wait_send", "wait_recv", "wait_read"])
def test_s5_remote_waits_on_a_local_copy(method: str) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        getattr(safedma.LocalCopy(x_ref, buf, sem).start(), method)()

    with pytest.raises(
        safedma.WrongOperationError,
        match=rf"LocalHandle has no {method}\(\): a local copy has no send or receive side; call wait\(\)",
    ):
        trace(kernel, [VMEM, DMA])


def test_s5_send_side_wait_on_an_incoming_copy() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        ring(x_ref, o_ref, send_sem, recv_sem).incoming().wait_send()

    with pytest.raises(
        safedma.WrongOperationError,
        match=r"IncomingHandle has no wait_send\(\): the receiving side only has wait_recv\(\)",
    ):
        trace_on_mesh(kernel, TWO_DMA)


# --------------------------------------------------- S6: data and semaphore swapped


@pytest.mark.parametrize("side", ["source", "destination"])
def test_s6_semaphore_as_copy_data(side: str) -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        src, dst = (sem, buf) if side == "source" else (x_ref, sem)
        safedma.LocalCopy(src, dst, sem).start().wait()

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(
        err,
        f"LocalCopy {side} must be a data ref",
        "got a DMA semaphore (sem dma_sem[])",
        "Data and semaphore arguments are swapped",
    )


# A RemoteCopy argument missing (T6) or of the wrong kind (S6): the arguments of
# ring(source, destination, send, receive) by kernel parameter name, None for missing.
_RING_MISUSE: dict[str, tuple[tuple[str | None, ...], type[Exception], tuple[str, ...]]] = {
    "no_receive_semaphore": (
        ("x_ref", "o_ref", "send_sem", None),
        safedma.MissingSemaphoreError,
        ("RemoteCopy receive semaphore is missing", "safedma.dma_semaphore()"),
    ),
    "none_send_semaphore": (
        ("x_ref", "o_ref", None, "recv_sem"),
        safedma.MissingSemaphoreError,
        ("RemoteCopy send semaphore is missing", "safedma.dma_semaphore()"),
    ),
    "semaphore_as_source": (
        ("send_sem", "o_ref", "send_sem", "recv_sem"),
        safedma.SemaphoreKindError,
        ("RemoteCopy source must be a data ref", "send_sem dma_sem[]"),
    ),
    "data_ref_as_send_semaphore": (
        ("x_ref", "o_ref", "o_ref", "recv_sem"),
        safedma.SemaphoreKindError,
        ("RemoteCopy send semaphore", "got a data ref (o_ref float32[2,8,128])"),
    ),
}


@pytest.mark.parametrize("case", list(_RING_MISUSE))
def test_remote_copy_argument_missing_or_of_the_wrong_kind(case: str) -> None:
    names, error, words = _RING_MISUSE[case]

    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        refs = {"x_ref": x_ref, "o_ref": o_ref, "send_sem": send_sem, "recv_sem": recv_sem}
        ring(*(None if n is None else refs[n] for n in names)).start().wait()

    with pytest.raises(error) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, *words)


def test_s6_data_ref_to_signal() -> None:
    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        safedma.signal(o_ref)

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace(kernel)
    assert_mentions(err, "signal() semaphore", "got a data ref (o_ref float32[2,8,128])")


def test_s6_value_as_copy_source() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref[...], buf, sem).start().wait()

    with pytest.raises(safedma.NotARefError) as err:
        trace(kernel, [VMEM, DMA])
    assert_mentions(
        err,
        "LocalCopy source must be a data ref",
        "array value of shape (2, 8, 128) and dtype float32",
        "ref.at[...]",
        "instead of a value read from it",
    )


# ------------------------------------------------------ S7: device id of the wrong form

_BAD_INDICES = [
    pytest.param(lambda: 1.0, ("got float 1.0",), id="python_float"),
    pytest.param(lambda: "1", ("got str '1'",), id="string"),
    pytest.param(lambda: [1], ("got list [1]",), id="list"),
    pytest.param(lambda: True, ("got bool True",), id="bool"),
    pytest.param(
        lambda: jnp.float32(1), ("integer scalar", "dtype float32", "truncated"), id="float_scalar"
    ),
    pytest.param(
        lambda: safedma.my_index("x").astype(jnp.float32),
        ("integer scalar", "dtype float32", "compute it in integers"),
        id="traced_float",
    ),
    pytest.param(
        lambda: jnp.array([1, 2], jnp.int32), ("integer scalar", "shape (2,)"), id="int_vector"
    ),
]


@pytest.mark.parametrize(("index", "words"), _BAD_INDICES)
@pytest.mark.parametrize("form", ["device", "mesh_coords"])
def test_s7_device_index_of_the_wrong_form(
    index: Callable[[], object], words: tuple[str, ...], form: str
) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        target = safedma.device(x=index()) if form == "device" else safedma.mesh_coords(index())
        copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem)
        copy.to(target).start().wait()

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel, TWO_DMA)
    assert_mentions(err, "device index for axis 'x'", *words)


def test_s7_neighbour_shift_not_an_int() -> None:
    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        safedma.neighbour("x", 1.0)

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel)
    assert_mentions(err, "neighbour shift must be a Python int", "1.0")


# ------------------------------------------------- S8: remote semaphore signal plumbing


def test_s8_dma_semaphore_signalled_remotely() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        safedma.signal(sem, device=safedma.neighbour("x"))

    with pytest.raises(safedma.SemaphoreKindError) as err:
        trace_on_mesh(kernel, [DMA])
    assert_mentions(err, "signal() semaphore", "got a DMA semaphore (sem dma_sem[])")


@pytest.mark.parametrize("target", [(1,), {"x": 1}, 1.0], ids=["tuple", "dict", "float"])
def test_s8_remote_signal_with_a_raw_device_id(target: object) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        safedma.signal(sem, device=target)

    with pytest.raises(safedma.DeviceIdError) as err:
        trace_on_mesh(kernel, [safedma.regular_semaphore()])
    assert_mentions(
        err, "signal(device=...) takes a safedma.Device", repr(target), "safedma.device(x=i)"
    )


@pytest.mark.parametrize("op", ["signal", "wait"])
def test_s8_float_semaphore_amount(op: str) -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        getattr(safedma, op)(sem, 1.0)

    with pytest.raises(safedma.SafeDmaError) as err:
        trace(kernel, [safedma.regular_semaphore()])
    assert_mentions(err, "must be an int or an integer jax array", "float 1.0")


# ---------------------------------------- S9: only a started copy's handle can be waited


@pytest.mark.parametrize("method", ["wait", "wait_send", "wait_recv"])
def test_s9_unstarted_remote_copy_cannot_be_waited(method: str) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        getattr(ring(x_ref, o_ref, send_sem, recv_sem), method)()

    with pytest.raises(
        safedma.WrongOperationError,
        match=rf"RemoteCopy has no {method}\(\): a copy description cannot be waited. Wait the handle that start\(\) returns",
    ):
        trace_on_mesh(kernel, TWO_DMA)


def test_s9_unstarted_local_copy_cannot_be_waited() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref, buf, sem).wait()

    with pytest.raises(
        safedma.WrongOperationError,
        match=r"LocalCopy has no wait\(\): a copy description cannot be waited.*started_elsewhere\(\)",
    ):
        trace(kernel, [VMEM, DMA])


def test_t1_numpy_int_sizes_are_shown_as_numbers() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        safedma.LocalCopy(x_ref.at[0, pl.ds(0, np.int32(4))], o_ref.at[1], sem).start().wait()

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace(kernel, [DMA])
    assert_mentions(err, "(4, 128) and (8, 128)", "float32[4,128]")


def test_t1_a_static_size_opposite_a_traced_size_is_caught_by_sync_copy() -> None:
    # pltpu.sync_copy lowers to the same DMA, which Mosaic's verifier rejects the same way.
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        safedma.sync_copy(x_ref.at[0, pl.ds(0, pl.program_id(0) + 8)], buf.at[0])

    with pytest.raises(safedma.CopyShapeMismatchError) as err:
        trace(kernel, [VMEM, DMA], grid=(1,))
    assert_mentions(err, "sync_copy", "(?, 128) and (8, 128)", "dimension 0")
