"""A pipeline input that first waits a peer's remote write (vLLM tpu-inference's
``collectives/hierrs_tc/dma_pipeline.py``, ``RemoteWaitBufferedRef``).

Chunks are pushed to the partner, then an ``emit_pipeline`` whose ``BufferedRef`` subclass
waits the write by size in ``copy_in`` before fetching, and waits the fetch by size in
``wait_in``: a receive waited in a pipeline hook pairs with the peer's copy.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.ring_twins import ALONG_X, sharded
from tests.support.source_lines import line_in

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False


# --- a pipeline input that first waits a peer's remote write ------------------------------

CHIPS, SEQ, COL = 2, 8, 128


def _remote_wait_bref(safe: bool, seed: str | None) -> Any:
    """A ``BufferedRef`` whose ``copy_in`` first waits, by size, for the remote write that
    fills the block it is about to read (tpu-inference's ``RemoteWaitBufferedRef``)."""

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class RemoteWaitBufferedRef(pltpu.BufferedRef):  # type: ignore[misc]
        recv_sem_fn: Callable[..., Any] | None = dataclasses.field(
            metadata={"static": True}, default=None
        )

        @classmethod
        def from_ref(cls, ref: Any, *, recv_sem_fn: Callable[..., Any] | None = None) -> Any:
            fields = {f.name: getattr(ref, f.name) for f in dataclasses.fields(pltpu.BufferedRef)}
            return cls(recv_sem_fn=recv_sem_fn, **fields)

        def copy_in(self, src_ref: Any, grid_indices: Any) -> None:
            if self.recv_sem_fn is None:
                return super().copy_in(src_ref, grid_indices)  # type: ignore[no-any-return]
            slot = self.current_copy_in_slot
            rows, sem = self.recv_sem_fn(grid_indices)
            window = self.window_ref.at[slot]
            if not safe:
                pltpu.make_async_copy(window, window, sem).wait()
                pltpu.make_async_copy(src_ref.at[rows], window, self.sem_recvs.at[slot]).start()
                return None
            if seed != "remote_wait_dropped":
                sd.wait_bytes(sem, window)
            sd.LocalCopy(src_ref.at[rows], window, self.sem_recvs.at[slot]).start()  # FETCH
            return None

        def wait_in(self, src_ref: Any, grid_indices: Any) -> None:
            if self.recv_sem_fn is None:
                return super().wait_in(src_ref, grid_indices)  # type: ignore[no-any-return]
            window = self.window_ref.at[self.current_wait_in_slot]
            sem = self.sem_recvs.at[self.current_wait_in_slot]
            if not safe:
                pltpu.make_async_copy(window, window, sem).wait()
            elif seed == "fetch_wait_on_the_recv_sems":
                sd.wait_bytes(self.recv_sem_fn(grid_indices)[1], window)
            else:
                sd.wait_bytes(sem, window)
            return None

    return RemoteWaitBufferedRef


def _remote_wait(safe: bool, seed: str | None = None) -> Callable[..., None]:
    bref = _remote_wait_bref(safe, seed)

    def kernel(x_hbm: Any, recv_hbm: Any, o_hbm: Any, send_sems: Any, recv_sems: Any) -> None:
        partner = 1 - lax.axis_index("x")
        handles: list[Any] = []
        for chip in range(CHIPS):  # phase 1: this device's chunks into the partner's buffer
            rows = pl.ds(chip * SEQ, SEQ)
            if safe:
                copy = sd.RemoteCopy(x_hbm.at[rows], recv_hbm.at[rows], recv_sems.at[chip, 0])
                send = copy.with_send_sem(send_sems.at[chip, 0]).to(sd.logical_device(partner))
                handles.append(send.start())  # PUSHED
            else:
                op = pltpu.make_async_remote_copy(
                    src_ref=x_hbm.at[rows],
                    dst_ref=recv_hbm.at[rows],
                    send_sem=send_sems.at[chip, 0],
                    recv_sem=recv_sems.at[chip, 0],
                    device_id=partner,
                    device_id_type=pl.DeviceIdType.LOGICAL,
                )
                op.start()
                handles.append(op)

        spec = pl.BlockSpec((SEQ, COL), lambda c: (c, 0))

        def recv_sem_fn(grid_indices: Any) -> tuple[Any, Any]:
            (chip,) = grid_indices
            return pl.ds(chip * SEQ, SEQ), recv_sems.at[chip, 0]

        def body(in_ref: Any, out_ref: Any) -> None:
            out_ref[...] = in_ref[...] * 2

        emit = sd.emit_pipeline if safe else pltpu.emit_pipeline
        pipeline = emit(body, grid=(CHIPS,), in_specs=[spec], out_specs=[spec])

        def scoped(in_alloc: Any, out_alloc: Any) -> None:
            remote_wait = bref.from_ref(in_alloc, recv_sem_fn=recv_sem_fn)
            pipeline(recv_hbm, o_hbm, allocations=[remote_wait, out_alloc])

        buffers = [pltpu.BufferedRef.input(spec, jnp.float32)]
        pl.run_scoped(scoped, *buffers, pltpu.BufferedRef.output(spec, jnp.float32))
        if seed != "send_waits_dropped":
            for handle in handles:
                handle.wait_send()

    return kernel


def _remote_wait_call(kernel: Callable[..., None], safe: bool) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        dmas = sd.dma_semaphores((CHIPS, 1)) if safe else pltpu.SemaphoreType.DMA((CHIPS, 1))
        call = sd.pallas_call if safe else pl.pallas_call
        like = jax.ShapeDtypeStruct(x.shape, x.dtype)
        _, out = call(
            kernel, (like, like), in_specs=[ANY], out_specs=(ANY, ANY), scratch_shapes=[dmas, dmas]
        )(x)
        result: jax.Array = out
        return result

    return per_device


def _rw(safe: bool, seed: str | None = None) -> tuple[Any, Any, jax.ShapeDtypeStruct]:
    mesh = abstract_mesh((2,), ("x",), tpu="v5p")  # emit_pipeline asks for the generation
    fn = sharded(_remote_wait_call(_remote_wait(safe, seed), safe), mesh, (ALONG_X,) * 1)
    x = jax.ShapeDtypeStruct(
        (2 * CHIPS * SEQ, COL), jnp.float32, sharding=NamedSharding(mesh, P("x"))
    )
    return fn, mesh, x


def test_pipeline_input_waiting_a_remote_write_matches_raw() -> None:
    # the fetch started in copy_in before the pipeline's loop, and waited in
    # wait_in inside it on the buffered ref the loop received as an argument, was a T7
    # false alarm (a block argument is a new tracer for the semaphore passed in).
    ours, mesh, x = _rw(SAFE)
    theirs, _, _ = _rw(RAW)
    assert_same_mosaic(ours, theirs, x, mesh=mesh)


@pytest.mark.parametrize(
    ("seed", "where", "never"),
    [
        ("send_waits_dropped", "# PUSHED", "wait_send()"),
        ("remote_wait_dropped", "# PUSHED", "wait_recv()"),
        ("fetch_wait_on_the_recv_sems", "# FETCH", "wait()"),
    ],
)
def test_pipeline_remote_wait_seeds_are_t7(seed: str, where: str, never: str) -> None:
    broken, mesh, x = _rw(SAFE, seed)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, x, mesh=mesh)
    message = str(err.value)
    source = _remote_wait if where == "# PUSHED" else _remote_wait_bref
    assert f"{__file__}:{line_in(source, where)}" in message, message
    assert f"{never} never called" in message, message
