"""Trace-time checks on the DMA patterns of ring rotations, ragged all-to-alls, host copies
and pipeline inputs that wait a peer, on kernels written here.

* a per-lane ring rotation between the lanes of a pipeline's window buffer (the construct of
  vLLM tpu-inference's batched RPA ``PcpRing``): a startup barrier in ``pl.when`` on the
  first grid step, a per-step REGULAR handshake with the previous device, then per lane a
  remote copy whose *receive* is waited in one ``pl.when`` and whose start is in another,
  the sends kept in a list and waited at the end of the step in a third (through
  ``started_elsewhere()``); the semaphores are one scratch entry, a pytree dataclass;
* a ragged all-to-all (jax's ``pallas/ops/tpu/ragged_all_to_all.py``, Dec 2024, since removed): each
  grid step starts one remote copy of a size read from SMEM (skipped when 0) and waits
  nothing; the last step waits the send and receive semaphores by the traced totals
  (``wait_bytes``);
* a host <-> HBM copy on a ``run_scoped`` semaphore (vLLM tpu-inference's
  ``kernels/dma/host_dma.py``), both directions;
* a pipeline input that first waits a peer's remote write (tpu-inference's
  ``collectives/hierrs_tc/dma_pipeline.py``, ``RemoteWaitBufferedRef``): chunks pushed to
  the partner, then an ``emit_pipeline`` whose ``BufferedRef`` subclass waits the write by
  size in ``copy_in`` before fetching, and waits the fetch by size in ``wait_in``.

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
SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
SAFE, RAW = True, False


# --- a per-lane ring rotation between a window's lanes -----------------------------------

N, LANES, NBUF, ROWS, STEPS = 4, 2, 2, 8, 4


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


# --- a ragged all-to-all: one remote copy per grid step, waited by totals at the end ------

GROUPS, GROUP_ROWS = 8, 16  # groups per device, and the most rows a device holds


def _all_to_all(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def kernel(
        x_hbm: Any,
        in_offsets: Any,
        in_sizes: Any,
        out_offsets: Any,
        total_sent: Any,
        total_received: Any,
        aliased: Any,
        o_hbm: Any,
        send_sem: Any,
        recv_sem: Any,
    ) -> None:
        del aliased  # the output, passed in to be written in place
        me = lax.axis_index("x")
        group = (pl.program_id(0) + me) % GROUPS
        target = (group // (GROUPS // N),)
        size = in_sizes[group]
        src = x_hbm.at[pl.ds(in_offsets[group], size)]
        dst = o_hbm.at[pl.ds(out_offsets[group], size)]
        if seed == "half_rows":  # T1: the destination half as wide, next to a traced size
            dst = o_hbm.at[pl.ds(out_offsets[group], size), pl.ds(0, 64)]
        if safe:
            copy = sd.RemoteCopy(src, dst, recv_sem).with_send_sem(send_sem)  # DESCRIBED
            started = copy.to(sd.mesh_coords(*target))
        else:
            started = pltpu.make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=target)

        @pl.when(size > 0)
        def _start() -> None:
            started.start()  # STARTED

        @pl.when(pl.program_id(0) == GROUPS - 1)
        def _drain() -> None:
            # Copies sized by the totals wait every step's sends and receives.
            sent, received = total_sent[0], total_received[0]
            if not safe:

                def raw_total(rows: Any) -> Any:
                    return pltpu.make_async_remote_copy(
                        x_hbm.at[pl.ds(0, rows)],
                        o_hbm.at[pl.ds(0, rows)],
                        send_sem,
                        recv_sem,
                        device_id=target,
                    )

                raw_total(sent).wait_send()
                raw_total(received).wait_recv()
                return

            def total(rows: Any) -> sd.RemoteCopy[sd.Given, sd.Given]:
                whole = sd.RemoteCopy(x_hbm.at[pl.ds(0, rows)], o_hbm.at[pl.ds(0, rows)], recv_sem)
                return whole.with_send_sem(send_sem).to(sd.mesh_coords(*target))

            if seed != "send_drain_dropped":
                total(sent).started_elsewhere().wait_send()
            if seed == "recv_waited_as_send":
                total(received).started_elsewhere().wait_send()  # SEEDED
            else:
                total(received).incoming().wait_recv()

    return kernel


def _all_to_all_call(kernel: Callable[..., None], safe: bool) -> Any:
    def per_device(
        x: jax.Array,
        in_off: jax.Array,
        in_size: jax.Array,
        out_off: jax.Array,
        received: jax.Array,
        out: jax.Array,
    ) -> jax.Array:
        dma = sd.dma_semaphore() if safe else pltpu.SemaphoreType.DMA
        call = sd.pallas_call if safe else pl.pallas_call
        sent = in_size.sum(keepdims=True)
        result: jax.Array = call(
            kernel,
            jax.ShapeDtypeStruct(out.shape, out.dtype),
            grid=(GROUPS,),
            in_specs=[ANY, SMEM, SMEM, SMEM, SMEM, SMEM, ANY],
            out_specs=ANY,
            scratch_shapes=[dma, dma],
            input_output_aliases={6: 0},
        )(x, in_off, in_size, out_off, sent, received, out)
        return result

    return per_device


def _all_to_all_args(mesh: Any) -> tuple[jax.ShapeDtypeStruct, ...]:
    def sds(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    rows = sds((N * GROUP_ROWS, 128), jnp.float32)
    table = sds((N * GROUPS,), jnp.int32)
    return rows, table, table, table, sds((N,), jnp.int32), rows


def _a2a(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")  # jax 0.12 lowers `%` per generation
    return sharded(_all_to_all_call(_all_to_all(safe, seed), safe), mesh, (ALONG_X,) * 6), mesh


def test_ragged_all_to_all_waited_by_totals_matches_raw() -> None:
    ours, mesh = _a2a(SAFE)
    theirs, _ = _a2a(RAW)
    assert_same_mosaic(ours, theirs, *_all_to_all_args(mesh), mesh=mesh)


@pytest.mark.parametrize(
    ("seed", "never"),
    [("send_drain_dropped", "wait_send()"), ("recv_waited_as_send", "wait_recv()")],
)
def test_ragged_all_to_all_drain_missing_is_t7_naming_the_start(seed: str, never: str) -> None:
    broken, mesh = _a2a(SAFE, seed)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(broken, *_all_to_all_args(mesh), mesh=mesh)
    message = str(err.value)
    start = line_in(_all_to_all, "# STARTED")
    assert f"started at {__file__}:{start}" in message, message
    assert f": {never} never called" in message, message
    # The fix names the missing side's waits, not a local handle.wait().
    assert f"handle.{never}" in message and "handle.wait()" not in message, message
    fix = "copy.incoming().wait_recv()" if never == "wait_recv()" else "wait_send() in a later"
    assert fix in message, message
    assert "1 copy was started" in message, message


def test_ragged_all_to_all_narrower_destination_is_t1_at_the_users_line() -> None:
    broken, mesh = _a2a(SAFE, "half_rows")
    with pytest.raises(sd.CopyShapeMismatchError, match=r"\(\?, 128\).*\(\?, 64\)") as err:
        mosaic_text(broken, *_all_to_all_args(mesh), mesh=mesh)
    assert line_in(_all_to_all, "# DESCRIBED") in raising_lines(err, __file__)


# --- a host <-> HBM copy on a run_scoped semaphore ----------------------------------------

HOST = pl.BlockSpec(memory_space=pl.HOST)


def _host_dma(safe: bool, seed: str | None = None) -> Callable[..., None]:
    def safe_kernel(x_ref: sd.DataRef, y_ref: sd.DataRef) -> None:
        def body(sem: sd.SemRef) -> None:
            if seed == "not_waited":
                sd.LocalCopy(x_ref, y_ref, sem).start()  # STARTED
            elif seed == "value_as_semaphore":
                sd.LocalCopy(x_ref, y_ref, sd.read(sem)).start().wait()  # type: ignore[arg-type]  # USER
            else:
                sd.LocalCopy(x_ref, y_ref, sem).start().wait()

        sd.run_scoped(body, sd.dma_semaphore())

    def raw_kernel(x_ref: Any, y_ref: Any) -> None:
        def body(sem: Any) -> None:
            pltpu.async_copy(x_ref, y_ref, sem).wait()

        pl.run_scoped(body, pltpu.SemaphoreType.DMA)

    return safe_kernel if safe else raw_kernel


def _host_shape(x: jax.Array, mesh: Any) -> Any:
    """The output on the host: jax 0.10.2 spells it ``pl.HOST(shape, dtype)``; 0.12 dropped
    that call and takes a pinned-host sharding (with the HOST out-spec) instead."""
    if callable(pl.HOST):
        return pl.HOST(shape=x.shape, dtype=x.dtype)
    host = NamedSharding(mesh, P(), memory_kind="pinned_host")
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host)


def _d2h(safe: bool, mesh: Any, seed: str | None = None) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            _host_dma(safe, seed),
            _host_shape(x, mesh),
            in_specs=[ANY],
            out_specs=HOST,
            name="d2h_dma_kernel",
        )(x)
        return out

    return sharded(per_device, mesh, (ALONG_X,) * 1)


def _h2d(safe: bool, mesh: Any, seed: str | None = None) -> Any:
    def per_device(x: jax.Array) -> jax.Array:
        call = sd.pallas_call if safe else pl.pallas_call
        out: jax.Array = call(
            _host_dma(safe, seed),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HOST],
            out_specs=ANY,
            name="h2d_dma_kernel",
        )(x)
        return out

    return sharded(per_device, mesh, (ALONG_X,) * 1)


def _host_args(mesh: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((N * 16, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))


@pytest.mark.parametrize("direction", [_d2h, _h2d], ids=["device_to_host", "host_to_device"])
def test_host_dma_on_a_scoped_semaphore_matches_raw(direction: Any) -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")  # host memory asks for the generation
    text = mosaic_text(direction(SAFE, mesh), _host_args(mesh), mesh=mesh)
    assert "memory_space<host>" in text, text
    assert_same_mosaic(direction(SAFE, mesh), direction(RAW, mesh), _host_args(mesh), mesh=mesh)


@pytest.mark.parametrize("direction", [_d2h, _h2d], ids=["device_to_host", "host_to_device"])
def test_host_dma_not_waited_is_t7_on_the_scoped_semaphore(direction: Any) -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(direction(SAFE, mesh, "not_waited"), _host_args(mesh), mesh=mesh)
    start = line_in(_host_dma, "# STARTED")
    assert (
        f"LocalCopy x_ref float32[16,128] -> y_ref float32[16,128], started at {__file__}:{start}"
        in str(err.value)
    )


def test_host_dma_semaphore_value_for_the_semaphore_is_s1() -> None:
    mesh = abstract_mesh((N,), ("x",), tpu="v5p")
    with pytest.raises(sd.NotARefError) as err:
        mosaic_text(_d2h(SAFE, mesh, "value_as_semaphore"), _host_args(mesh), mesh=mesh)
    assert line_in(_host_dma, "# USER") in raising_lines(err, __file__)


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
