"""Trace-time checks on the shapes production DMA code takes (helpers, scratch dicts,
one-shot exchanges, unrolled pipelines), on kernels written here.

* ``safedma.checked`` bodies under ``pl.kernel`` and ``pl.core_map`` read the
  ``collective_id`` of that call (T9), as under ``pl.pallas_call``;
* a dict of scratch inside the scratch tuple, taken by the kernel as one argument;
  helpers that start a remote copy and drop the handle, and helpers that wait its send
  and receive sides on rebuilt copies (``started_elsewhere()`` / ``incoming()``), with
  LOGICAL device ids (a course lab's RDMA helpers);
* a helper returning a complete remote copy, started in one loop and waited in another,
  after an all-peer barrier and a second round on a keyword ``run_scoped`` used as a
  ``functools.partial`` decorator (a one-shot reduce-scatter);
* a Python-unrolled two-bank pipeline whose waits rebuild the copy (a decode kernel);
* docs/catalogue.md mistakes seeded in the shapes such code takes (helpers, loops, branches,
  aliases, closures, partials, dataclasses, tuples): each stopped at trace time, naming
  the user's line, and for a copy started in a helper, the line that called the helper.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
import warnings
from collections.abc import Callable
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
from tests.support.source_lines import line_in
from tests.support.ring_twins import sharded

ANY = pl.BlockSpec(memory_space=pl.ANY)
VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
N = 4
ROWS = 16
LOGICAL = pl.DeviceIdType.LOGICAL
MESH_IDS = pl.DeviceIdType.MESH


def _mesh(tpu: str | None = None) -> Any:
    return abstract_mesh((N,), ("x",), tpu=tpu)


def _x(mesh: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((N * ROWS, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))


# --- T9 for checked bodies under pl.kernel and pl.core_map ------------------------------


def _core_mesh() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(pltpu, "TensorCoreMesh"):
            return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
        return pltpu.create_tensorcore_mesh("core", num_cores=2)


def _barrier_with_the_other_core() -> None:
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, device=sd.device(core=1 - sd.my_index("core")))
    sd.wait(barrier)


X1 = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def _under_pl_kernel(collective_id: int | None) -> None:
    @sd.checked
    def body(x_ref: sd.DataRef, o_ref: sd.DataRef) -> None:
        del x_ref, o_ref
        _barrier_with_the_other_core()

    params = pltpu.CompilerParams(collective_id=collective_id)
    jax.eval_shape(pl.kernel(body, X1, mesh=_core_mesh(), compiler_params=params), X1)


def _under_pl_core_map(collective_id: int | None) -> None:
    params = pltpu.CompilerParams(collective_id=collective_id)

    def per_call(x: jax.Array) -> Any:
        def stateful(refs: Any) -> None:
            del refs

            @pl.core_map(_core_mesh(), compiler_params=params)
            @sd.checked
            def _() -> None:
                _barrier_with_the_other_core()

        return pl.run_state(stateful)((x, jnp.zeros_like(x)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # core_map, on jax 0.12
        jax.eval_shape(per_call, X1)


@pytest.mark.parametrize(
    "entry", [_under_pl_kernel, _under_pl_core_map], ids=["pl.kernel", "pl.core_map"]
)
def test_t9_checked_body_under_kernel_and_core_map(entry: Callable[[int | None], None]) -> None:
    with pytest.raises(sd.MissingCollectiveIdError) as err:
        entry(None)
    message = str(err.value)
    assert "collective_id=0" in message and "pl.kernel or pl.core_map" in message
    frames = [f for f in traceback.extract_tb(err.value.__traceback__) if f.filename == __file__]
    assert frames and frames[-1].line == "barrier = sd.barrier_semaphore()"


@pytest.mark.parametrize(
    "entry", [_under_pl_kernel, _under_pl_core_map], ids=["pl.kernel", "pl.core_map"]
)
def test_t9_checked_body_under_kernel_and_core_map_with_an_id_traces(
    entry: Callable[[int | None], None],
) -> None:
    entry(3)


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


# --- a Python-unrolled two-bank pipeline whose waits rebuild the copy -------------------

STEPS = 4


def _banks(safe: bool) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, inbuf: Any, outbuf: Any, gather: Any, scatter: Any) -> None:
        def copy(src: Any, dst: Any, sem: Any) -> Any:
            return sd.LocalCopy(src, dst, sem) if safe else pltpu.make_async_copy(src, dst, sem)

        def rows(n: int) -> Any:
            return pl.ds(n * 8, 8)

        for n in range(2):
            copy(x_hbm.at[rows(n)], inbuf.at[n], gather.at[n]).start()
        for n in range(STEPS):
            bank = n % 2
            got = copy(x_hbm.at[rows(n)], inbuf.at[bank], gather.at[bank])
            (got.started_elsewhere() if safe else got).wait()
            if n >= 2:
                old = copy(outbuf.at[bank], o_hbm.at[rows(n - 2)], scatter.at[bank])
                (old.started_elsewhere() if safe else old).wait()
            outbuf[bank] = inbuf[bank] * 2.0
            copy(outbuf.at[bank], o_hbm.at[rows(n)], scatter.at[bank]).start()
            if n + 2 < STEPS:
                copy(x_hbm.at[rows(n + 2)], inbuf.at[bank], gather.at[bank]).start()
        for n in (STEPS - 1, STEPS - 2):
            last = copy(outbuf.at[n % 2], o_hbm.at[rows(n)], scatter.at[n % 2])
            (last.started_elsewhere() if safe else last).wait()

    return kernel


def test_unrolled_two_bank_pipeline_matches_raw() -> None:
    x = jax.ShapeDtypeStruct((STEPS * 8, 128), jnp.float32)

    def call(safe: bool) -> Any:
        vmem = sd.vmem if safe else pltpu.VMEM
        sems = sd.dma_semaphores(2) if safe else pltpu.SemaphoreType.DMA((2,))
        entry: Any = sd.pallas_call if safe else pl.pallas_call
        return jax.jit(
            entry(
                _banks(safe),
                x,
                in_specs=[ANY],
                out_specs=ANY,
                scratch_shapes=[
                    vmem((2, 8, 128), jnp.float32),
                    vmem((2, 8, 128), jnp.float32),
                    sems,
                    sems,
                ],
            )
        )

    assert_same_mosaic(call(True), call(False), x)


# --- docs/catalogue.md mistakes in new shapes -------------------------------------------------

SEEDS: dict[str, tuple[type[Exception], Callable[..., None], list[Any]]] = {}
ONE = [
    sd.dma_semaphore(),
    sd.dma_semaphores(3),
    sd.dma_semaphores(3),
    sd.vmem((ROWS, 128), jnp.float32),
]


def _seed(
    error: type[Exception], scratch: list[Any] | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(kernel: Callable[..., None]) -> Callable[..., None]:
        SEEDS[kernel.__name__] = (error, kernel, ONE if scratch is None else scratch)
        return kernel

    return register


def _to(x: Any, o: Any, send_sems: Any, recv_sems: Any, offset: int, *, whole: bool = False) -> Any:
    peer = jax.lax.rem(sd.my_index("x") + offset, N)
    recv = recv_sems if whole else recv_sems.at[offset - 1]
    copy = sd.RemoteCopy(x.at[pl.ds(0, 4)], o.at[pl.ds(4 * (offset - 1), 4)], recv)
    return copy.with_send_sem(send_sems.at[offset - 1]).to(sd.mesh_coords(peer))


@dataclasses.dataclass(frozen=True)
class _Stage:
    src: Any
    dst: Any
    sem: Any

    def copy(self) -> sd.LocalCopy:
        return sd.LocalCopy(self.src, self.dst, self.sem)


@_seed(sd.SemaphoreKindError, [{"send": sd.dma_semaphore(), "recv": sd.regular_semaphore()}])
def s3_regular_semaphore_in_a_dict_of_scratch(x: Any, o: Any, sems: Any) -> None:
    _rdma_start(x, o, sd.my_index("x") ^ 1, sems["send"], sems["recv"])  # USER LINE


@_seed(sd.NotARefError, [{"send": sd.dma_semaphore(), "recv": sd.dma_semaphore()}])
def s1_semaphore_value_through_a_helper(x: Any, o: Any, sems: Any) -> None:
    _rdma_start(x, o, sd.my_index("x") ^ 1, sems["send"], sd.read(sems["recv"]))  # USER LINE


@_seed(sd.SemaphoreShapeError)
def s2_array_inside_a_builder_helper(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    for offset in range(1, N):
        _to(x, o, ss, rs, offset, whole=True).start().wait()  # USER LINE


@_seed(sd.SemaphoreKindError)
def s6_dataclass_of_refs_with_fields_swapped(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    _Stage(src=x, dst=own, sem=buf).copy().start().wait()  # USER LINE


@_seed(sd.WrongOperationError)
def s9_copy_from_a_helper_waited_unstarted(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    stage = _Stage(x, buf, own)
    stage.copy().start()
    stage.copy().wait()  # USER LINE


@_seed(sd.WrongOperationError)
def s5_wait_send_on_a_handle_from_a_list(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handles = [sd.LocalCopy(x, buf, own).start()]
    handles[0].wait_send()  # USER LINE


@_seed(sd.IncompleteCopyError)
def s4_builder_closure_without_send(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    def build() -> Any:
        return sd.RemoteCopy(x.at[pl.ds(0, 4)], o.at[pl.ds(0, 4)], rs.at[0]).to(sd.neighbour("x"))

    build().start().wait()  # USER LINE


@_seed(sd.CopyShapeMismatchError)
def t1_in_a_partial_kernel(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any, *, rows: int = 8
) -> None:
    sd.LocalCopy(x.at[pl.ds(0, rows)], buf, own).start().wait()  # USER LINE


@_seed(
    sd.CopyDtypeMismatchError,
    [{"buf": sd.vmem((ROWS, 128), jnp.bfloat16), "sem": sd.dma_semaphore()}],
)
def t2_dict_scratch_of_another_dtype(x: Any, o: Any, scratch: Any) -> None:
    sd.LocalCopy(x, scratch["buf"], scratch["sem"]).start().wait()  # USER LINE


@_seed(sd.DeviceIdError)
def t3_static_logical_id_outside_the_mesh(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    copy = sd.RemoteCopy(x, o, rs.at[0]).with_send_sem(ss.at[0])
    copy.to(sd.logical_device(N)).start().wait()  # USER LINE


@_seed(sd.PriorityError)
def t4_priority_through_a_partial(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    start = functools.partial(sd.LocalCopy(x, buf, own).start, priority=2)
    start().wait()  # USER LINE


@_seed(sd.UnsupportedDmaError)
def t5_add_through_a_dict_of_options(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    options = {"add": True}
    sd.LocalCopy(x, buf, own).start(**options).wait()  # USER LINE


@_seed(sd.CopyNeverWaitedError)
def t7_wait_only_in_a_closure_never_called(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handle = sd.LocalCopy(x, buf, own).start()  # USER LINE

    def later() -> None:
        handle.wait()

    del later


@_seed(sd.HandleWaitedTwiceError)
def t8_an_alias_of_a_handle_waited_again(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    handle = sd.LocalCopy(x, buf, own).start()
    alias = handle
    alias.wait()
    handle.wait()  # USER LINE


@_seed(sd.HandleWaitedTwiceError)
def t8_handles_from_a_helper_tuple_waited_again(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    def both() -> tuple[Any, Any]:
        first = sd.LocalCopy(x.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], own).start()
        return first, sd.LocalCopy(x.at[pl.ds(8, 8)], buf.at[pl.ds(8, 8)], own).start()

    pair = both()
    for handle in pair:
        handle.wait()
    pair[0].wait()  # USER LINE


@_seed(sd.HandleEscapedError)
def escaped_from_a_fori_loop_closure(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    handles: list[Any] = []

    def body(i: jax.Array, carry: int) -> int:
        handles.append(sd.LocalCopy(x.at[pl.ds(i * 8, 8)], buf.at[pl.ds(i * 8, 8)], own).start())
        return carry

    jax.lax.fori_loop(0, 2, body, 0)
    handles[0].wait()  # USER LINE


@_seed(sd.HandleEscapedError)
def escaped_from_a_cond_branch(x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any) -> None:
    box: list[Any] = []

    def first() -> None:
        box.append(sd.LocalCopy(x, buf, own).start())

    jax.lax.cond(sd.my_index("x") == 0, first, lambda: None)
    box[0].wait()  # USER LINE


@_seed(sd.SemaphoreIndexError)
def index_from_a_loop_bound_one_too_far(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    for offset in range(1, N + 1):
        _to(x, o, ss, rs, offset).start().wait()  # USER LINE


@_seed(sd.MissingCollectiveIdError)
def t9_barrier_in_a_partial_run_scoped(
    x: Any, o: Any, own: Any, ss: Any, rs: Any, buf: Any
) -> None:
    @functools.partial(sd.run_scoped, flag=sd.regular_semaphore())
    def _(flag: Any) -> None:
        barrier = sd.barrier_semaphore()  # USER LINE
        sd.signal(barrier, device=sd.neighbour("x"))
        sd.wait(barrier)


def _user_line(kernel: Callable[..., None]) -> int:
    return line_in(kernel, "# USER LINE")


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seeded_mistake_is_stopped_at_the_users_line(name: str) -> None:
    error, kernel, scratch = SEEDS[name]
    mesh = _mesh()
    collective_id = None if error is sd.MissingCollectiveIdError else 0
    body = functools.partial(kernel, rows=8) if "partial_kernel" in name else kernel

    def per_device(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            body,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=scratch,
            compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        )(x)
        return out

    with pytest.raises(error) as err:
        jax.eval_shape(sharded(per_device, mesh), _x(mesh))
    line = _user_line(kernel)
    in_message = f"{__file__}:{line}" in str(err.value)
    frames = [
        f.lineno for f in traceback.extract_tb(err.value.__traceback__) if f.filename == __file__
    ]
    assert in_message or line in frames, (line, frames, str(err.value))


def test_helper_callers_are_named_up_to_the_checked_wrapper_only() -> None:
    from safedma import _describe

    def body(x_ref: sd.DataRef) -> None:
        del x_ref

    wrapper = sd.checked(body)
    assert wrapper.__code__.co_name == _describe._WRAPPER_FUNCTION
    assert wrapper.__globals__["__name__"] == _describe._WRAPPER_MODULE

    def helper() -> Any:
        return _describe.call_site()

    def outside_any_kernel() -> Any:
        return helper()

    assert outside_any_kernel().via == ()  # no checked wrapper above: the line alone
