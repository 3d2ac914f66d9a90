"""``pl.kernel`` over a mesh with two axes (SparseCore's core x subcore) under verify: each
core and subcore is a participant with its own copies.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import RaceDetectedError, UnwrittenReadError, abstract_mesh, verify

F32 = jnp.float32
HERE = r"test_core_meshes\.py:\d+"


def _s(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


# ------------------------------------------------- pl.kernel over two axes


def _subcore_copy(by_subcore_only: bool) -> Any:
    """Each (core, subcore) of a 2 x 4 mesh copies its own 8 rows through VMEM."""
    from jax.experimental.pallas import tpu_sc as plsc

    def body(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        if by_subcore_only:
            me = jax.lax.axis_index("subcore")
        else:
            me = jax.lax.axis_index(("core", "subcore"))
        c = pltpu.make_async_copy(x_ref.at[pl.ds(me * 8, 8)], buf, sem)
        c.start()
        c.wait()
        c = pltpu.make_async_copy(buf, o_ref.at[pl.ds(me * 8, 8)], sem)
        c.start()
        c.wait()

    def fn(x: Any) -> Any:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=2, num_subcores=4
        )
        return pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA],
        )(x)

    return fn


def _sc_mesh() -> Any:
    return jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="tpu7x"))


def test_each_core_and_subcore_is_a_participant() -> None:
    with _sc_mesh():
        report = verify(_subcore_copy(False), _s(64, 128))
    assert report.dmas == 16


def test_two_cores_writing_the_same_rows_race() -> None:
    with _sc_mesh():
        with pytest.raises((RaceDetectedError, UnwrittenReadError), match=HERE):
            verify(_subcore_copy(True), _s(64, 128))
