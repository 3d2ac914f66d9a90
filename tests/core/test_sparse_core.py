"""SparseCore kernels: pipelines with a traced grid, copies kept as handles, scatter-adds
and MPMD bodies, checked as on TensorCores where the hardware allows the same.

* a ``core_kernel`` whose ``emit_pipeline`` has a traced grid and no specs, starting one
  copy per row in Python loops and waiting them in order in a ``pl.loop``;
* a histogram: copies kept as handles, a zero fill, a scatter-add (``add=True`` to a window
  is T5, naming the SparseCore form);
* an MPMD reduce-scatter step: a scalar-subcore body and a vector-subcore one, each checked
  as its own kernel.

Each correct kernel lowers to the Mosaic of its raw pltpu spelling; each seeded mistake is
stopped at trace time naming the user's line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_text
from tests.support.source_lines import line_in, raising_lines

SAFE, RAW = True, False


# --- a SparseCore histogram: copies kept as handles, a zero fill, a scatter-add ---------

W, WINDOWS, HIST = 16, 2, 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _TopKScratch:
    """The kernel's scratch as one dataclass, flattened for ``pl.kernel`` and rebuilt in the
    body (tokamax's ``TopKScratch``); its semaphore is the type ``pltpu.SemaphoreType.DMA``."""

    sem: Any
    keys: Any
    values: Any
    histogram: Any
    zeros: Any
    indices: Any
    global_histogram: Any


def _histogram(safe: bool, with_values: bool = True, seed: str | None = None) -> Any:
    """tokamax's SparseCore top-k (``experimental/tpu/topk``): per window the keys and
    (optionally: ``None`` otherwise) the values copied in on one semaphore and waited through
    their descriptors; in a ``while_loop`` over digits the leader starts zeroing the shared
    histogram on the last window (the descriptor dropped) and waits it, rebuilt, in nested
    ``pl.when`` blocks; between two subcore barriers every subcore scatter-adds its histogram
    into the shared one (``sync_copy(..., add=True)`` at ``global.at[indices]``)."""

    def start(src: Any, dst: Any, sem: Any) -> Any:
        if safe:
            return sd.LocalCopy(src, dst, sem).start()  # WINDOW
        return pltpu.async_copy(src, dst, sem)

    def sync(src: Any, dst: Any, add: bool = False) -> None:
        if safe:
            sd.sync_copy(src, dst, add=add)  # SYNC
        else:
            pltpu.sync_copy(src, dst, add=add)

    def kernel(keys_ref: Any, values_ref: Any, out_keys: Any, out_hist: Any, *flat: Any) -> None:
        from jax.experimental.pallas import tpu_sc as plsc

        s = tree.unflatten(flat)
        leader = jax.lax.axis_index("subcore") == 0
        sync(keys_ref.at[pl.ds(0, HIST)], s.indices)

        @pl.loop(0, WINDOWS)
        def _(window: Any) -> None:
            last = window == WINDOWS - 1
            keys_copy = start(keys_ref.at[pl.ds(window * W, W)], s.keys, s.sem)
            vals_copy = None
            if with_values:
                vals_copy = start(values_ref.at[pl.ds(window * W, W)], s.values, s.sem)
            keys_copy.wait()
            del keys_copy
            if vals_copy is not None:
                vals_copy.wait()
            del vals_copy

            def digit_step(digit: Any) -> Any:
                @pl.when(leader & last)
                def _() -> None:
                    start(s.zeros, s.global_histogram, s.sem)  # ZERO FILL

                s.histogram[...] = s.keys[...] + s.values[...]

                @pl.when(last)
                def _() -> None:
                    if seed != "zero_fill_wait_dropped":

                        @pl.when(leader)
                        def _() -> None:
                            if safe:
                                zero_fill = sd.LocalCopy(s.zeros, s.global_histogram, s.sem)
                                zero_fill.started_elsewhere().wait()
                            else:
                                pltpu.make_async_copy(s.zeros, s.global_histogram, s.sem).wait()

                    plsc.subcore_barrier()
                    target = s.global_histogram.at[s.indices]
                    if seed == "scatter_add_to_a_window":
                        target = s.global_histogram
                    sync(s.histogram, target, add=True)
                    plsc.subcore_barrier()
                    sync(s.global_histogram, s.histogram)

                return digit - 1

            jax.lax.while_loop(lambda d: d >= 0, digit_step, jnp.int32(1))

        sync(s.keys, out_keys)
        sync(s.histogram, out_hist)

    scratch = _TopKScratch(
        sem=pltpu.SemaphoreType.DMA,
        keys=pltpu.VMEM((W,), jnp.int32),
        values=pltpu.VMEM((W,), jnp.int32),
        histogram=pltpu.VMEM((HIST,), jnp.int32),
        zeros=pltpu.VMEM((HIST,), jnp.int32),
        indices=pltpu.VMEM((HIST,), jnp.int32),
        global_histogram=pltpu.VMEM_SHARED((HIST,), jnp.int32),
    )
    flat_scratch, tree = jax.tree.flatten(scratch)

    def run(keys: jax.Array, values: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        entry: Any = sd.core_kernel if safe else pl.kernel
        out = (jax.ShapeDtypeStruct((W,), jnp.int32), jax.ShapeDtypeStruct((HIST,), jnp.int32))
        return entry(kernel, out, mesh=mesh, scratch_types=flat_scratch, name="topk_multitile")(
            keys, values
        )

    return jax.jit(run)


def _histogram_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((W * WINDOWS,), jnp.int32),) * 2


@pytest.mark.parametrize("with_values", [True, False], ids=["values", "no_values"])
def test_sparse_core_histogram_matches_raw(with_values: bool) -> None:
    # Before the fix: T5 (UnsupportedDmaError) for the scatter-add, which SparseCore lowers.
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(
        _histogram(SAFE, with_values), _histogram(RAW, with_values), *_histogram_args(), mesh=mesh
    )
    text = mosaic_text(_histogram(SAFE, with_values), *_histogram_args(), mesh=mesh)
    assert "add = true" in text


def test_scatter_add_to_a_window_is_t5_naming_the_sparse_core_form() -> None:
    with pytest.raises(sd.UnsupportedDmaError) as err:
        mosaic_text(
            _histogram(SAFE, seed="scatter_add_to_a_window"),
            *_histogram_args(),
            mesh=abstract_mesh((), (), tpu="v5p"),
        )
    assert line_in(_histogram, "# SYNC") in raising_lines(err, __file__)
    assert "dst.at[indices]" in str(err.value) and "acc[...] += buf[...]" in str(err.value)


def test_zero_fill_wait_dropped_is_t7_at_its_start() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(
            _histogram(SAFE, seed="zero_fill_wait_dropped"),
            *_histogram_args(),
            mesh=abstract_mesh((), (), tpu="v5p"),
        )
    text = str(err.value)
    # The refs are named by the kernel's parameters (``flat[4] -> flat[6]``: the author
    # flattens the scratch dataclass for pl.kernel); the lines name the user's call.
    started = f"{__file__}:{line_in(_histogram, '# WINDOW')}"
    assert f"{started} (called from {__file__}:{line_in(_histogram, '# ZERO FILL')}" in text


# --- an MPMD SparseCore reduce-scatter step: a scalar-subcore body and a vector one -------

SC_N = 16


def _mpmd_bodies(safe: bool, seed: str | None = None) -> tuple[Any, Any]:
    """jax's ``tpu_sparsecore_pallas_distributed_test.py`` (``test_mpmd_reduce_scatter``),
    on one device: ``pl.kernel`` with a body per mesh (scalar subcores, vector subcores);
    keyword scratch, each REGULAR semaphore placed on one mesh (``@ mesh``); the scalar
    body moves the data with DMAs on ``run_scoped`` semaphores (keyword, the semaphore
    types themselves) and hands each round to the vector body with a signal addressed by
    ``{"subcore": 0}``; the vector body gather-adds the received rows
    (``sync_copy(recv.at[iota], vmem, add=True)``) and signals back ``{"core": 0}``."""

    def go_scs(x_hbm: Any, out_ref: Any, *, send: Any, recv: Any, to_scs: Any, to_vec: Any) -> None:
        del out_ref

        def body(send_sem: Any, recv_sem: Any) -> None:
            if safe:
                sd.LocalCopy(x_hbm, send, send_sem).start().wait()
            else:
                pltpu.async_copy(x_hbm, send, send_sem).wait()

            @pl.loop(1, 3)
            def _(i: Any) -> None:
                if safe:
                    handle = sd.LocalCopy(send, recv, recv_sem).start()  # ROUND
                    if seed != "round_wait_dropped":
                        handle.wait()
                    sd.signal(to_vec, device=sd.device(subcore=0))
                    sd.wait(to_scs, 1)
                else:
                    pltpu.async_copy(send, recv, recv_sem).wait()
                    pl.semaphore_signal(to_vec, device_id={"subcore": 0})
                    pl.semaphore_wait(to_scs, 1)

        if safe:
            sd.run_scoped(body, send_sem=sd.dma_semaphore(), recv_sem=sd.dma_semaphore())
        else:
            pl.run_scoped(body, send_sem=pltpu.SemaphoreType.DMA, recv_sem=pltpu.SemaphoreType.DMA)

    def go_vec(x_hbm: Any, out_ref: Any, *, send: Any, recv: Any, to_scs: Any, to_vec: Any) -> None:
        sync: Any = sd.sync_copy if safe else pltpu.sync_copy

        def body(vmem: Any, iota: Any) -> None:
            sync(x_hbm, iota)

            @pl.loop(1, 3)
            def _(i: Any) -> None:
                sync(x_hbm, vmem)
                if safe:
                    sd.wait(to_vec, 1)
                else:
                    pl.semaphore_wait(to_vec, 1)
                sync(recv.at[iota], vmem, add=True)
                sync(vmem, send)
                if safe:
                    sd.signal(to_scs, device=sd.device(core=0))
                else:
                    pl.semaphore_signal(to_scs, device_id={"core": 0})

            sync(vmem, out_ref)

        scoped: Any = sd.run_scoped if safe else pl.run_scoped
        scoped(body, pltpu.VMEM((SC_N,), jnp.int32), pltpu.VMEM((SC_N,), jnp.int32))

    return go_scs, go_vec


def _mpmd(safe: bool, seed: str | None = None) -> Any:
    def run(x: jax.Array) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        scs = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)
        vec = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        scratch = dict(
            send=pltpu.VMEM_SHARED((SC_N,), jnp.int32),
            recv=pltpu.VMEM_SHARED((SC_N,), jnp.int32),
            to_scs=pltpu.SemaphoreType.REGULAR(()) @ scs,
            to_vec=pltpu.SemaphoreType.REGULAR(()) @ vec,
        )
        out = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
        params = pltpu.CompilerParams(needs_layout_passes=False)
        bodies = list(_mpmd_bodies(safe, seed))
        if safe:
            call = sd.core_kernel(
                bodies, out, mesh=[scs, vec], scratch_types=scratch, compiler_params=params
            )
        else:
            call = pl.kernel(
                body=bodies,
                out_type=out,
                mesh=[scs, vec],
                scratch_types=scratch,
                compiler_params=params,
            )
        return call(x)

    return jax.jit(run)


# jax 0.10.2 cannot export an MPMD kernel whose device ids cross core types ("Cannot export
# MPMD kernels to a different core type when forward compatibility is enabled"), raw or not.
needs_012 = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12), reason="jax 0.12 MPMD export"
)


@needs_012
@pytest.mark.filterwarnings("ignore::Warning")  # 0.12's SparseCore push-stream notice
def test_mpmd_sparse_core_bodies_match_raw() -> None:
    # Before the fix: sd.core_kernel took one body (a list was wrapped as one kernel).
    x = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
    mesh = abstract_mesh((), (), tpu="v5p")
    assert_same_mosaic(_mpmd(SAFE), _mpmd(RAW), x, mesh=mesh)


@needs_012
@pytest.mark.filterwarnings("ignore::Warning")
def test_mpmd_body_checked_as_its_own_kernel() -> None:
    x = jax.ShapeDtypeStruct((SC_N,), jnp.int32)
    with pytest.raises(sd.CopyNeverWaitedError) as err:
        mosaic_text(_mpmd(SAFE, "round_wait_dropped"), x, mesh=abstract_mesh((), (), tpu="v5p"))
    assert str(err.value).startswith("kernel 'go_scs'")
    assert f"{__file__}:{line_in(_mpmd_bodies, '# ROUND')}" in str(err.value)


def _tpu_mesh() -> Any:
    return abstract_mesh((), (), tpu="v5p")


# --- SparseCore: a pipeline with a traced grid, row copies waited in order ---------------

SIMD, LANES, COL, OUT, HID = 8, 128, 256, 64, 256


def _sc_gather(safe: bool, *, forget_bitcast: bool = False, drop_row_waits: bool = False) -> Any:
    make = sd.LocalCopy if safe else pltpu.make_async_copy

    def kernel(
        end_ref: Any,
        x_hbm: Any,
        idx_hbm: Any,
        o_hbm: Any,
        end_buf: Any,
        rows_buf: Any,
        idx_buf: Any,
        sems: Any,
    ) -> None:
        recv, send = sems.at[0], sems.at[1]
        cores = jax.lax.axis_size(("core", "subcore"))
        copies = [make(end_ref.at[:1], end_buf.at[:1], recv)]
        if safe:
            for handle in [c.start() for c in copies]:
                handle.wait()
        else:
            jax.tree.map(lambda c: c.start(), copies)
            jax.tree.map(lambda c: c.wait(), copies)
        blocks = pl.cdiv(end_buf[...][0], SIMD * cores)

        def inner() -> None:
            row0 = (pl.program_id(0) * cores + pl.program_id(1)) * SIMD
            (sd.sync_copy if safe else pltpu.sync_copy)(idx_hbm.at[pl.ds(row0, SIMD)], idx_buf)
            idx = idx_buf[...]
            src = x_hbm if forget_bitcast else x_hbm.bitcast(jnp.uint32)
            out = o_hbm.bitcast(jnp.uint32)
            for col in range(0, COL, LANES):
                for row in range(SIMD):
                    row_copy = make(  # USER
                        src.at[idx[row], pl.ds(col, LANES)],
                        rows_buf.at[row, pl.ds(col, LANES)],
                        recv,
                    )
                    row_copy.start()  # STARTED

            @pl.loop(0, COL, step=LANES)
            def _(col: Any) -> None:
                one = make(src.at[0, :LANES], rows_buf.at[0, :LANES], recv)
                for _row in range(0 if drop_row_waits else SIMD):
                    (one.started_elsewhere() if safe else one).wait()
                for row in range(SIMD):
                    make(
                        rows_buf.at[row, pl.ds(col, LANES)],
                        out.at[row0 + row, pl.ds(col, LANES)],
                        send,
                    ).start()

            one = make(rows_buf.at[0, :LANES], out.at[0, :LANES], send)
            for _col in range(0, COL, LANES):
                for _row in range(SIMD):
                    (one.started_elsewhere() if safe else one).wait()

        (sd.emit_pipeline if safe else pltpu.emit_pipeline)(
            inner,
            grid=(blocks, cores),
            core_axis_name=("core", "subcore"),
            dimension_semantics=(pltpu.ARBITRARY, pltpu.PARALLEL),
        )()

    return kernel


def _sc_call(kernel: Any, entry: Any) -> Any:
    from jax.experimental.pallas import tpu_sc as plsc

    def run(end: jax.Array, x: jax.Array, idx: jax.Array) -> Any:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        scratch = [
            pltpu.VMEM((SIMD,), jnp.int32),
            pltpu.VMEM((SIMD, COL), jnp.uint32),
            pltpu.VMEM((SIMD,), jnp.int32),
            sd.dma_semaphores(2),
        ]
        params = pltpu.CompilerParams(use_tc_tiling_on_sc=True, needs_layout_passes=False)
        out = jax.ShapeDtypeStruct((OUT, HID), jnp.float32)
        return entry(kernel, out, mesh=mesh, scratch_types=scratch, compiler_params=params)(
            end, x, idx
        )

    return jax.jit(run)


def _sc_args() -> tuple[jax.ShapeDtypeStruct, ...]:
    return (
        jax.ShapeDtypeStruct((1,), jnp.int32),
        jax.ShapeDtypeStruct((OUT, HID), jnp.float32),
        jax.ShapeDtypeStruct((OUT,), jnp.int32),
    )


def test_sparse_core_pipeline_with_a_traced_grid_matches_raw() -> None:
    assert_same_mosaic(
        _sc_call(_sc_gather(SAFE), sd.core_kernel),
        _sc_call(_sc_gather(RAW), pl.kernel),
        *_sc_args(),
        mesh=_tpu_mesh(),
    )


def test_sparse_core_forgotten_bitcast_is_t2_at_the_users_line() -> None:
    broken = _sc_call(_sc_gather(SAFE, forget_bitcast=True), sd.core_kernel)
    with pytest.raises(sd.CopyDtypeMismatchError, match="float32 and uint32") as err:
        mosaic_text(broken, *_sc_args(), mesh=_tpu_mesh())
    assert line_in(_sc_gather, "# USER") in raising_lines(err, __file__)


def test_sparse_core_ordered_waits_dropped_is_t7_in_the_pipeline_body() -> None:
    broken = _sc_call(_sc_gather(SAFE, drop_row_waits=True), sd.core_kernel)
    # A copy the body leaves in flight on a kernel's semaphore is the kernel's
    # to wait after the pipeline; nothing waits it there either, so the kernel reports it.
    with pytest.raises(sd.CopyNeverWaitedError, match="in the body 'inner'") as err:
        mosaic_text(broken, *_sc_args(), mesh=_tpu_mesh())
    message = str(err.value)
    assert f"{__file__}:{line_in(_sc_gather, '# STARTED')}" in message, message
    # refs the pipeline body closes over keep the kernel's names.
    assert "x_hbm.at[...] uint32[128] -> rows_buf.at[...] uint32[128]" in message, message
    # The row loop's copies share one start line and buffers: one line with their count
    # , not one line per row.
    assert message.count("wait() never called") == 1, message
    assert f"  - {SIMD * COL // LANES} copies of LocalCopy x_hbm.at[...]" in message, message
