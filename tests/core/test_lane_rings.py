"""A per-lane ring rotation between the lanes of a pipeline's window buffer (the construct
of vLLM tpu-inference's batched RPA ``PcpRing``).

A startup barrier in ``pl.when`` on the first grid step, a per-step REGULAR handshake with
the previous device, then per lane a remote copy whose *receive* is waited in one
``pl.when`` and whose start is in another, the sends kept in a list and waited at the end
of the step in a third (through ``started_elsewhere()``); the semaphores are one scratch
entry, a pytree dataclass.

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
from tests.support.source_lines import line_in, raising_lines

ANY = pl.BlockSpec(memory_space=pl.ANY)
SAFE, RAW = True, False


# --- a per-lane ring rotation between a window's lanes -----------------------------------

N = 4
LANES, NBUF, ROWS, STEPS = 2, 2, 8, 4


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _RingSems:
    """The ring's semaphores as one pytree (send and receive, and the per-step handshake)."""

    dma: Any
    sync: Any


class _Ring:
    """One step of the rotation: lane b's block goes to the next device's lane b + 1 (the
    last lane to the next step's lane 0), after the incoming block for lane b has landed."""

    def __init__(self, safe: bool, window: Any, sems: _RingSems, seed: str | None) -> None:
        self.safe, self.window, self.sems, self.seed = safe, window, sems, seed
        self.step = pl.program_id(0)
        me = lax.axis_index("x")
        self.next_id = (lax.rem(me + 1, N),)
        self.prev_id = (lax.rem(me + N - 1, N),)
        self.pending: list[tuple[Any, Any, Any]] = []

    def _barrier(self) -> None:
        @pl.when(self.step == 0)
        def _startup() -> None:
            if self.safe:
                barrier = sd.barrier_semaphore()
                sd.signal(barrier, 1, device=sd.mesh_coords(*self.next_id))
                sd.signal(barrier, 1, device=sd.mesh_coords(*self.prev_id))
                sd.wait(barrier, 2)
            else:
                barrier = pltpu.get_barrier_semaphore()
                pl.semaphore_signal(barrier, 1, device_id=self.next_id)
                pl.semaphore_signal(barrier, 1, device_id=self.prev_id)
                pl.semaphore_wait(barrier, 2)

    def _copy(self, src: Any, dst: Any) -> Any:
        dma = self.sems.dma
        if not self.safe:
            return pltpu.make_async_remote_copy(
                src_ref=src,
                dst_ref=dst,
                send_sem=dma.at[0],
                recv_sem=dma.at[1],
                device_id=self.next_id,  # device_id_type: MESH, the default
            )
        recv = self.sems.sync if self.seed == "sync_as_recv" else dma.at[1]
        copy = sd.RemoteCopy(src, dst, recv)  # DESCRIBED
        if self.seed == "no_send_sem":
            return copy.to(sd.mesh_coords(*self.next_id))
        return copy.with_send_sem(dma.at[0]).to(sd.mesh_coords(*self.next_id))

    def stage(self, rounds: list[Any], valids: list[Any]) -> None:
        self._barrier()
        if self.safe:
            sd.signal(self.sems.sync, 1, device=sd.mesh_coords(*self.prev_id))
            sd.wait(self.sems.sync, 1)
        else:
            pl.semaphore_signal(self.sems.sync, 1, device_id=self.prev_id)
            pl.semaphore_wait(self.sems.sync, 1)
        slot = lax.rem(self.step, NBUF)
        following = self.step + 1
        next_slot = jnp.where(following < pl.num_programs(0), lax.rem(following, NBUF), 0)
        for b in range(LANES):
            sends = jnp.logical_and(valids[b], rounds[b] != N - 1)
            receives = jnp.logical_and(valids[b], rounds[b] > 0)
            lane = self.window.at[slot, b]
            dst = self.window.at[slot, b + 1] if b + 1 < LANES else self.window.at[next_slot, 0]
            self.pending.append((sends, *self._lane(self._copy(lane, dst), sends, receives)))

    def _lane(self, copy: Any, sends: Any, receives: Any) -> tuple[Any, list[Any]]:
        @pl.when(receives)
        def _wait_recv() -> None:
            (copy.incoming() if self.safe else copy).wait_recv()  # FIRST USE

        handle: list[Any] = []

        @pl.when(sends)
        def _start() -> None:
            handle.append(copy.start())  # STARTED

        return copy, handle

    def finalize(self) -> None:
        if self.seed == "sends_not_waited":
            return
        for sends, copy, handle in self.pending:
            self._wait_send(sends, copy, handle)
        self.pending = []

    def _wait_send(self, sends: Any, copy: Any, handle: list[Any]) -> None:
        @pl.when(sends)
        def _wait_send() -> None:
            if not self.safe:
                copy.wait_send()
            elif self.seed == "start_handle_waited":
                handle[0].wait_send()  # ESCAPED
            else:
                copy.started_elsewhere().wait_send()


def _ring_kernel(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        rounds_ref: Any,
        valid_ref: Any,
        x_hbm: Any,
        o_ref: Any,
        window: Any,
        load_sem: Any,
        sems: _RingSems,
    ) -> None:
        step = pl.program_id(0)
        slot = lax.rem(step, NBUF)
        rounds = [rounds_ref[step, b] for b in range(LANES)]
        valids = [valid_ref[step, b] != 0 for b in range(LANES)]

        @pl.when(step == 0)
        def _init() -> None:
            o_ref[...] = jnp.zeros_like(o_ref)

        def fetch(lane: int) -> None:  # round 0: this device's own block, from HBM
            @pl.when(jnp.logical_and(valids[lane], rounds[lane] == 0))
            def _fetch() -> None:
                src, dst = x_hbm.at[lane], window.at[slot, lane]
                if safe:
                    sd.LocalCopy(src, dst, load_sem).start().wait()
                else:
                    copy = pltpu.make_async_copy(src, dst, load_sem)
                    copy.start()
                    copy.wait()

        for b in range(LANES):
            fetch(b)

        ring = _Ring(safe, window, sems, seed)
        ring.stage(rounds, valids)
        o_ref[...] += window[slot].sum(axis=0)
        ring.finalize()

    return kernel


def _ring_call(kernel: Callable[..., None], safe: bool, *, collective_id: int | None = 0) -> Any:
    def per_device(rounds: jax.Array, valid: jax.Array, x: jax.Array) -> jax.Array:
        dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
        dmas = sd.dma_semaphores(2) if safe else pltpu.SemaphoreType.DMA((2,))
        sync = sd.regular_semaphore() if safe else pltpu.SemaphoreType.REGULAR
        window = (sd.vmem if safe else pltpu.VMEM)((NBUF, LANES, ROWS, 128), jnp.float32)
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            kernel,
            jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                in_specs=[ANY],
                out_specs=pl.BlockSpec((ROWS, 128), lambda i, *_: (0, 0)),
                # The ring's semaphores are one scratch entry, a pytree dataclass.
                scratch_shapes=[window, dma, _RingSems(dmas, sync)],
                grid=(STEPS,),
            ),
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(rounds[0], valid[0], x)
        return out

    return per_device


def _ring_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    table = sds((N, STEPS, LANES), jnp.int32)
    return table, table, sds((N * LANES, ROWS, 128), jnp.float32)


def _ring(safe: bool, seed: str | None = None, **options: Any) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",))
    fn = sharded(_ring_call(_ring_kernel(safe, seed), safe, **options), mesh, (ALONG_X,) * 3)
    return fn, mesh


def test_ring_rotation_between_window_lanes_matches_raw() -> None:
    ours, mesh = _ring(SAFE)
    theirs, _ = _ring(RAW)
    assert_same_mosaic(ours, theirs, *_ring_args(mesh), mesh=mesh)


def test_ring_sends_not_waited_is_t7_one_line_for_the_lanes() -> None:
    broken, mesh = _ring(SAFE, "sends_not_waited")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_ring_args(mesh), mesh=mesh)
    message = str(err.value)
    start = line_in(_Ring._lane, "# STARTED")
    # Both lanes' sends start at one line with the same buffers: one line, counted.
    assert f"  - {LANES} copies of RemoteCopy window.at[...]" in message, message
    assert f"started at {__file__}:{start} (called from " in message, message
    assert "wait_send() never called" in message, message
    assert message.count("never called") == 1, message


def test_ring_start_handle_waited_in_another_branch_names_both() -> None:
    broken, mesh = _ring(SAFE, "start_handle_waited")
    with pytest.raises(sd.HandleEscapedError, match=r"pl\.when / lax\.cond") as err:
        mosaic_text(broken, *_ring_args(mesh), mesh=mesh)
    assert f"{__file__}:{line_in(_Ring._wait_send, '# ESCAPED')}" in str(err.value)
    # The fix waits the send side only: started_elsewhere().wait() would wait the receive
    # side a second time (this lane already waited it), and the ring would hang.
    assert "copy.started_elsewhere().wait_send()" in str(err.value)
    assert "started_elsewhere().wait()" not in str(err.value)


def test_ring_without_a_send_semaphore_is_s4_at_the_users_line() -> None:
    broken, mesh = _ring(SAFE, "no_send_sem")
    # The copy's first use (the receive wait, before the start) is where it is stopped.
    with pytest.raises(sd.IncompleteCopyError, match=r"with_send_sem\(sem\)") as err:
        mosaic_text(broken, *_ring_args(mesh), mesh=mesh)
    assert line_in(_Ring._lane, "# FIRST USE") in raising_lines(err, __file__)


def test_ring_regular_handshake_semaphore_as_receive_semaphore_is_s3() -> None:
    broken, mesh = _ring(SAFE, "sync_as_recv")
    # The semaphore inside the pytree scratch entry is named by its path.
    with pytest.raises(sd.SemaphoreKindError, match=r"REGULAR semaphore \(sems\.sync ") as err:
        mosaic_text(broken, *_ring_args(mesh), mesh=mesh)
    assert line_in(_Ring._copy, "# DESCRIBED") in raising_lines(err, __file__)


def test_ring_startup_barrier_without_collective_id_is_t9() -> None:
    broken, mesh = _ring(SAFE, collective_id=None)
    with pytest.raises(sd.MissingCollectiveIdError):
        mosaic_text(broken, *_ring_args(mesh), mesh=mesh)
