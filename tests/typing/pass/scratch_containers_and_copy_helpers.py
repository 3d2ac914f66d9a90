"""Pass: shapes found in production DMA kernels.

* a scratch list held in a variable, mixing data and semaphore scratch, given to a grid
  spec and to ``safedma.pallas_call`` (mypy joins its items: ``Scratch`` is covariant);
* a dict of scratch inside the scratch tuple, the kernel taking it as one
  ``Mapping[str, SemRef]`` argument;
* helpers that start a remote copy and discard the handle, and helpers that wait its send
  and receive sides through ``started_elsewhere()`` / ``incoming()`` (logical device ids);
* a helper returning a complete ``RemoteCopy``, started in one loop and waited in another;
* a keyword ``run_scoped`` used as a ``functools.partial`` decorator.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma
from safedma import DataRef, Given, RegularSem, RemoteCopy, SemArray, SemRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
ANY = pl.BlockSpec(memory_space=pl.ANY)


def send_to(src: DataRef, dst: DataRef, target: jax.Array, send: SemRef, recv: SemRef) -> None:
    RemoteCopy(src, dst, recv).with_send_sem(send).to(safedma.logical_device(target)).start()


def sent(src: DataRef, send: SemRef) -> None:
    copy = RemoteCopy(src, src, send).with_send_sem(send).to(safedma.logical_device(0))
    copy.started_elsewhere().wait_send()


def received(dst: DataRef, recv: SemRef) -> None:
    copy = RemoteCopy(dst, dst, recv).with_send_sem(recv).to(safedma.logical_device(0))
    copy.incoming().wait_recv()


def swap_pairs(x_ref: DataRef, o_ref: DataRef, sems: Mapping[str, SemRef]) -> None:
    partner = safedma.my_index("x") ^ 1
    send_to(x_ref, o_ref, partner, sems["send"], sems["recv"])
    sent(x_ref, sems["send"])
    received(o_ref, sems["recv"])


def swap(x: jax.Array) -> jax.Array:
    sems = {"send": safedma.dma_semaphore(), "recv": safedma.dma_semaphore()}
    return safedma.pallas_call(
        swap_pairs,
        ShapeDtype(x.shape, x.dtype),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=(sems,),
    )(x)


def exchange(
    x_ref: DataRef,
    o_ref: DataRef,
    recv_buf: DataRef,
    send_sems: SemArray,
    recv_sems: SemArray,
    buf: DataRef,
    *,
    peers: int,
) -> None:
    me = safedma.my_index("x")

    def second_round() -> None:
        @functools.partial(safedma.run_scoped, flag=safedma.regular_semaphore())
        def _(flag: RegularSem) -> None:
            safedma.signal(flag, 1, device=safedma.neighbour("x"))
            safedma.wait(flag, 1)

    def to_peer(offset: int) -> RemoteCopy[Given, Given]:
        peer = jax.lax.rem(me + offset, peers + 1)
        return (
            RemoteCopy(x_ref, recv_buf.at[offset - 1], recv_sems.at[offset - 1])
            .with_send_sem(send_sems.at[offset - 1])
            .to(safedma.mesh_coords(peer))
        )

    second_round()
    for offset in range(1, peers + 1):
        to_peer(offset).start()
    for offset in range(1, peers + 1):
        to_peer(offset).started_elsewhere().wait()
    safedma.LocalCopy(recv_buf.at[0], buf, send_sems.at[0]).start().wait()
    safedma.LocalCopy(buf, o_ref, send_sems.at[0]).start().wait()


def exchange_call(x: jax.Array, peers: int) -> jax.Array:
    rows, cols = x.shape
    scratch = [
        safedma.vmem((peers, rows, cols), x.dtype),
        safedma.dma_semaphores(peers),
        safedma.dma_semaphores(peers),
        safedma.vmem((rows, cols), jnp.float32),
    ]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch
    )
    return safedma.pallas_call(
        functools.partial(exchange, peers=peers),
        ShapeDtype(x.shape, x.dtype),
        grid_spec=grid_spec,
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def scratch_list_to_pallas_call(x: jax.Array) -> jax.Array:
    def body(x_ref: DataRef, o_ref: DataRef, buf: DataRef, sems: SemArray) -> None:
        safedma.LocalCopy(x_ref, buf, sems.at[0]).start().wait()
        safedma.LocalCopy(buf, o_ref, sems.at[1]).start().wait()

    scratch = [safedma.vmem(x.shape, x.dtype), safedma.dma_semaphores(2)]
    return safedma.pallas_call(
        body, ShapeDtype(x.shape, x.dtype), in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch
    )(x)
