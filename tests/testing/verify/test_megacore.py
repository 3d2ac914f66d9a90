"""verify on a megacore chip: a pallas_call's "parallel" grid dimensions split between
the two TensorCores of a v4/v5p device (docs/verify-model.md, rule 11).

Each kernel here is written for this file in raw pltpu (and, where the typed API
covers it, in safedma). With a mesh naming a megacore TPU (``tpu="v5p"``), each
core runs its contiguous part of the leading parallel dimensions with its own
scratch, semaphores, scalar-prefetch copies and pipeline; HBM is shared. With a
one-core chip (``tpu="v5e"``) or no TPU named, the grid runs in order on one core,
as before.

* a kernel written for the split (each core starts its own prefetch chain from a
  flag in its scalar-prefetch copy, as jax's and axlearn's paged attention do) is
  clean on v5p and a real deadlock on v5e;
* a kernel that prefetches the next grid step across the split boundary is clean
  in order and a deadlock on v5p naming core 1, this file's line and the fix;
* an output block both cores copy out, and a block accumulated across a parallel
  dimension, are reported on v5p;
* odd sizes, several leading parallel dimensions, a parallel dimension after an
  arbitrary one, remote copies between the cores' counterparts on other devices,
  a real (compile-only) v5p mesh;
* the distributed guide's megacore advice: DMAs from one index of a "parallel" axis are
  clean.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import (
    DeadlockError,
    RaceDetectedError,
    SimulationTimeoutError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    abstract_mesh,
    verify,
)
from safedma.testing._verify.walk.megacore import CorePart, core_parts, describe_parts
from tests.corpus import grids
from tests.corpus._case import marked_lines
from tests.corpus._seeding import DropWait, unjitted

F32 = jnp.float32
HERE = Path(__file__)
ANY = pl.BlockSpec(memory_space=pl.ANY)
ROWS = 8
V5P = abstract_mesh((), (), tpu="v5p")
V5E = abstract_mesh((), (), tpu="v5e")
V4 = abstract_mesh((), (), tpu="v4")
X = jax.ShapeDtypeStruct((48, 128), F32)


def _line(tag: str) -> str:
    return f"{HERE.name}:{marked_lines(HERE, tag)[0]}"


def _params(*semantics: Any) -> Any:
    return pltpu.CompilerParams(dimension_semantics=semantics)


# ------------------------------------------------ a kernel written for the split


def per_core_chain(flag: Any, slot: Any, x_hbm: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    """Grid (2, 3): step s = 3c + j copies row block s. The chain starts where this
    core's flag (a scalar-prefetch value, copied per core) is still set, and each step
    prefetches the next one inside the same c; the slot index lives in SMEM too."""
    c, j = pl.program_id(0), pl.program_id(1)
    s = c * 3 + j
    cur = slot[0]

    def fetch(step: Any, into: Any) -> Any:
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(step * ROWS, ROWS)], buf.at[into], sems.at[into]
        )

    @pl.when(flag[0] == 1)
    def _() -> None:
        fetch(s, cur).start()

    flag[0] = 0

    @pl.when(j < 2)
    def _() -> None:
        fetch(s + 1, 1 - cur).start()
        slot[0] = 1 - cur

    fetch(s, cur).wait()  # fix: mc_chain_wait
    o_ref[...] = buf[cur]


def _per_core_chain(x: jax.Array) -> jax.Array:
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(2, 3),
        in_specs=[ANY],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j, *_: (c * 3 + j, 0)),
        scratch_shapes=[pltpu.VMEM((2, ROWS, 128), F32), pltpu.SemaphoreType.DMA((2,))],
    )
    flag, slot = jnp.ones((1,), jnp.int32), jnp.zeros((1,), jnp.int32)
    out: jax.Array = pl.pallas_call(
        per_core_chain,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((48, 128), F32),
        compiler_params=_params("parallel", "arbitrary"),
    )(flag, slot, x)
    return out


def test_a_chain_each_core_starts_from_its_own_flag_is_clean_on_v5p_and_v4() -> None:
    assert verify(_per_core_chain, X, mesh=V5P).dmas == 6
    assert verify(_per_core_chain, X, mesh=V4).dmas == 6


@pytest.mark.parametrize("tpu", ["v5e", "v6e", "tpu7x"])
def test_the_same_kernel_deadlocks_on_a_one_core_device_and_says_so(tpu: str) -> None:
    """tpu7x has two TensorCores per chip but no megacore: each is its own device."""
    with pytest.raises(DeadlockError) as err:
        verify(_per_core_chain, X, mesh=abstract_mesh((), (), tpu=tpu))
    text = str(err.value)
    assert _line("mc_chain_wait") in text, text
    assert f"{tpu} has one TensorCore per device" in text, text
    assert "core 1" not in text, text


def test_with_no_tpu_named_the_deadlock_keeps_the_megacore_note() -> None:
    with pytest.raises(DeadlockError, match="(?s)Note:.*megacore.*tpu='v5p'"):
        verify(_per_core_chain, X)


# ------------------------------------- a prefetch across the split boundary


def cross_boundary(x_hbm: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    """Grid (2, 3) run as one chain of 6 steps: started at step 0, each step prefetches
    the next, including from (0, 2) to (1, 0), the boundary of the split."""
    s = pl.program_id(0) * 3 + pl.program_id(1)

    def fetch(step: Any) -> Any:
        rows = x_hbm.at[pl.ds(step * ROWS, ROWS)]
        return pltpu.make_async_copy(rows, buf.at[step % 2], sems.at[step % 2])

    @pl.when(s == 0)
    def _() -> None:
        fetch(s).start()

    @pl.when(s + 1 < 6)
    def _() -> None:
        fetch(s + 1).start()

    fetch(s).wait()  # fix: mc_cross_wait
    o_ref[...] = buf[s % 2]


def _cross_boundary(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(  # fix: mc_cross_call
        cross_boundary,
        grid=(2, 3),
        in_specs=[ANY],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0)),
        out_shape=jax.ShapeDtypeStruct((48, 128), F32),
        scratch_shapes=[pltpu.VMEM((2, ROWS, 128), F32), pltpu.SemaphoreType.DMA((2,))],
        compiler_params=_params("parallel", "arbitrary"),
    )(x)
    return out


def test_a_chain_across_the_split_is_clean_in_order() -> None:
    assert verify(_cross_boundary, X, mesh=V5E).dmas == 6
    assert verify(_cross_boundary, X).dmas == 6


def test_a_chain_across_the_split_deadlocks_on_v5p_naming_core_line_and_fix() -> None:
    with pytest.raises(DeadlockError) as err:
        verify(_cross_boundary, X, mesh=V5P)
    text = str(err.value)
    assert re.search(rf"device 0 core 1 waits at \S*{_line('mc_cross_wait')}", text), text
    assert "core 0 runs grid steps (0, 0) to (0, 2), core 1 runs grid steps (1, 0)" in text
    assert _line("mc_cross_call") in text, text
    assert "Fix: start the chain" in text, text


# ------------------------------------------------ outputs on shared HBM


def copy_block(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


def _one_output_block(x: jax.Array) -> jax.Array:
    """Every step writes the same output block (the index map ignores the grid)."""
    out: jax.Array = pl.pallas_call(  # fix: mc_shared_out
        copy_block,
        grid=(2, 3),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0))],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), F32),
        compiler_params=_params("parallel", "arbitrary"),
    )(x)
    return out


def test_an_output_block_both_cores_copy_out_is_a_race_on_v5p() -> None:
    one_core = verify(_one_output_block, X, mesh=V5E)  # one core: the steps run in order
    assert one_core.devices == 1 and one_core.kernels == ("copy_block",), one_core
    with pytest.raises(RaceDetectedError) as err:
        verify(_one_output_block, X, mesh=V5P)
    text = str(err.value)
    assert "o_ref[0:8, 0:128]" in text, text
    assert "device 0 core 0" in text and "device 0 core 1" in text, text
    assert _line("mc_shared_out") in text, text
    assert "Fix: make the output's index map give each core its own blocks" in text, text


def copy_and_keep_a_scratch_output(x_ref: Any, o_ref: Any, m_ref: Any) -> None:
    """m_ref is an output used as scratch (one block for the whole grid, as jax
    0.10's splash attention does with its m/l/o accumulators), which the caller drops."""
    m_ref[...] = x_ref[...]
    o_ref[...] = m_ref[...]


def _dropped_scratch_output(x: jax.Array) -> jax.Array:
    out, _ = pl.pallas_call(
        copy_and_keep_a_scratch_output,
        grid=(2, 3),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0))],
        out_specs=[
            pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0)),
            pl.BlockSpec((ROWS, 128), lambda c, j: (0, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((48, 128), F32),
            jax.ShapeDtypeStruct((ROWS, 128), F32),
        ],
        compiler_params=_params("parallel", "arbitrary"),
    )(x)
    return cast(jax.Array, out)


def test_an_output_both_cores_write_but_the_program_drops_is_not_a_race() -> None:
    assert verify(_dropped_scratch_output, X, mesh=V5P).kernels


def accumulate(x_ref: Any, o_ref: Any, acc: Any) -> None:
    """A sum over the whole grid in scratch, written out at the grid's last step."""
    c, j = pl.program_id(0), pl.program_id(1)

    @pl.when((c == 0) & (j == 0))
    def _() -> None:
        acc[...] = jnp.zeros_like(acc)

    acc[...] += x_ref[...]

    @pl.when((c == 1) & (j == 2))
    def _() -> None:
        o_ref[...] = acc[...]


def _accumulate(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(  # fix: mc_accumulate
        accumulate,
        grid=(2, 3),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0))],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), F32),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), F32)],
        compiler_params=_params("parallel", "arbitrary"),
    )(x)
    return out


def test_a_sum_accumulated_across_a_parallel_dimension_is_reported_on_v5p() -> None:
    one_core = verify(_accumulate, X, mesh=V5E)  # one core: the steps run in order
    assert one_core.devices == 1 and one_core.kernels == ("accumulate",), one_core
    with pytest.raises(UnwrittenReadError) as err:
        verify(_accumulate, X, mesh=V5P)
    text = str(err.value)
    assert "device 0 core 0" in text or "device 0 core 1" in text, text
    assert _line("mc_accumulate") in text, text
    assert "mark the dimension 'arbitrary'" in text, text


# ------------------------------------------------ how the grid is divided


def test_the_parallel_subgrid_is_cut_into_contiguous_parts_the_first_core_larger() -> None:
    def points(grid: tuple[int, ...], lead: int) -> list[list[tuple[int, ...]]]:
        return [list(part) for part in core_parts(grid, lead, 2)]

    assert points((3, 2), 1) == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1)]]
    parts = core_parts((3, 3, 2), 2, 2)  # 9 parallel points: 5 and 4
    assert [len(p) for p in parts] == [10, 8]
    assert [len(list(p)) for p in parts] == [10, 8]
    assert parts[1].first == (1, 2, 0) == next(iter(parts[1]))
    assert parts[1].last == (2, 2, 1) == list(parts[1])[-1]
    assert points((1, 4), 1) == [[(0, 0), (0, 1), (0, 2), (0, 3)], []]
    assert points((0, 4), 1) == [[], []]


def test_a_huge_split_grid_is_not_listed_before_it_runs() -> None:
    """Each core's part is made one point at a time (a list of 10**8 points took GBs
    before the time budget could stop the run): describing it costs nothing."""
    parts = core_parts((10**4, 10**4), 1, 2)
    assert [len(p) for p in parts] == [5 * 10**7, 5 * 10**7]
    assert parts[1].first == (5000, 0) and parts[1].last == (9999, 9999)
    assert "core 1 runs grid steps (5000, 0) to (9999, 9999)" in describe_parts(parts)


def test_a_huge_split_grid_stops_at_the_timeout_on_both_cores() -> None:
    def kernel(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...]

    def fn(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), F32),
            grid=(10**4, 10**4),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j: (0, 0)),
            compiler_params=_params("parallel", "arbitrary"),
        )(x)
        return out

    t0 = time.monotonic()
    with pytest.raises(SimulationTimeoutError, match=r"still in the grid of kernel kernel at"):
        verify(fn, jax.ShapeDtypeStruct((8, 128), F32), mesh=V5P, timeout_s=1.0)
    assert time.monotonic() - t0 < 60


def row_chain(x_hbm: Any, o_ref: Any, buf: Any, sems: Any) -> None:
    """A chain per value of every leading dimension: started where the last index is 0."""
    *lead, j = (pl.program_id(d) for d in range(3))
    n = pl.num_programs(2)
    row = (lead[0] * pl.num_programs(1) + lead[1]) * n + j

    def fetch(r: Any) -> Any:
        return pltpu.make_async_copy(x_hbm.at[pl.ds(r * ROWS, ROWS)], buf.at[r % 2], sems.at[r % 2])

    @pl.when(j == 0)
    def _() -> None:
        fetch(row).start()

    @pl.when(j + 1 < n)
    def _() -> None:
        fetch(row + 1).start()

    fetch(row).wait()
    o_ref[...] = buf[row % 2]


def _row_chain(grid: tuple[int, int, int], semantics: tuple[str, ...]) -> Callable[..., Any]:
    def fn(x: jax.Array) -> jax.Array:
        a, b, n = grid
        out: jax.Array = pl.pallas_call(
            row_chain,
            grid=grid,
            in_specs=[ANY],
            out_specs=pl.BlockSpec((ROWS, 128), lambda i, k, j: ((i * b + k) * n + j, 0)),
            out_shape=jax.ShapeDtypeStruct((a * b * n * ROWS, 128), F32),
            scratch_shapes=[pltpu.VMEM((2, ROWS, 128), F32), pltpu.SemaphoreType.DMA((2,))],
            compiler_params=_params(*semantics),
        )(x)
        return out

    return fn


@pytest.mark.parametrize(
    ("grid", "semantics", "clean"),
    [
        ((3, 1, 2), ("parallel", "arbitrary", "arbitrary"), True),  # odd: 2 and 1
        ((3, 3, 2), ("parallel", "parallel", "arbitrary"), True),  # 9 points: 5 and 4
        ((1, 1, 3), ("parallel", "arbitrary", "arbitrary"), True),  # core 1 runs nothing
        ((2, 2, 3), ("parallel", "parallel", "parallel"), True),  # the cut falls between rows
        # the cut falls inside a chain (core 0 runs j = 0, 1; core 1 runs j = 2)
        ((1, 1, 3), ("parallel", "parallel", "parallel"), False),
        ((3, 1, 3), ("parallel", "parallel", "parallel"), False),
    ],
)
def test_chains_that_restart_per_parallel_point_verify_for_any_split(
    grid: tuple[int, int, int], semantics: tuple[str, ...], clean: bool
) -> None:
    x = jax.ShapeDtypeStruct((int(np.prod(grid)) * ROWS, 128), F32)
    chained = _row_chain(grid, semantics)
    if clean:
        assert verify(chained, x, mesh=V5P).dmas == int(np.prod(grid))
    else:
        with pytest.raises(DeadlockError, match="device 0 core 1 waits"):
            verify(chained, x, mesh=V5P)
    assert verify(chained, x, mesh=V5E).dmas == int(np.prod(grid))


def test_a_parallel_dimension_after_an_arbitrary_one_is_unsupported_on_v5p() -> None:
    chained = _row_chain((2, 2, 2), ("arbitrary", "parallel", "arbitrary"))
    x = jax.ShapeDtypeStruct((8 * ROWS, 128), F32)
    with pytest.raises(VerificationUnsupportedError, match=r"(?s)dimension\(s\) \(1,\).*lead"):
        verify(chained, x, mesh=V5P)
    assert verify(chained, x, mesh=V5E).dmas == 8


# ------------------------------------- cores talking to their counterparts


def send_right(x_ref: Any, o_hbm: Any, send: Any, recv: Any) -> None:
    """Each core sends its row block to the same rows of the right neighbour's output."""
    c = pl.program_id(0)
    right = {"x": (lax.axis_index("x") + 1) % lax.axis_size("x")}
    rows = o_hbm.at[pl.ds(c * ROWS, ROWS)]
    copy = pltpu.make_async_remote_copy(x_ref, rows, send, recv, device_id=right)
    copy.start()
    copy.wait_send()
    copy.wait_recv()


def _send_right(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        send_right,
        grid=(2,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda c: (c, 0))],
        out_specs=ANY,
        out_shape=jax.ShapeDtypeStruct((2 * ROWS, 128), F32),
        scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        compiler_params=_params("parallel"),
    )(x)
    return out


@pytest.mark.parametrize("devices", [2, 4])
def test_each_core_copies_to_its_counterpart_behind_the_device_barrier(devices: int) -> None:
    x = jax.ShapeDtypeStruct((devices * 2 * ROWS, 128), F32)
    mesh = abstract_mesh((devices,), ("x",), tpu="v5p")
    report = verify(_send_right, x, mesh=mesh)
    assert report.remote_dmas == 2 * devices
    one_core = verify(_send_right, x, mesh=abstract_mesh((devices,), ("x",), tpu="v5e"))
    assert one_core.devices == devices and one_core.remote_dmas == 2 * devices, one_core


def test_a_compile_only_v5p_mesh_names_the_megacore() -> None:
    pytest.importorskip("libtpu")
    from safedma.testing import tpu_mesh

    mesh = tpu_mesh("v5p:2x2x1", (4,), ("x",))
    # the four devices' core 1 block at one wait: one line naming them (test_deadlock_lines)
    with pytest.raises(DeadlockError, match=r"4 cores \(device 0 \(x=0\) core 1, "):
        verify(_cross_boundary, jax.ShapeDtypeStruct((4 * 48, 128), F32), mesh=mesh)


# ------------------------------------------------ the same kernels in safedma


def typed_per_core_chain(
    flag: sd.DataRef,
    slot: sd.DataRef,
    x_hbm: sd.DataRef,
    o_ref: sd.DataRef,
    buf: sd.DataRef,
    sems: sd.SemArray,
) -> None:
    c, j = pl.program_id(0), pl.program_id(1)
    s = c * 3 + j
    cur = slot[0]

    def fetch(step: Any, into: Any) -> sd.LocalCopy:
        return sd.LocalCopy(x_hbm.at[pl.ds(step * ROWS, ROWS)], buf.at[into], sems.at[into])

    @pl.when(flag[0] == 1)
    def _() -> None:
        fetch(s, cur).start()

    flag[0] = 0

    @pl.when(j < 2)
    def _() -> None:
        fetch(s + 1, 1 - cur).start()
        slot[0] = 1 - cur

    fetch(s, cur).started_elsewhere().wait()  # fix: mc_typed_wait
    o_ref[...] = buf[cur]


def _typed_per_core_chain(x: jax.Array) -> jax.Array:
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(2, 3),
        in_specs=[ANY],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j, *_: (c * 3 + j, 0)),
        scratch_shapes=[sd.vmem((2, ROWS, 128), F32), sd.dma_semaphores(2)],
    )
    flag, slot = jnp.ones((1,), jnp.int32), jnp.zeros((1,), jnp.int32)
    out: jax.Array = sd.pallas_call(
        typed_per_core_chain,
        jax.ShapeDtypeStruct((48, 128), F32),
        grid_spec=grid_spec,
        compiler_params=_params("parallel", "arbitrary"),
    )(flag, slot, x)
    return out


def test_the_typed_chain_is_clean_on_v5p_and_a_deadlock_on_v5e() -> None:
    assert verify(_typed_per_core_chain, X, mesh=V5P).dmas == 6
    with pytest.raises(DeadlockError) as err:
        verify(_typed_per_core_chain, X, mesh=V5E)
    assert _line("mc_typed_wait") in str(err.value), err.value


def typed_cross_boundary(
    x_hbm: sd.DataRef, o_ref: sd.DataRef, buf: sd.DataRef, sems: sd.SemArray
) -> None:
    s = pl.program_id(0) * 3 + pl.program_id(1)

    def fetch(step: Any) -> sd.LocalCopy:
        rows = x_hbm.at[pl.ds(step * ROWS, ROWS)]
        return sd.LocalCopy(rows, buf.at[step % 2], sems.at[step % 2])

    @pl.when(s == 0)
    def _() -> None:
        fetch(s).start()

    @pl.when(s + 1 < 6)
    def _() -> None:
        fetch(s + 1).start()

    fetch(s).started_elsewhere().wait()  # fix: mc_typed_cross
    o_ref[...] = buf[s % 2]


def _typed_cross_boundary(x: jax.Array) -> jax.Array:
    out: jax.Array = sd.pallas_call(
        typed_cross_boundary,
        jax.ShapeDtypeStruct((48, 128), F32),
        grid=(2, 3),
        in_specs=[ANY],
        out_specs=pl.BlockSpec((ROWS, 128), lambda c, j: (c * 3 + j, 0)),
        scratch_shapes=[sd.vmem((2, ROWS, 128), F32), sd.dma_semaphores(2)],
        compiler_params=_params("parallel", "arbitrary"),
    )(x)
    return out


def test_the_typed_chain_across_the_split_is_reported_on_v5p_only() -> None:
    assert verify(_typed_cross_boundary, X, mesh=V5E).dmas == 6
    with pytest.raises(DeadlockError) as err:
        verify(_typed_cross_boundary, X, mesh=V5P)
    text = str(err.value)
    assert re.search(rf"device 0 core 1 waits at \S*{_line('mc_typed_cross')}", text), text


# ------------------------------------------- jax's shipped kernels on a megacore


def _paged(mode: str | None) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as pa

    fn = functools.partial(
        unjitted(pa.paged_attention), pages_per_compute_block=2, megacore_mode=mode
    )
    q, k, v, lengths, indices = grids.paged_attention_inputs()
    if mode == "kv_head":  # two kv heads, one per core
        rng = np.random.default_rng(0)
        q = jnp.asarray(rng.standard_normal((2, 16, 128)), F32)
        k = v = jnp.asarray(rng.standard_normal((2, 8, 16, 128)), F32)
    return fn, (q, k, v, lengths, indices)


@pytest.mark.parametrize("mode", ["batch", "kv_head"])
def test_jax_paged_attention_in_megacore_mode_is_clean_on_v5p_only(mode: str) -> None:
    fn, args = _paged(mode)
    assert verify(fn, *args, mesh=V5P).dmas > 0
    with pytest.raises(DeadlockError, match="paged_attention_kernel.py"):
        verify(fn, *args, mesh=V5E)


def test_jax_paged_attention_in_megacore_mode_with_a_dropped_wait_is_caught_on_v5p(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as pa

    seeded = DropWait(pa.pltpu, drop=0)
    monkeypatch.setattr(pa, "pltpu", seeded)
    fn, args = _paged("batch")
    with pytest.raises(Exception, match="core [01]") as err:
        verify(fn, *args, mesh=V5P)
    assert seeded.dropped
    assert "paged_attention_kernel.py" in str(err.value), err.value


SPLIT_KERNELS = [
    "matmul",
    "flash_attention_causal",
    "flash_attention_causal_backward",
    "splash_attention_causal",
    "splash_attention_causal_backward",
    "megablox_tgmm",
]


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if "backward" in n else []) for n in SPLIT_KERNELS],
)
def test_jax_blockspec_kernels_with_parallel_dimensions_are_clean_on_v5p(name: str) -> None:
    program = grids.BLOCKSPEC_KERNELS[name]()
    assert verify(program.fn, *program.args, mesh=V5P).kernels


def row_sum(x_ref: Any, o_ref: Any, acc: Any) -> None:
    """A sum over the grid's one (arbitrary) dimension, restarted at its first step."""
    j = pl.program_id(0)

    @pl.when(j == 0)
    def _() -> None:
        acc[...] = jnp.zeros_like(acc)

    acc[...] += x_ref[...]

    @pl.when(j == pl.num_programs(0) - 1)
    def _() -> None:
        o_ref[...] = acc[...]


def _row_sum(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        row_sum,
        grid=(3,),
        in_specs=[pl.BlockSpec((ROWS, 128), lambda j: (j, 0))],
        out_specs=pl.BlockSpec((ROWS, 128), lambda j: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), F32),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), F32)],
        compiler_params=_params("arbitrary"),
    )(x)
    return out


def test_a_grid_dimension_added_by_vmap_is_parallel_and_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from safedma.testing._verify.walk import megacore as _megacore

    splits: list[tuple[tuple[int, ...], list[int]]] = []

    def recorded(grid: tuple[int, ...], lead: int, cores: int) -> list[CorePart]:
        parts = core_parts(grid, lead, cores)
        splits.append((grid, [len(p) for p in parts]))
        return parts

    monkeypatch.setattr(_megacore, "core_parts", recorded)
    x = jax.ShapeDtypeStruct((2, 3 * ROWS, 128), F32)
    assert verify(jax.vmap(_row_sum), x, mesh=V5P).kernels
    assert splits == [((2, 3), [3, 3])], splits
    # program_id(0) is the kernel's own dimension (grid dimension 1), not vmap's
    assert verify(jax.vmap(_row_sum), x, mesh=V5E).kernels
    assert verify(jax.vmap(_row_sum), x).kernels


def test_a_split_kernel_called_twice_in_a_row_is_clean() -> None:
    """Each call's cores enter with the call's number; the barrier and the flags are
    per call."""
    assert verify(_per_core_chain, X, mesh=V5P, invocations=2).dmas == 12
    x = jax.ShapeDtypeStruct((4 * 2 * ROWS, 128), F32)
    mesh = abstract_mesh((4,), ("x",), tpu="v5p")
    assert verify(_send_right, x, mesh=mesh, invocations=2).remote_dmas == 16


def halves(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    c = lax.axis_index("core")
    rows = pl.ds(c * 24, 24)
    copy = pltpu.make_async_copy(x_hbm.at[rows], o_hbm.at[rows], sem)
    copy.start()
    copy.wait()


def _tensorcore_mesh() -> Any:
    fields = str(getattr(getattr(pltpu, "TensorCoreMesh", None), "__dataclass_fields__", ""))
    if "num_cores" in fields:
        return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)
    return pltpu.create_tensorcore_mesh("core", num_cores=2)


def test_a_pl_kernel_over_both_cores_then_a_split_pallas_call_is_clean() -> None:
    def both(x: jax.Array) -> jax.Array:
        y = pl.kernel(
            halves,
            out_type=jax.ShapeDtypeStruct((48, 128), F32),
            mesh=_tensorcore_mesh(),
            scratch_types=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return _per_core_chain(y)

    assert verify(both, X, mesh=V5P).dmas == 8


@pytest.mark.parametrize("tpu", [None, "v5e", "v5p"])
def test_a_pl_kernel_over_two_cores_then_a_barriered_call_on_two_devices(tpu: str | None) -> None:
    """Mosaic's device barrier is taken by the cores that run the call: every device's
    first core (one-core call) or every core (megacore split). Before, it waited for
    every participant, so a program whose pl.kernel made two cores per device
    deadlocked at the next pallas_call's barrier on more than one device."""

    def program(x: jax.Array) -> jax.Array:
        y = pl.kernel(
            halves,
            out_type=jax.ShapeDtypeStruct((48, 128), F32),
            mesh=_tensorcore_mesh(),
            scratch_types=[pltpu.SemaphoreType.DMA(())],
        )(x)
        return _send_right(y[: 2 * ROWS])

    mesh = abstract_mesh((2,), ("x",), tpu=tpu)
    assert verify(program, jax.ShapeDtypeStruct((2 * 48, 128), F32), mesh=mesh).remote_dmas == 4


MESH = pl.DeviceIdType.MESH


def _s(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, F32)


def _signal(sem: Any, to: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=(to,), device_id_type=MESH)


# ------------------------- the distributed guide's megacore advice: DMAs from one core


def _one_core_permute(n: int, cores: int, core: int) -> Any:
    """A grid axis of ``cores`` steps, "parallel"; only grid index ``core`` runs the
    barrier and an HBM-to-HBM remote copy (the guide's "Final Notes: Megacore")."""

    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        me = lax.axis_index("x")
        right, left = lax.rem(me + 1, n), lax.rem(me + n - 1, n)

        @pl.when(pl.program_id(0) == core)
        def _() -> None:
            barrier = pltpu.get_barrier_semaphore()
            _signal(barrier, left)
            _signal(barrier, right)
            pl.semaphore_wait(barrier, 2)
            copy = pltpu.make_async_remote_copy(
                x_ref, o_ref, send, recv, device_id=(right,), device_id_type=MESH
            )
            copy.start()
            copy.wait()

    def fn(x: jax.Array) -> Any:
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(cores,),
            in_specs=[ANY],
            out_specs=ANY,
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            compiler_params=pltpu.CompilerParams(
                collective_id=0, dimension_semantics=("parallel",)
            ),
        )(x)

    return fn


@pytest.mark.parametrize(
    ("tpu", "cores", "core"),
    [("v5p", 2, 0), ("v5p", 2, 1), ("v5e", 2, 0), ("v5e", 2, 1), ("tpu7x", 1, 0)],
)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_dmas_from_one_core_of_a_parallel_axis_are_clean(
    n: int, tpu: str, cores: int, core: int
) -> None:
    report = verify(
        _one_core_permute(n, cores, core),
        _s(8 * n, 128),
        mesh=abstract_mesh((n,), ("x",), tpu=tpu),
        in_specs=P("x"),
        out_specs=P("x"),
        invocations=2,
    )
    assert report.dmas == 2 * n
