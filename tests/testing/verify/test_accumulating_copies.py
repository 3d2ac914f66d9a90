"""A copy started with ``add=True`` (SparseCore: the destination += the source) under
verify: refused, not verified as a copy that overwrites, which would hide an add into a
buffer nothing wrote.

Each kernel here is written for this file in raw pltpu; each correct one must verify clean
and each seeded mistake must still be caught, naming this file's line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import VerificationUnsupportedError, abstract_mesh, verify

F32 = jnp.float32
HERE = r"test_accumulating_copies\.py:\d+"


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


# ---------------------------------------------------- a copy that adds into its target


def _adding_copy(add: bool) -> Any:
    """Each (core, subcore) of a SparseCore mesh copies its 8 rows into a fresh output,
    overwriting them or (``add=True``) adding into what is there: nothing, here."""
    from jax.experimental.pallas import tpu_sc as plsc

    def body(x_ref: Any, o_ref: Any, buf: Any, sem: Any) -> None:
        me = lax.axis_index(("core", "subcore"))
        pltpu.sync_copy(x_ref.at[pl.ds(me * 8, 8)], buf)
        copy = pltpu.make_async_copy(buf, o_ref.at[pl.ds(me * 8, 8)], sem)
        copy.start(add=add)
        copy.wait()

    def fn(x: jax.Array) -> Any:
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


def test_a_copy_that_adds_into_its_destination_is_refused_not_taken_as_a_write() -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh((), (), tpu="tpu7x")):
        assert verify(_adding_copy(False), _s(64, 128)).dmas == 16
        with pytest.raises(VerificationUnsupportedError, match=rf"add=True.*{HERE}"):
            verify(_adding_copy(True), _s(64, 128))
