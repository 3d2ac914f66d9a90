"""Device-to-device exchanges written with helpers, as course labs and one-shot
collectives write them.

* a dict of scratch inside the scratch tuple, taken by the kernel as one argument;
  helpers that start a remote copy and drop the handle, and helpers that wait its send
  and receive sides on rebuilt copies (``started_elsewhere()`` / ``incoming()``), with
  LOGICAL device ids (a course lab's RDMA helpers);
* a helper returning a complete remote copy, started in one loop and waited in another,
  after an all-peer barrier and a second round on a keyword ``run_scoped`` used as a
  ``functools.partial`` decorator (a one-shot reduce-scatter).

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import assert_same_mosaic
from tests.support.four_devices import ROWS, N
from tests.support.four_devices import blocks as _x
from tests.support.four_devices import mesh as _mesh
from tests.support.ring_twins import sharded
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
LOGICAL = pl.DeviceIdType.LOGICAL
MESH_IDS = pl.DeviceIdType.MESH


# --- a course lab's RDMA helpers: dict scratch, rebuilt waits, LOGICAL ids ---------------


def _rdma_start(src: Any, dst: Any, target: Any, send: Any, recv: Any) -> None:
    sd.RemoteCopy(src, dst, recv).with_send_sem(send).to(sd.logical_device(target)).start()


def _rdma_sent(src: Any, send: Any) -> None:
    sd.RemoteCopy(src, src, send).with_send_sem(send).to(
        sd.logical_device(0)
    ).started_elsewhere().wait_send()


def _rdma_received(dst: Any, recv: Any) -> None:
    sd.RemoteCopy(dst, dst, recv).with_send_sem(recv).to(
        sd.logical_device(0)
    ).incoming().wait_recv()


def _rdma_start_raw(src: Any, dst: Any, target: Any, send: Any, recv: Any) -> None:
    pltpu.make_async_remote_copy(
        src, dst, send, recv, device_id=target, device_id_type=LOGICAL
    ).start()


def _rdma_sent_raw(src: Any, send: Any) -> None:
    pltpu.make_async_remote_copy(
        src, src, send, send, device_id=0, device_id_type=LOGICAL
    ).wait_send()


def _rdma_received_raw(dst: Any, recv: Any) -> None:
    pltpu.make_async_remote_copy(
        dst, dst, recv, recv, device_id=0, device_id_type=LOGICAL
    ).wait_recv()


HALVES = 2


def _halves(
    rdma: tuple[Callable[..., None], ...], *, drop_one_recv: bool = False
) -> Callable[..., None]:
    start, sent, received = rdma

    def kernel(x_ref: Any, o_ref: Any, flags: Any, sems: Any) -> None:
        partner = jax.lax.axis_index("x") ^ 1
        step = ROWS // HALVES
        for k in range(HALVES):
            part = pl.ds(k * step, step)
            start(x_ref.at[part], o_ref.at[part], partner, sems[f"send{k}"], sems[f"recv{k}"])
        for k in range(HALVES):
            part = pl.ds(k * step, step)
            sent(x_ref.at[part], sems[f"send{k}"])
            if not (drop_one_recv and k == 1):
                received(o_ref.at[part], sems[f"recv{k}"])
        for other in range(1, N):
            target = jax.lax.rem(jax.lax.axis_index("x") + other, N)
            if start is _rdma_start:
                sd.signal(flags.at[0], device=sd.logical_device(target))
            else:
                pl.semaphore_signal(flags.at[0], device_id=target, device_id_type=LOGICAL)
        (sd.wait if start is _rdma_start else pl.semaphore_wait)(flags.at[0], N - 1)

    return kernel


def _halves_call(
    kernel: Callable[..., None], entry: Any, dma: Any, regular: Any
) -> Callable[[jax.Array], jax.Array]:
    def per_device(x: jax.Array) -> jax.Array:
        sems = {f"{side}{k}": dma() for k in range(HALVES) for side in ("send", "recv")}
        out: jax.Array = entry(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[VMEM],
            out_specs=VMEM,
            scratch_shapes=(regular, sems),
        )(x)
        return out

    return per_device


SAFE = (_rdma_start, _rdma_sent, _rdma_received)
RAW = (_rdma_start_raw, _rdma_sent_raw, _rdma_received_raw)


def test_dict_scratch_and_rdma_helpers_match_raw() -> None:
    mesh = _mesh()
    ours = _halves_call(_halves(SAFE), sd.pallas_call, sd.dma_semaphore, sd.regular_semaphores(1))
    theirs = _halves_call(
        _halves(RAW),
        pl.pallas_call,
        lambda: pltpu.SemaphoreType.DMA(()),
        pltpu.SemaphoreType.REGULAR((1,)),
    )
    assert_same_mosaic(sharded(ours, mesh), sharded(theirs, mesh), _x(mesh), mesh=mesh)


def test_rdma_helpers_one_receive_wait_dropped_names_the_helper_and_its_caller() -> None:
    mesh = _mesh()
    broken = _halves_call(
        _halves(SAFE, drop_one_recv=True),
        sd.pallas_call,
        sd.dma_semaphore,
        sd.regular_semaphores(1),
    )
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        jax.eval_shape(sharded(broken, mesh), _x(mesh))
    message = str(err.value)
    helper = _rdma_start.__code__.co_firstlineno + 1
    caller = line_in(_halves, "start(x_ref.at[part]")
    assert f"{__file__}:{helper} (called from {__file__}:{caller})" in message, message
    assert "wait_recv() never called" in message and "incoming()" in message


# --- a one-shot exchange: all-peer barrier, partial run_scoped, copies from a helper -----


def _one_shot(safe: bool, *, drop_send_waits: bool = False) -> Callable[..., None]:
    def kernel(
        x_ref: Any,
        o_ref: Any,
        recv_hbm: Any,
        own_sem: Any,
        send_sems: Any,
        recv_sems: Any,
        buf: Any,
        *,
        peers: int,
    ) -> None:
        me = jax.lax.axis_index("x")
        barrier = sd.barrier_semaphore() if safe else pltpu.get_barrier_semaphore()
        for offset in range(1, peers + 1):
            peer = jax.lax.rem(me + offset, peers + 1)
            if safe:
                sd.signal(barrier, 1, device=sd.mesh_coords(peer))
            else:
                pl.semaphore_signal(barrier, 1, device_id=(peer,), device_id_type=MESH_IDS)
        (sd.wait if safe else pl.semaphore_wait)(barrier, peers)

        scoped = sd.run_scoped if safe else pl.run_scoped
        second = sd.regular_semaphore() if safe else pltpu.SemaphoreType.REGULAR

        @functools.partial(scoped, flag=second)
        def _(flag: Any) -> None:
            if safe:
                sd.signal(flag, 1, device=sd.mesh_coords(jax.lax.rem(me + 1, peers + 1)))
                sd.wait(flag, 1)
            else:
                pl.semaphore_signal(
                    flag, 1, device_id=(jax.lax.rem(me + 1, peers + 1),), device_id_type=MESH_IDS
                )
                pl.semaphore_wait(flag, 1)

        rows = o_ref.shape[0] // (peers + 1)

        def to_peer(offset: int) -> Any:
            peer = jax.lax.rem(me + offset, peers + 1)
            src = x_ref.at[pl.ds(peer * rows, rows)]
            if not safe:
                return pltpu.make_async_remote_copy(
                    src,
                    recv_hbm.at[offset - 1],
                    send_sems.at[offset - 1],
                    recv_sems.at[offset - 1],
                    device_id=(peer,),
                    device_id_type=MESH_IDS,
                )
            copy = sd.RemoteCopy(src, recv_hbm.at[offset - 1], recv_sems.at[offset - 1])
            return copy.with_send_sem(send_sems.at[offset - 1]).to(sd.mesh_coords(peer))

        for offset in range(1, peers + 1):
            to_peer(offset).start()
        for offset in range(1, peers + 1):
            if not safe:
                to_peer(offset).wait()
            elif drop_send_waits:
                to_peer(offset).incoming().wait_recv()
            else:
                to_peer(offset).started_elsewhere().wait()
        own = x_ref.at[pl.ds(me * rows, rows)]
        if safe:
            sd.LocalCopy(own, buf, own_sem).start().wait()
        else:
            copy = pltpu.make_async_copy(own, buf, own_sem)
            copy.start()
            copy.wait()

    return kernel


def _one_shot_call(
    kernel: Callable[..., None], entry: Any, safe: bool
) -> Callable[[jax.Array], jax.Array]:
    peers = N - 1

    def per_device(x: jax.Array) -> jax.Array:
        rows = x.shape[0] // N
        dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
        dmas = sd.dma_semaphores(peers) if safe else pltpu.SemaphoreType.DMA((peers,))
        scratch = [dma, dmas, dmas, (sd.vmem if safe else pltpu.VMEM)((rows, 128), x.dtype)]
        out, _ = entry(
            functools.partial(kernel, peers=peers),
            [
                jax.ShapeDtypeStruct(x.shape, x.dtype),
                jax.ShapeDtypeStruct((peers, rows, 128), x.dtype),
            ],
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[ANY],
                out_specs=[ANY, ANY],
                scratch_shapes=scratch,
                grid=(1,),
            ),
            compiler_params=pltpu.CompilerParams(collective_id=0),
        )(x)
        result: jax.Array = out
        return result

    return per_device


def test_one_shot_exchange_matches_raw() -> None:
    mesh = _mesh(tpu="v5p")  # run_scoped scratch asks for the TPU generation on jax 0.12
    ours = _one_shot_call(_one_shot(True), sd.pallas_call, True)
    theirs = _one_shot_call(_one_shot(False), pl.pallas_call, False)
    assert_same_mosaic(sharded(ours, mesh), sharded(theirs, mesh), _x(mesh), mesh=mesh)


def test_one_shot_exchange_send_waits_dropped_is_t7() -> None:
    mesh = _mesh()
    broken = _one_shot_call(_one_shot(True, drop_send_waits=True), sd.pallas_call, True)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        jax.eval_shape(sharded(broken, mesh), _x(mesh))
    # The N - 1 sends start at one line with the same buffers: one line with their count.
    message = str(err.value)
    assert message.count("wait_send() never called") == 1, message
    assert f"  - {N - 1} copies of RemoteCopy x_ref.at[...]" in message, message
