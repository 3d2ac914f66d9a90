"""safedma.kernels.ppermute: exact results under strict simulation, twin identity, TPU builds.

Every block holds distinct random values, so a block sent to the wrong
device, or a device left with its own block, shows up as a mismatch with
``jax.lax.ppermute``; races, leftover semaphores and hangs fail the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tests.support.collectives import MESH_IDS, MESHES, TOPOLOGIES, blocks, compile_on, mapped, spec
from tests.support.twins import ppermute as twin
from safedma.kernels.ppermute import ppermute
from safedma.testing import (
    SignalAfterExitError,
    abstract_mesh,
    assert_same_mosaic,
    simulate,
    simulated_mesh,
    verify,
)

DType: TypeAlias = Any
F32, BF16 = jnp.float32, jnp.bfloat16
SHAPES = [(8, 128), (16, 256)]


def reference(x: jax.Array, mesh: Mesh, axis: str, shift: int) -> np.ndarray:
    n = mesh.shape[axis]

    def xla(block: jax.Array) -> jax.Array:
        out: jax.Array = jax.lax.ppermute(block, axis, [(j, (j + shift) % n) for j in range(n)])
        return out

    s = spec(tuple(mesh.axis_names))
    placed = jax.device_put(x, NamedSharding(mesh, s))
    return np.asarray(jax.jit(jax.shard_map(xla, mesh=mesh, in_specs=s, out_specs=s))(placed))


def check(
    mesh_shape: tuple[int, ...],
    names: tuple[str, ...],
    axis: str,
    shift: int,
    shape: tuple[int, ...],
    dtype: DType,
    collective_id: int | None = None,
    seed: int = 0,
) -> None:
    mesh = simulated_mesh(mesh_shape, names)
    x = blocks(int(np.prod(mesh_shape)), shape, dtype, seed)

    def per_device(block: jax.Array) -> jax.Array:
        return ppermute(block, axis=axis, shift=shift, collective_id=collective_id)

    s = spec(names)
    out = simulate(per_device, x, mesh=mesh, in_specs=s, out_specs=s)
    assert out.dtype == x.dtype and out.shape == x.shape
    expected = reference(x, mesh, axis, shift)
    np.testing.assert_array_equal(np.asarray(out), expected)
    if shift % mesh.shape[axis]:
        assert not np.array_equal(expected, np.asarray(x)), "the permute must move data"


# ------------------------------------------------------------ simulation


@pytest.mark.parametrize("shape", SHAPES, ids=["8x128", "16x256"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("mesh_shape,names,axis", MESHES, ids=MESH_IDS)
def test_matches_lax_ppermute(
    mesh_shape: tuple[int, ...],
    names: tuple[str, ...],
    axis: str,
    dtype: DType,
    shape: tuple[int, int],
) -> None:
    check(mesh_shape, names, axis, 1, shape, dtype)


@pytest.mark.parametrize("shift", [-5, -1, 0, 2, 3, 4, 7, 9])
def test_any_shift_on_a_ring_of_four(shift: int) -> None:
    """Negative, zero, multiples of the axis size and shifts past it."""
    check((4,), ("x",), "x", shift, (8, 128), F32)


@pytest.mark.parametrize("mesh_shape,names,axis", MESHES, ids=MESH_IDS)
def test_with_its_own_neighbour_barrier(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str
) -> None:
    check(mesh_shape, names, axis, -3, (8, 128), BF16, collective_id=7)


@pytest.mark.parametrize("second_shift", [-3, 3, 11], ids=["back", "again", "wrapped"])
def test_barrier_kernels_with_one_collective_id_and_the_same_peers_run_twice(
    second_shift: int,
) -> None:
    """Shifts 3 and -3 (or 3 and 11 on a ring of 8) meet the same two peers: one id serves both."""
    mesh = simulated_mesh((8,), ("x",))
    x = blocks(8, (8, 128), F32)

    def twice(block: jax.Array) -> jax.Array:
        once = ppermute(block, axis="x", shift=3, collective_id=0)
        return ppermute(once, axis="x", shift=second_shift, collective_id=0)

    verify(twice, x, mesh=mesh)
    out = simulate(twice, x, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), reference(x, mesh, "x", 3 + second_shift))


def test_barrier_kernels_with_other_peers_run_twice_on_their_own_ids() -> None:
    mesh = simulated_mesh((8,), ("x",))
    x = blocks(8, (8, 128), F32)

    def twice(block: jax.Array) -> jax.Array:
        once = ppermute(block, axis="x", shift=3, collective_id=0)
        return ppermute(once, axis="x", shift=-1, collective_id=1)

    verify(twice, x, mesh=mesh)
    out = simulate(twice, x, mesh=mesh)
    np.testing.assert_array_equal(np.asarray(out), reference(x, mesh, "x", 2))


def test_one_collective_id_for_two_peer_sets_is_reported() -> None:
    """Shift 3, then -1, on one id: a device done with the first call signals the
    barrier of a device still waiting in it (not its peer there), releasing it before
    its true peer has entered; the next signal reaches that peer early (R10)."""
    mesh = abstract_mesh((8,), ("x",))
    x = jax.ShapeDtypeStruct((64, 128), F32)

    def twice(block: jax.Array) -> jax.Array:
        once = ppermute(block, axis="x", shift=3, collective_id=0)
        return ppermute(once, axis="x", shift=-1, collective_id=0)

    with pytest.raises(SignalAfterExitError, match="collective_id=0"):
        verify(twice, x, mesh=mesh)


def test_interpret_argument_runs_without_simulate() -> None:
    mesh = simulated_mesh((4,), ("x",))
    x = blocks(4, (8, 128), F32)

    def per_device(block: jax.Array) -> jax.Array:
        return ppermute(block, axis="x", shift=-1, interpret=pltpu.InterpretParams())

    placed = jax.device_put(x, NamedSharding(mesh, P("x")))
    run = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    )
    np.testing.assert_array_equal(np.asarray(run(placed)), reference(x, mesh, "x", -1))


# ------------------------------------------------------------ properties


@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(
    mesh=st.sampled_from(MESHES),
    dtype=st.sampled_from([F32, BF16, jnp.int32, jnp.int8, jnp.uint16]),
    shape=st.sampled_from([(1, 128), (3, 5), (8, 128), (2, 4, 128), (24, 256)]),
    shift=st.integers(-17, 17),
    barrier=st.booleans(),
)
def test_any_mesh_dtype_shape_and_shift(
    mesh: tuple[tuple[int, ...], tuple[str, ...], str],
    dtype: DType,
    shape: tuple[int, ...],
    shift: int,
    barrier: bool,
) -> None:
    mesh_shape, names, axis = mesh
    check(mesh_shape, names, axis, shift, shape, dtype, 3 if barrier else None, seed=abs(shift))


# ------------------------------------------------------------ preconditions


def _in_mesh(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> None:
    """Trace ``fn`` inside a shard_map over a 4-device mesh "x" (preconditions only)."""
    mesh = abstract_mesh((4,), ("x",))
    spec_ = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P("x")))
    jax.eval_shape(
        jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False), spec_
    )


@pytest.mark.parametrize(
    "x,kwargs,message",
    [
        (jnp.zeros((32, 128)), {"axis": "z"}, "unknown mesh axis 'z'"),
        (jnp.zeros((32, 128)), {"axis": 0}, "mesh axis name"),
        (jnp.zeros((32, 128), jnp.bool_), {"axis": "x"}, "integer or floating"),
        (jnp.zeros((32, 128), jnp.complex64), {"axis": "x"}, "integer or floating"),
        (jnp.zeros((32, 128)), {"axis": "x", "shift": 1.0}, "shift must be a Python int"),
        (jnp.zeros((32, 128)), {"axis": "x", "shift": True}, "shift must be a Python int"),
        (
            jnp.zeros((32, 128)),
            {"axis": "x", "collective_id": -1},
            "collective_id must be None or a non-negative Python int",
        ),
    ],
    ids=[
        "unknown-axis",
        "axis-not-str",
        "bool",
        "complex",
        "float-shift",
        "bool-shift",
        "negative-id",
    ],
)
def test_preconditions_are_checked_up_front(
    x: jax.Array, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _in_mesh(lambda block: ppermute(block, **kwargs), x)


def test_a_scalar_block_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        _in_mesh(lambda block: ppermute(block.sum(), axis="x")[None], jnp.zeros((4,)))


def test_outside_shard_map_names_the_fix() -> None:
    with pytest.raises(ValueError, match="shard_map"):
        ppermute(jnp.zeros((8, 128)), axis="x")


# ------------------------------------------------------------ Mosaic identity


@pytest.mark.parametrize(
    "mesh_shape,names,axis,kwargs",
    [
        ((4,), ("x",), "x", {"shift": 1}),
        ((4,), ("x",), "x", {"shift": -3}),
        ((4,), ("x",), "x", {"shift": 4}),
        ((2, 4), ("y", "x"), "x", {"shift": 2, "collective_id": 5}),
        ((2, 4), ("y", "x"), "y", {"shift": 1, "collective_id": 0}),
    ],
    ids=["right", "left", "identity", "2x4-x-barrier", "2x4-y-barrier"],
)
def test_same_mosaic_as_the_pltpu_twin(
    mesh_shape: tuple[int, ...], names: tuple[str, ...], axis: str, kwargs: dict[str, Any]
) -> None:
    mesh = abstract_mesh(mesh_shape, names)
    x = jax.ShapeDtypeStruct(
        (int(np.prod(mesh_shape)) * 16, 256), BF16, sharding=NamedSharding(mesh, spec(names))
    )
    assert_same_mosaic(
        mapped(ppermute, mesh, axis, **kwargs), mapped(twin.ppermute, mesh, axis, **kwargs), x
    )


def test_mosaic_comparison_sees_the_shift() -> None:
    mesh = abstract_mesh((4,), ("x",))
    x = jax.ShapeDtypeStruct((32, 128), F32, sharding=NamedSharding(mesh, P("x")))
    with pytest.raises(AssertionError, match="Mosaic differs"):
        assert_same_mosaic(
            mapped(ppermute, mesh, "x", shift=1), mapped(twin.ppermute, mesh, "x", shift=2), x
        )


# ------------------------------------------------------------ TPU builds


def _compile(topology: str, mesh_shape: tuple[int, ...], axis: str, **kwargs: Any) -> None:
    compile_on(ppermute, topology, mesh_shape, axis, **kwargs)


def test_compiles_for_v6e() -> None:
    _compile("v6e:2x2", (4,), "x", shift=1)
    _compile("v6e:2x2", (4,), "x", shift=-1, collective_id=0)


@pytest.mark.parametrize(
    "mesh_shape,axis", [((4, 4), "x"), ((4, 4), "y"), ((16,), "x")], ids=["4x4-x", "4x4-y", "16"]
)
def test_compiles_for_16_chips(mesh_shape: tuple[int, ...], axis: str) -> None:
    _compile("v6e:4x4", mesh_shape, axis, shift=-3, collective_id=1)


@pytest.mark.parametrize(
    "mesh_shape,axis",
    [((16, 16), "x"), ((16, 16), "y"), ((256,), "x")],
    ids=["16x16-x", "16x16-y", "256"],
)
def test_compiles_for_256_chips(mesh_shape: tuple[int, ...], axis: str) -> None:
    _compile("v6e:16x16", mesh_shape, axis, shift=5, collective_id=1)


@pytest.mark.slow
@pytest.mark.parametrize("collective_id", [None, 2], ids=["device-barrier", "own-barrier"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_compiles_for_each_generation(topology: str, collective_id: int | None) -> None:
    _compile(topology, (4,), "x", shift=3, collective_id=collective_id)
