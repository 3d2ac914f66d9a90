"""Device ids (``safedma/_devices.py``): a LOGICAL id built by safedma lowers without
jax's ``device_id_type`` deprecation warning. Copies and signals to logical ids against
their raw twins: tests/corpus/ring_collectives.py and tests/corpus/barriers.py.

Device ids over axes taken jointly (jax's ``{("y", "x"): i}``) lower like jax's and are
checked against the mesh."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic
from tests.corpus._calls import X_SHARDED, mesh_call, trace
from tests.corpus.ring_collectives import logical_send


def test_safedma_logical_ids_raise_no_jax_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(mesh_call(logical_send, [sd.dma_semaphore(), sd.dma_semaphore()]), X_SHARDED)


ANY = pl.BlockSpec(memory_space=pl.ANY)


def _like(x: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


# --- device ids over axes taken jointly (jax's {("y", "x"): i}) --------------------------


def _joint(x_ref: sd.DataRef, y_ref: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
    n = sd.axis_size(("y", "x"))
    target = sd.device({("y", "x"): jax.lax.rem(sd.my_index(("y", "x")) + 1, n)})
    sd.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(target).start().wait()


def _joint_raw(x_ref: Any, y_ref: Any, send: Any, recv: Any) -> None:
    n = jax.lax.axis_size(("y", "x"))
    target = {("y", "x"): jax.lax.rem(jax.lax.axis_index(("y", "x")) + 1, n)}
    copy = pltpu.make_async_remote_copy(x_ref, y_ref, send, recv, device_id=target)
    copy.start()
    copy.wait()


def _joint_call(body: Any, entry: Any, mesh: Any) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        return entry(
            body,
            _like(x),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
        )(x)

    spec = P(("y", "x"))
    return jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )


def test_joint_axis_device_ids_match_raw() -> None:
    mesh = abstract_mesh(
        (2, 3), ("y", "x"), tpu="v6e"
    )  # jax lowers a joint id with the chip's layout
    x = jax.ShapeDtypeStruct((6 * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("y", "x"))))
    assert_same_mosaic(
        _joint_call(_joint, sd.pallas_call, mesh),
        _joint_call(_joint_raw, pl.pallas_call, mesh),
        x,
        mesh=mesh,
    )


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: sd.device({("y", "z"): 0}), "unknown mesh axis 'z'"),
        (lambda: sd.device({("y", "x"): 6}), "index 6 is outside mesh axis .*'y', 'x'.* of size 6"),
        (lambda: sd.device({(): 0}), "names no axis"),
        (lambda: sd.device({0: 1}), "key 0 .* is not a mesh axis name"),
        (lambda: sd.my_index(("x", "w")), "unknown mesh axis 'w'"),
    ],
)
def test_joint_axis_device_ids_are_checked(make: Any, expected: str) -> None:
    mesh = abstract_mesh((2, 3), ("y", "x"))
    x = jax.ShapeDtypeStruct((6 * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("y", "x"))))

    def body(x_ref: sd.DataRef, y_ref: sd.DataRef, send: sd.SemRef, recv: sd.SemRef) -> None:
        target = make()
        assert isinstance(target, sd.Device)
        sd.RemoteCopy(x_ref, y_ref, recv).with_send_sem(send).to(target).start().wait()

    with pytest.raises(sd.DeviceIdError, match=expected):
        jax.eval_shape(_joint_call(body, sd.pallas_call, mesh), x)
