"""No false alarms: the legitimate patterns of docs/catalogue.md trace cleanly under the kernel scope.

The kernel scope (``safedma.pallas_call`` / ``safedma.checked``) pairs every
``start()`` with a handle wait and reports what is left (T7) or waited twice
(T8). These patterns wait for copies the trace cannot pair with their start,
through the named APIs ``started_elsewhere()`` and ``incoming()``, and must
trace without a safedma error:

* several starts on one semaphore, then one aggregate wait (paged attention);
* double buffering: iteration i starts chunk i+1 and waits chunk i
  (``fori_loop`` and grid steps, local and remote);
* the receive-side wait for a send started by another device under ``pl.when``;
* remote copies into VMEM as well as HBM;
* dict device ids ``{axis: index}`` (and ``mesh_coords``) on a 2-D mesh;
* waits split over control flow, which the trace sees all of at once: a
  handle waited once in each branch of a ``lax.cond`` or of complementary
  ``pl.when``s; a write-back pipeline (grid steps or ``fori_loop``) that
  waits step i-1 through ``started_elsewhere()`` and its own handle at the
  last step; starts in one ``fori_loop`` and waits in a later one; per-slot
  waits on static semaphore slots; handles kept in lists and dicts.

Each test traces the kernel (``jax.eval_shape``), then runs it in interpret
mode with race detection and eager DMAs and checks the output numerically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import safedma

ANY = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
N = 4
CHUNK = (8, 128)
SHAPE = (N, *CHUNK)  # x_ref / o_ref of each kernel instance
Kernel = Callable[..., None]


def interpret_params() -> Any:
    return pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager")


def assert_no_races() -> None:
    """jax 0.12 raises on a race; 0.10.2 only sets a flag, checked here."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call

    races = getattr(interpret_pallas_call, "races", None)
    assert races is None or not races.races_found, "interpret mode detected a data race"


def _call(
    kernel: Kernel,
    out: jax.ShapeDtypeStruct,
    scratch: Sequence[object],
    *,
    entry: str,
    interpret: object | None,
    collective_id: int | None = None,
    grid: tuple[int, ...] | None = None,
) -> Callable[..., Any]:
    kwargs: dict[str, Any] = {"compiler_params": pltpu.CompilerParams(collective_id=collective_id)}
    if interpret is not None:
        kwargs["interpret"] = interpret
    if grid is not None:
        kwargs["grid"] = grid
    if entry == "safedma.pallas_call":
        return safedma.pallas_call(
            kernel, out, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch, **kwargs
        )
    assert entry == "pl.pallas_call(safedma.checked)"
    return pl.pallas_call(
        safedma.checked(kernel),
        out_shape=out,
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=scratch,
        **kwargs,
    )


def run_local(
    kernel: Kernel,
    scratch: Sequence[object],
    *,
    entry: str = "safedma.pallas_call",
    grid: tuple[int, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Trace ``kernel`` (x_ref, o_ref: f32[4,8,128] in HBM), then run it; return (x, out)."""
    x = jnp.arange(np.prod(SHAPE), dtype=F32).reshape(SHAPE)
    out = jax.ShapeDtypeStruct(SHAPE, F32)
    jax.eval_shape(_call(kernel, out, scratch, entry=entry, interpret=None, grid=grid), x)
    call = _call(kernel, out, scratch, entry=entry, interpret=interpret_params(), grid=grid)
    result = np.asarray(jax.block_until_ready(call(x)))
    assert_no_races()
    return np.asarray(x), result


def run_on_mesh(
    kernel: Kernel,
    scratch: Sequence[object],
    mesh_shape: tuple[int, ...] = (4,),
    *,
    collective_id: int | None = None,
    entry: str = "safedma.pallas_call",
) -> tuple[np.ndarray, np.ndarray]:
    """Trace ``kernel`` under ``jax.shard_map``, then run it; return (x, out).

    Each device's x_ref / o_ref is f32[4,8,128]; globally the leading axes are
    multiplied by the mesh shape, device (i, j) holding block [i, j].
    """
    names = ("x",) if len(mesh_shape) == 1 else ("x", "y")
    mesh: Mesh = jax.make_mesh(mesh_shape, names)
    spec = P(*names)
    global_shape = tuple(n * s for n, s in zip(SHAPE, mesh_shape)) + SHAPE[len(mesh_shape) :]

    def sharded(interpret: object | None) -> Callable[[jax.Array], Any]:
        def per_device(x: jax.Array) -> Any:
            out = jax.ShapeDtypeStruct(x.shape, x.dtype)
            return _call(
                kernel, out, scratch, entry=entry, interpret=interpret, collective_id=collective_id
            )(x)

        return jax.jit(
            jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        )

    x = jax.device_put(
        jnp.arange(np.prod(global_shape), dtype=F32).reshape(global_shape),
        NamedSharding(mesh, spec),
    )
    jax.eval_shape(sharded(None), x)
    result = np.asarray(jax.block_until_ready(sharded(interpret_params())(x)))
    assert_no_races()
    return np.asarray(x), result


def blocks_1d(a: np.ndarray) -> np.ndarray:
    """Global (4*N, 8, 128) -> per-device blocks (4, N, 8, 128)."""
    return a.reshape(4, *SHAPE)


# ------------------------------------------------------------- plain start / wait


@pytest.mark.parametrize("entry", ["safedma.pallas_call", "pl.pallas_call(safedma.checked)"])
def test_start_then_wait_each_handle(entry: str) -> None:
    def kernel(x_ref, o_ref, buf, sem_in, sem_out):  # type: ignore[no-untyped-def]
        copy_in = safedma.LocalCopy(x_ref, buf, sem_in)
        copy_in.start(priority=1).wait()
        buf[...] = buf[...] + 1.0
        out = safedma.LocalCopy(buf, o_ref, sem_out).start()
        out.wait()
        # One description may be started again: a new handle, waited once.
        copy_in.start().wait()

    x, y = run_local(
        kernel,
        [safedma.vmem(SHAPE, F32), safedma.dma_semaphore(), safedma.dma_semaphore()],
        entry=entry,
    )
    np.testing.assert_array_equal(y, x + 1.0)


def test_copies_in_run_scoped_buffers() -> None:
    def kernel(x_ref, o_ref):  # type: ignore[no-untyped-def]
        def body(buf, sem):  # type: ignore[no-untyped-def]
            safedma.LocalCopy(x_ref, buf, sem).start().wait()
            buf[...] = buf[...] * 3.0
            safedma.LocalCopy(buf, o_ref, sem).start().wait()

        safedma.run_scoped(body, safedma.vmem(SHAPE, F32), safedma.dma_semaphore())

    x, y = run_local(kernel, [])
    np.testing.assert_array_equal(y, x * 3.0)


# ------------------------------------------- several starts, one aggregate wait


def test_several_starts_on_one_semaphore_one_aggregate_wait() -> None:
    def kernel(x_ref, o_ref, buf, sem, out_sem):  # type: ignore[no-untyped-def]
        for i in range(N):  # e.g. the pages of a paged-attention block
            safedma.LocalCopy(x_ref.at[i], buf.at[N - 1 - i], sem).start()
        # The sizes add up to the whole buffer: one wait for all of them.
        safedma.LocalCopy(x_ref, buf, sem).started_elsewhere().wait()
        buf[...] = buf[...] * 2.0
        safedma.LocalCopy(buf, o_ref, out_sem).start().wait()

    x, y = run_local(
        kernel, [safedma.vmem(SHAPE, F32), safedma.dma_semaphore(), safedma.dma_semaphore()]
    )
    np.testing.assert_array_equal(y, x[::-1] * 2.0)


def test_starts_in_a_loop_one_aggregate_wait() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        def body(i, carry):  # type: ignore[no-untyped-def]
            safedma.LocalCopy(x_ref.at[i], o_ref.at[i], sem).start()
            return carry

        jax.lax.fori_loop(0, N, body, 0)
        safedma.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()

    x, y = run_local(kernel, [safedma.dma_semaphore()])
    np.testing.assert_array_equal(y, x)


def test_wait_all_into_is_the_named_aggregate_wait() -> None:
    def kernel(x_ref, o_ref, buf, sem, out_sem):  # type: ignore[no-untyped-def]
        for i in range(N):
            safedma.LocalCopy(x_ref.at[i], buf.at[N - 1 - i], sem).start()
        safedma.wait_all_into(buf, sem)
        safedma.LocalCopy(buf, o_ref, out_sem).start().wait()

    x, y = run_local(
        kernel, [safedma.vmem(SHAPE, F32), safedma.dma_semaphore(), safedma.dma_semaphore()]
    )
    np.testing.assert_array_equal(y, x[::-1])


# ----------------------------------------------------------------- double buffering


def test_double_buffering_in_a_fori_loop() -> None:
    def kernel(x_ref, o_ref, buf, out_buf, sems, out_sem):  # type: ignore[no-untyped-def]
        def fetch(i):  # type: ignore[no-untyped-def]
            slot = i % 2
            return safedma.LocalCopy(x_ref.at[i], buf.at[slot], sems.at[slot])

        fetch(0).start()

        def body(i, carry):  # type: ignore[no-untyped-def]
            @pl.when(i + 1 < N)
            def _() -> None:
                fetch(i + 1).start()

            fetch(i).started_elsewhere().wait()  # started by the previous iteration
            out_buf[...] = buf[i % 2] * 2.0 + 1.0
            safedma.LocalCopy(out_buf, o_ref.at[i], out_sem).start().wait()
            return carry

        jax.lax.fori_loop(0, N, body, 0)

    x, y = run_local(
        kernel,
        [
            safedma.vmem((2, *CHUNK), F32),
            safedma.vmem(CHUNK, F32),
            safedma.dma_semaphores(2),
            safedma.dma_semaphore(),
        ],
    )
    np.testing.assert_array_equal(y, x * 2.0 + 1.0)


def test_double_buffering_across_grid_steps() -> None:
    def kernel(x_ref, o_ref, buf, sems, out_sem):  # type: ignore[no-untyped-def]
        i = pl.program_id(0)

        def fetch(j):  # type: ignore[no-untyped-def]
            slot = j % 2
            return safedma.LocalCopy(x_ref.at[j], buf.at[slot], sems.at[slot])

        @pl.when(i == 0)
        def _() -> None:
            fetch(0).start()

        @pl.when(i + 1 < N)
        def _() -> None:
            fetch(i + 1).start()

        fetch(i).started_elsewhere().wait()  # started by the previous grid step
        safedma.LocalCopy(buf.at[i % 2], o_ref.at[i], out_sem).start().wait()

    x, y = run_local(
        kernel,
        [safedma.vmem((2, *CHUNK), F32), safedma.dma_semaphores(2), safedma.dma_semaphore()],
        grid=(N,),
    )
    np.testing.assert_array_equal(y, x)


def test_remote_double_buffering_in_a_fori_loop() -> None:
    # Chunk i goes to the right neighbour in iteration i, waited one iteration later.
    def kernel(x_ref, o_ref, send_sems, recv_sems):  # type: ignore[no-untyped-def]
        def send(i):  # type: ignore[no-untyped-def]
            slot = i % 2
            return (
                safedma.RemoteCopy(x_ref.at[i], o_ref.at[i], recv_sems.at[slot])
                .with_send_sem(send_sems.at[slot])
                .to(safedma.neighbour("x"))
            )

        send(0).start()

        def body(i, carry):  # type: ignore[no-untyped-def]
            @pl.when(i + 1 < N)
            def _() -> None:
                send(i + 1).start()

            send(i).started_elsewhere().wait()
            return carry

        jax.lax.fori_loop(0, N, body, 0)

    x, y = run_on_mesh(kernel, [safedma.dma_semaphores(2), safedma.dma_semaphores(2)])
    np.testing.assert_array_equal(blocks_1d(y), np.roll(blocks_1d(x), 1, axis=0))


# ----------------------------------------------- receive side of another device's send


def test_receive_side_waits_for_a_send_started_by_another_device() -> None:
    # Even devices send x to the odd device after them and keep their own x;
    # odd devices only receive: their wait is for a send they never started.
    def kernel(x_ref, o_ref, send_sem, recv_sem, local_sem):  # type: ignore[no-untyped-def]
        me = safedma.my_index("x")
        partner = me + 1 - 2 * (me % 2)

        def pair_copy():  # type: ignore[no-untyped-def]
            return (
                safedma.RemoteCopy(x_ref, o_ref, recv_sem)
                .with_send_sem(send_sem)
                .to(safedma.device(x=partner))
            )

        @pl.when(me % 2 == 0)
        def _() -> None:
            pair_copy().start().wait_send()
            safedma.LocalCopy(x_ref, o_ref, local_sem).start().wait()

        @pl.when(me % 2 == 1)
        def _() -> None:
            pair_copy().incoming().wait_recv()

    x, y = run_on_mesh(kernel, [safedma.dma_semaphore()] * 3)
    xb = blocks_1d(x)
    np.testing.assert_array_equal(blocks_1d(y), xb[[0, 0, 2, 2]])


# ------------------------------------------------- remote copies into HBM and VMEM


def _barrier_with_neighbours() -> None:
    barrier = safedma.barrier_semaphore()
    safedma.signal(barrier, device=safedma.neighbour("x", 1))
    safedma.signal(barrier, device=safedma.neighbour("x", -1))
    safedma.wait(barrier, 2)


@pytest.mark.parametrize("entry", ["safedma.pallas_call", "pl.pallas_call(safedma.checked)"])
def test_remote_copy_into_hbm(entry: str) -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        _barrier_with_neighbours()  # with a collective_id: no MissingCollectiveIdError
        copy = (
            safedma.RemoteCopy(x_ref, o_ref, recv_sem)
            .with_send_sem(send_sem)
            .to(safedma.neighbour("x"))
        )
        handle = copy.start()
        handle.wait_send()
        handle.wait_recv()

    x, y = run_on_mesh(kernel, [safedma.dma_semaphore()] * 2, collective_id=0, entry=entry)
    np.testing.assert_array_equal(blocks_1d(y), np.roll(blocks_1d(x), 1, axis=0))


def test_remote_copy_into_vmem() -> None:
    def kernel(x_ref, o_ref, buf, send_sem, recv_sem, local_sem):  # type: ignore[no-untyped-def]
        _barrier_with_neighbours()
        left = safedma.neighbour("x", -1)
        safedma.RemoteCopy(x_ref.at[0], buf, recv_sem).with_send_sem(send_sem).to(
            left
        ).start().wait()
        buf[...] = buf[...] + 0.5
        for i in range(N):
            safedma.LocalCopy(buf, o_ref.at[i], local_sem).start().wait()

    x, y = run_on_mesh(
        kernel, [safedma.vmem(CHUNK, F32), *[safedma.dma_semaphore()] * 3], collective_id=0
    )
    from_right = np.roll(blocks_1d(x), -1, axis=0)[:, 0]
    expected = np.broadcast_to(from_right[:, None] + 0.5, (4, *SHAPE))
    np.testing.assert_array_equal(blocks_1d(y), expected)


# ----------------------------------------------------- device ids on a 2-D mesh

# jax 0.12.0.1 interpret mode fails remote copies on a 2-D mesh when the kernel
# has a collective_id (KeyError in its shared memory); these kernels need none.


def _shift_2d(a: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """Global (2*N, 4*8, 128) -> the array whose block (i, j) is block (i-dx, j-dy) of ``a``."""
    blocks = a.reshape(2, N, 4, 8, 128)
    return np.roll(blocks, (dx, dy), axis=(0, 2)).reshape(a.shape)


def _remote_to(target: Callable[[], safedma.Device]) -> Kernel:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(
            target()
        ).start().wait()

    return kernel


_TARGETS_2D = [
    pytest.param(
        lambda: safedma.device({"y": (safedma.my_index("y") + 1) % 4}), (0, 1), id="dict_one_axis"
    ),
    pytest.param(
        lambda: safedma.device(
            x=(safedma.my_index("x") + 1) % 2, y=(safedma.my_index("y") + 3) % 4
        ),
        (1, 3),
        id="dict_both_axes",
    ),
    pytest.param(
        lambda: safedma.device({"x": 1 - safedma.my_index("x")}), (1, 0), id="dict_other_axis"
    ),
    pytest.param(
        lambda: safedma.mesh_coords(safedma.my_index("x"), (safedma.my_index("y") + 2) % 4),
        (0, 2),
        id="mesh_coords",
    ),
    pytest.param(lambda: safedma.neighbour("y", -1), (0, -1), id="neighbour_y"),
]


@pytest.mark.parametrize(("target", "shift"), _TARGETS_2D)
def test_device_ids_on_a_2d_mesh(
    target: Callable[[], safedma.Device], shift: tuple[int, int]
) -> None:
    x, y = run_on_mesh(_remote_to(target), [safedma.dma_semaphore()] * 2, mesh_shape=(2, 4))
    np.testing.assert_array_equal(y, _shift_2d(x, *shift))


def test_static_dict_device_id_on_a_2d_mesh_traces() -> None:
    # Static, in-range indices for every axis: checked and accepted (trace only).
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    spec = P("x", "y")
    kernel = _remote_to(lambda: safedma.device({"x": 1, "y": 3}))

    def per_device(x: jax.Array) -> Any:
        out = jax.ShapeDtypeStruct(x.shape, x.dtype)
        return _call(
            kernel, out, [safedma.dma_semaphore()] * 2, entry="safedma.pallas_call", interpret=None
        )(x)

    x = jax.ShapeDtypeStruct((2 * N, 32, 128), F32, sharding=NamedSharding(mesh, spec))
    f = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    )
    assert jax.eval_shape(f, x).shape == (2 * N, 32, 128)


# ------------------------------------------- waits split over control flow
# Before: each of these raised HandleWaitedTwiceError at trace time (the trace
# sees both branches, and paired waits by semaphore array).


def test_handle_waited_once_in_each_branch_of_a_cond() -> None:
    def kernel(x_ref, o_ref, buf, sem):  # type: ignore[no-untyped-def]
        handle = safedma.LocalCopy(x_ref, o_ref, sem).start()

        def scale() -> None:
            handle.wait()
            buf[...] = jnp.ones(CHUNK, F32)

        def keep() -> None:
            handle.wait()

        jax.lax.cond(pl.program_id(0) == 0, scale, keep)

    x, y = run_local(kernel, [safedma.vmem(CHUNK, F32), safedma.dma_semaphore()], grid=(2,))
    np.testing.assert_array_equal(y, x)


def test_handle_waited_under_complementary_pl_whens() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        first = pl.program_id(0) == 0
        handle = safedma.LocalCopy(x_ref, o_ref, sem).start()

        @pl.when(first)
        def _() -> None:
            handle.wait()

        @pl.when(jnp.logical_not(first))
        def _() -> None:
            handle.wait()

    x, y = run_local(kernel, [safedma.dma_semaphore()], grid=(2,))
    np.testing.assert_array_equal(y, x)


def test_handle_waited_under_pl_when_c_and_pl_when_not_c() -> None:
    def kernel(x_ref, o_ref, sem):  # type: ignore[no-untyped-def]
        first = pl.program_id(0) == 0
        handle = safedma.LocalCopy(x_ref, o_ref, sem).start()

        # A def, not a lambda: wait() returns the destination ref, and a
        # pl.when / cond body must return nothing.
        def wait() -> None:
            handle.wait()

        pl.when(first)(wait)
        pl.when(~first)(wait)

    x, y = run_local(kernel, [safedma.dma_semaphore()], grid=(3,))
    np.testing.assert_array_equal(y, x)


def _write_back(o_ref, out_bufs, sems, step):  # type: ignore[no-untyped-def]
    slot = step % 2
    return safedma.LocalCopy(out_bufs.at[slot], o_ref.at[step], sems.at[slot])


def _write_back_step(refs, i, transform):  # type: ignore[no-untyped-def]
    """Step i writes transform(chunk i) back and waits step i-1's write-back; the last
    step also waits its own handle, so nothing is left in flight."""
    x_ref, o_ref, in_buf, out_bufs, in_sem, sems = refs
    chunk = safedma.LocalCopy(x_ref.at[i], in_buf, in_sem).start().wait()
    out_bufs[i % 2] = transform(chunk[...])
    handle = _write_back(o_ref, out_bufs, sems, i).start()

    @pl.when(i > 0)
    def _() -> None:
        _write_back(o_ref, out_bufs, sems, i - 1).started_elsewhere().wait()

    @pl.when(i == N - 1)
    def _() -> None:
        handle.wait()


def _write_back_scratch() -> list[object]:
    return [
        safedma.vmem(CHUNK, F32),
        safedma.vmem((2, *CHUNK), F32),
        safedma.dma_semaphore(),
        safedma.dma_semaphores(2),
    ]


def test_write_back_pipeline_over_grid_steps() -> None:
    def kernel(x_ref, o_ref, in_buf, out_bufs, in_sem, sems):  # type: ignore[no-untyped-def]
        refs = (x_ref, o_ref, in_buf, out_bufs, in_sem, sems)
        _write_back_step(refs, pl.program_id(0), lambda c: c * 2.0)

    x, y = run_local(kernel, _write_back_scratch(), grid=(N,))
    np.testing.assert_array_equal(y, x * 2.0)


def test_write_back_pipeline_in_a_fori_loop() -> None:
    def kernel(x_ref, o_ref, in_buf, out_bufs, in_sem, sems):  # type: ignore[no-untyped-def]
        refs = (x_ref, o_ref, in_buf, out_bufs, in_sem, sems)

        def body(i, carry):  # type: ignore[no-untyped-def]
            _write_back_step(refs, i, lambda c: c + 3.0)
            return carry

        jax.lax.fori_loop(0, N, body, 0)

    x, y = run_local(kernel, _write_back_scratch())
    np.testing.assert_array_equal(y, x + 3.0)


def test_starts_in_one_fori_loop_waits_in_a_later_one() -> None:
    def kernel(x_ref, o_ref, sems):  # type: ignore[no-untyped-def]
        def copy(i):  # type: ignore[no-untyped-def]
            return safedma.LocalCopy(x_ref.at[i], o_ref.at[i], sems.at[i])

        def start(i, carry):  # type: ignore[no-untyped-def]
            copy(i).start()
            return carry

        def wait(i, carry):  # type: ignore[no-untyped-def]
            copy(i).started_elsewhere().wait()
            return carry

        jax.lax.fori_loop(0, N, start, 0)
        jax.lax.fori_loop(0, N, wait, 0)

    x, y = run_local(kernel, [safedma.dma_semaphores(N)])
    np.testing.assert_array_equal(y, x)


def test_static_slots_waited_through_started_elsewhere() -> None:
    def kernel(x_ref, o_ref, sems):  # type: ignore[no-untyped-def]
        for i in range(N):
            safedma.LocalCopy(x_ref.at[i], o_ref.at[i], sems.at[i]).start()
        for i in reversed(range(N)):
            safedma.LocalCopy(x_ref.at[i], o_ref.at[i], sems.at[i]).started_elsewhere().wait()

    x, y = run_local(kernel, [safedma.dma_semaphores(N)])
    np.testing.assert_array_equal(y, x)


def test_handles_in_a_list_and_a_dict() -> None:
    def kernel(x_ref, o_ref, sems):  # type: ignore[no-untyped-def]
        handles = [
            safedma.LocalCopy(x_ref.at[i], o_ref.at[i], sems.at[i]).start() for i in range(N - 1)
        ]
        by_name = {
            "last": safedma.LocalCopy(x_ref.at[N - 1], o_ref.at[N - 1], sems.at[N - 1]).start()
        }
        for handle in handles:
            handle.wait()
        by_name["last"].wait()

    x, y = run_local(kernel, [safedma.dma_semaphores(N)])
    np.testing.assert_array_equal(y, x)


def test_remote_handle_waited_in_each_branch() -> None:
    def kernel(x_ref, o_ref, send_sem, recv_sem):  # type: ignore[no-untyped-def]
        handle = (
            safedma.RemoteCopy(x_ref, o_ref, recv_sem)
            .with_send_sem(send_sem)
            .to(safedma.neighbour("x"))
            .start()
        )
        even = safedma.my_index("x") % 2 == 0

        @pl.when(even)
        def _() -> None:
            handle.wait_send()
            handle.wait_recv()

        @pl.when(jnp.logical_not(even))
        def _() -> None:
            handle.wait()

    x, y = run_on_mesh(kernel, [safedma.dma_semaphore()] * 2)
    np.testing.assert_array_equal(blocks_1d(y), np.roll(blocks_1d(x), 1, axis=0))
