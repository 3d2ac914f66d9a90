"""Pass: a remote ring permute over mesh axis "x", run under jax.shard_map.

``RemoteCopy(src, dst, recv).with_send_sem(send).to(device).start()`` returns
a RemoteHandle; the builder's type records which parts are given. Must pass
``mypy --strict`` and pyright strict with no ``# type: ignore``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec
from typing import assert_type

import safedma
from safedma import DataRef, Given, Missing, RemoteCopy, SemRef

# Both classes have unannotated __init__s in jax 0.10.2 and 0.12: calling them
# directly is [no-untyped-call] under --strict.
ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
Spec: Callable[..., PartitionSpec] = PartitionSpec


def ring_kernel(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    bare = RemoteCopy(x_ref, o_ref, recv_sem)
    assert_type(bare, RemoteCopy[Missing, Missing])
    with_send = bare.with_send_sem(send_sem)
    assert_type(with_send, RemoteCopy[Given, Missing])
    right = safedma.neighbour("x")
    assert_type(right, safedma.Device)
    ready = with_send.to(right)
    assert_type(ready, RemoteCopy[Given, Given])

    handle = ready.start()
    assert_type(handle, safedma.RemoteHandle)
    handle.wait()


def ring_kernel_chained(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    """The one-line spelling, and the two builder steps in the other order."""
    RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(
        safedma.neighbour("x")
    ).start().wait()

    back = RemoteCopy(o_ref, x_ref, recv_sem).to(safedma.neighbour("x", -1))
    assert_type(back, RemoteCopy[Missing, Given])
    h = back.with_send_sem(send_sem).start(priority=0)
    h.wait_send()
    h.wait_recv()


def ring_permute(x: jax.Array, mesh: Mesh) -> jax.Array:
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    n = x.shape[0] // mesh.shape["x"]
    call = safedma.pallas_call(
        ring_kernel,
        ShapeDtype((n, *x.shape[1:]), x.dtype),
        in_specs=[any_spec],
        out_specs=any_spec,
        scratch_shapes=[safedma.dma_semaphore(), safedma.dma_semaphore()],
        interpret=pltpu.InterpretParams(dma_execution_mode="eager"),
    )
    per_device: Callable[[jax.Array], jax.Array] = call
    sharded = jax.shard_map(
        per_device, mesh=mesh, in_specs=Spec("x"), out_specs=Spec("x"), check_vma=False
    )
    out = sharded(x)
    assert_type(out, jax.Array)
    return out
