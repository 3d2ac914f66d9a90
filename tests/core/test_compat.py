"""safedma's use of jax internals, pinned: fails loudly if a jax release moves them.

Everything here goes through safedma._compat, the one module that touches
jax._src; if one of these tests fails after a jax upgrade, _compat is the
place to adapt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import safedma as sd
from safedma import _compat
from safedma._compat import SemaphoreKind

HBM = pl.BlockSpec(memory_space=pl.ANY)


def test_supported_jax_version() -> None:
    assert (0, 10, 2) <= _compat.JAX_VERSION < (0, 13)


def test_brands_are_identity_at_run_time() -> None:
    marker = object()
    for brand in (
        sd.SemRef,
        sd.SemArray,
        sd.RegularSem,
        sd.RegularSemArray,
        sd.BarrierSem,
        sd.DataRef,
    ):
        assert brand(marker) is marker  # type: ignore[arg-type]


def test_ref_kinds_and_roots_inside_a_kernel() -> None:
    seen: dict[str, object] = {}

    def body(x, o, dma, dmas, reg, buf):  # type: ignore[no-untyped-def]
        view = dmas.at[1]
        seen.update(
            x=_compat.ref_kind(x),
            dma=_compat.ref_kind(dma),
            view=_compat.ref_kind(view),
            reg=_compat.ref_kind(reg),
            buf=_compat.ref_kind(buf),
            value_is_ref=_compat.is_ref(x[...]),
            view_is_ref=_compat.is_ref(view),
            root_is_array=_compat.root_of(view) is dmas,
            plain_root=_compat.root_of(x) is x,
            view_shape=tuple(view.shape),
            barrier=_compat.ref_kind(pltpu.get_barrier_semaphore()),
        )
        c = pltpu.make_async_copy(x, o, dma)
        c.start()
        c.wait()

    x = jnp.zeros((8, 128), jnp.float32)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.REGULAR(()),
            pltpu.VMEM((8, 128), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )
    jax.jit(call).trace(x)
    assert seen == dict(
        x=SemaphoreKind.DATA,
        dma=SemaphoreKind.DMA,
        view=SemaphoreKind.DMA,
        reg=SemaphoreKind.REGULAR,
        buf=SemaphoreKind.DATA,
        value_is_ref=False,
        view_is_ref=True,
        root_is_array=True,
        plain_root=True,
        view_shape=(),
        barrier=SemaphoreKind.BARRIER,
    )


def test_ref_layout_agrees_with_the_views_own_type() -> None:
    # ref_layout's fast path reads the indexer instead of the view's type; both
    # must give the same (shape, dtype) for every kind of view a kernel makes.
    pairs: list[tuple[str, object, object]] = []

    def body(x, i_ref, o, dmas, buf):  # type: ignore[no-untyped-def]
        i = i_ref[0]
        views = {
            "plain": x,
            "rows": x.at[pl.ds(8, 8)],
            "int": x.at[3],
            "strided": x.at[pl.ds(0, 4, 2)],
            "traced start": x.at[pl.ds(i, 8)],
            "int and slice": buf.at[1, pl.ds(0, 4)],
            "last dim": x.at[:, pl.ds(0, 128)],
            "nested": x.at[pl.ds(8, 16)].at[pl.ds(0, 8)],
            "sem view": dmas.at[1],
            "sem array": dmas,
            "sem slice": dmas.at[pl.ds(0, 2)],
            "bitcast": x.bitcast(jnp.int32),
            "reshape": buf.reshape(16, 128),
        }
        for name, view in views.items():
            fast = _compat.ref_layout(view)
            pairs.append((name, fast, (tuple(view.shape), view.dtype)))
        o[...] = x[...]

    x = jnp.zeros((32, 128), jnp.float32)
    call = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.SemaphoreType.DMA((3,)), pltpu.VMEM((2, 8, 128), jnp.float32)],
    )
    jax.jit(call).trace(x, jnp.zeros((1,), jnp.int32))
    assert len(pairs) == 13
    for name, fast, slow in pairs:
        assert fast == slow, name


def test_axes_in_scope_follow_the_mesh_order() -> None:
    seen: list[dict[str, int]] = []
    mesh = jax.make_mesh((2, 4), ("y", "x"), devices=jax.devices()[:8])

    def per_device(block: jax.Array) -> jax.Array:
        seen.append(dict(_compat.axes_in_scope()))
        return block

    x = jax.device_put(np.zeros((8, 8), np.float32), NamedSharding(mesh, P("y", "x")))
    jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=P("y", "x"), out_specs=P("y", "x"))
    ).trace(x)
    assert seen == [{"y": 2, "x": 4}]
    assert list(seen[0]) == ["y", "x"]
    assert dict(_compat.axes_in_scope()) == {}
