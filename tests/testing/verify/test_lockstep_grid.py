"""verify's lockstep path on kernels with a grid: block copies, program ids, aliases, prefetch.

The lockstep path walks a kernel's body once per grid point in row-major order, with
Pallas's pipeline around each point as the per-device walk models it (an input block
copied in before each point, an output block copied out when the next point maps it
elsewhere). Each correct kernel here is proved by the lockstep path alone (the
per-device walk made to fail if it runs) and its report equals the per-device walk's
(``lockstep="off"``); each seeded mistake makes the path give up, and the walk then
answers word for word as without it. jax's own kernels from the corpus, run on every
device of a mesh, get the walk's verdict whether the path proves them or gives up.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import SimulationError, abstract_mesh, verify
from safedma.testing._verify.face import api as _api
from tests import corpus
from tests.corpus._case import Case
from tests.testing.verify.test_distributed_guide_protocols import (
    all_reduce,
    gather,
    reduce_scatter,
)

AXIS = "x"
ROWS = 8
F32 = jnp.float32
ANY = pl.BlockSpec(memory_space=pl.ANY)


def _run(
    program: Callable[[jax.Array], Any], n: int, rows: int, invocations: int = 1
) -> Callable[[], Any]:
    x = jax.ShapeDtypeStruct((n * rows, 128), F32)
    mesh = abstract_mesh((n,), (AXIS,))
    spec = P(AXIS)
    return lambda: verify(
        program, x, mesh=mesh, in_specs=spec, out_specs=spec, invocations=invocations
    )


def _say(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "clean", repr(run())
    except SimulationError as err:
        return type(err).__name__, str(err)


def _proved_alone_as_walked(run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The per-device walk's report (lockstep off), then the lockstep path's with the
    walk made to fail if it runs: the two must be equal."""
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    walked = run()
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    with monkeypatch.context() as patch:

        def no_walk(*args: Any) -> None:
            raise AssertionError("the per-device walk ran")

        patch.setattr(_api, "_walk", no_walk)
        proved = run()
    assert _api._LAST_LOCKSTEP[0] == ""
    assert proved == walked
    return proved


def _gives_up_and_the_walk_answers(
    run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch, reason: str
) -> tuple[str, str]:
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    without = _say(run)
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    with_it = _say(run)
    assert with_it == without
    assert reason in _api._LAST_LOCKSTEP[0], _api._LAST_LOCKSTEP[0]
    return without


# ------------------------------------------------------------------ grid collectives


GUIDE: dict[str, tuple[Callable[[jax.Array], Any], int]] = {
    # a ring all-gather over a grid of n - 1 steps, a receive semaphore per step
    "all_gather": (gather, ROWS),
    # an all-reduce over a grid of n steps: VMEM input and output blocks, HBM scratch
    "all_reduce": (lambda x: all_reduce(x, double=False)[0], ROWS),
    # the same behind a double barrier, its second round on a run_scoped semaphore
    "all_reduce behind a double barrier": (lambda x: all_reduce(x)[0], ROWS),
    # a (step, phase) grid, two accumulators travelling left and right (rows: n blocks
    # of 16 per device, set below)
    "reduce_scatter": (reduce_scatter, 0),
}


@pytest.mark.parametrize("invocations", [1, 2])
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("name", sorted(GUIDE))
def test_grid_collectives_are_proved_by_the_lockstep_path_with_the_walks_report(
    name: str, n: int, invocations: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, rows = GUIDE[name]
    run = _run(program, n, rows or 16 * n, invocations)
    report = _proved_alone_as_walked(run, monkeypatch)
    assert report.devices == n and report.remote_dmas > 0


def test_a_grid_collective_on_many_devices_is_proved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    report = _run(gather, 64, ROWS)()
    assert _api._LAST_LOCKSTEP[0] == ""
    # per device: its own slot copied in, then one slot forwarded per step (63 steps)
    assert (report.devices, report.dmas, report.remote_dmas) == (64, 64 * 64, 64 * 63)


def test_a_gather_on_one_receive_semaphore_makes_it_give_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A neighbour a step ahead may land its next copy on the shared semaphore first."""
    said = _gives_up_and_the_walk_answers(
        _run(functools.partial(gather, shared=True), 4, ROWS), monkeypatch, "earlier wait"
    )
    assert said[0] == "VerifiedRaceError"


# ------------------------------------------------------------------ blocks


def _blocked(
    body: Callable[..., None],
    grid: tuple[int, ...],
    in_map: Callable[..., tuple[Any, ...]],
    out_map: Callable[..., tuple[Any, ...]],
    block: tuple[int, int] = (ROWS, 128),
    scratch: tuple[Any, ...] = (),
    **call: Any,
) -> Callable[[jax.Array], jax.Array]:
    def program(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=grid,
            in_specs=[pl.BlockSpec(block, in_map)],
            out_specs=pl.BlockSpec(block, out_map),
            scratch_shapes=list(scratch),
            **call,
        )(x)
        return out

    return program


def _staged(x_ref: Any, o_ref: Any, stage: Any, sem: Any) -> None:
    """The input block through a VMEM scratch by DMA, then into the output block."""
    copy = pltpu.make_async_copy(x_ref, stage, sem)
    copy.start()
    copy.wait()
    o_ref[...] = stage[...] * 2.0


_STAGE = (pltpu.VMEM((ROWS, 128), F32), pltpu.SemaphoreType.DMA(()))


def _rows_per_device(blocks: int, rows: int = ROWS) -> int:
    return blocks * rows


CLEAN_BLOCKS: dict[str, tuple[Callable[[jax.Array], jax.Array], int]] = {
    "a block per step": (
        _blocked(_staged, (4,), lambda i: (i, 0), lambda i: (i, 0), scratch=_STAGE),
        4 * ROWS,
    ),
    # the output block stays while the inner (arbitrary) dimension runs: copied out
    # when the outer index changes
    "an output block kept over the inner dimension": (
        _blocked(_staged, (2, 3), lambda i, j: (i, 0), lambda i, j: (i, 0), scratch=_STAGE),
        2 * ROWS,
    ),
    # 20 rows in blocks of 8: the last block is cut to the array
    "a partial last block": (
        _blocked(_staged, (3,), lambda i: (i, 0), lambda i: (i, 0), scratch=_STAGE),
        20,
    ),
    # blocks taken in reverse: the index map's arithmetic on program ids
    "blocks in reverse": (
        _blocked(_staged, (4,), lambda i: (3 - i, 0), lambda i: (3 - i, 0), scratch=_STAGE),
        4 * ROWS,
    ),
}


@pytest.mark.parametrize("name", sorted(CLEAN_BLOCKS))
def test_blocked_operands_are_copied_as_the_walk_copies_them(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, rows = CLEAN_BLOCKS[name]
    report = _proved_alone_as_walked(_run(program, 4, rows), monkeypatch)
    assert report.dmas > 0


def _skips_a_step(x_ref: Any, o_ref: Any) -> None:
    @pl.when(pl.program_id(0) != 1)
    def _() -> None:
        o_ref[...] = x_ref[...]


def _copy_left_in_flight(x_ref: Any, o_ref: Any, stage: Any, sem: Any) -> None:
    """The copy out of this step's input block is waited at the next step, after the
    pipeline copied the next block over it."""
    step = pl.program_id(0)
    copy = pltpu.make_async_copy(x_ref, stage, sem)

    @pl.when(step > 0)
    def _() -> None:
        copy.wait()

    copy.start()
    o_ref[...] = x_ref[...]

    @pl.when(step == pl.num_programs(0) - 1)
    def _() -> None:
        copy.wait()


def _plain(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]


MISTAKES: dict[str, tuple[Callable[[jax.Array], jax.Array], int, str, str]] = {
    # (program, rows per device, why the path gives up, the walk's error)
    "an output block left unwritten at one step": (
        _blocked(_skips_a_step, (4,), lambda i: (i, 0), lambda i: (i, 0)),
        4 * ROWS,
        "not written when copied out",
        "Unwritten",
    ),
    "an output block visited again after its copy-out": (
        _blocked(_plain, (4,), lambda i: (i, 0), lambda i: (i % 2, 0)),
        4 * ROWS,
        "revisits a block",
        "VerifyKernelError",
    ),
    "an input block that starts past the array": (
        _blocked(_plain, (4,), lambda i: (i + 1, 0), lambda i: (i, 0)),
        4 * ROWS,
        "starts outside its array",
        "OutOfBounds",
    ),
    "a copy from an input block still in flight at the next copy-in": (
        _blocked(_copy_left_in_flight, (4,), lambda i: (i, 0), lambda i: (i, 0), scratch=_STAGE),
        4 * ROWS,
        "not ordered",
        "Race",
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_block_mistake_makes_it_give_up_and_the_walk_answers_as_without_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    program, rows, reason, error = MISTAKES[name]
    said = _gives_up_and_the_walk_answers(_run(program, 4, rows), monkeypatch, reason)
    assert error in said[0], said


# ------------------------------------------------------------------ aliases, prefetch


def _in_place(x_ref: Any, o_ref: Any, stage: Any, sem: Any) -> None:
    """Row block ``i`` of the aliased array through VMEM and back, by DMA."""
    rows = pl.ds(pl.program_id(0) * ROWS, ROWS)
    load = pltpu.make_async_copy(x_ref.at[rows], stage, sem)
    load.start()
    load.wait()
    store = pltpu.make_async_copy(stage, o_ref.at[rows], sem)
    store.start()
    store.wait()


def _aliased_in_place(x: jax.Array) -> jax.Array:
    out: jax.Array = pl.pallas_call(
        _in_place,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // ROWS,),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=list(_STAGE),
        input_output_aliases={0: 0},
    )(x)
    return out


def _aliased_blocks(x: jax.Array) -> jax.Array:
    return _blocked(
        _staged,
        (2,),
        lambda i: (i, 0),
        lambda i: (i, 0),
        scratch=_STAGE,
        input_output_aliases={0: 0},
    )(x)


def _prefetched(x: jax.Array) -> jax.Array:
    """A scalar-prefetch operand the index maps do not read (the body reads it as data)."""

    def body(table_ref: Any, x_ref: Any, o_ref: Any, stage: Any, sem: Any) -> None:
        del table_ref
        _staged(x_ref, o_ref, stage, sem)

    table = jnp.arange(4, dtype=jnp.int32)
    out: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(4,),
            in_specs=[pl.BlockSpec((ROWS, 128), lambda i, t: (i, 0))],
            out_specs=pl.BlockSpec((ROWS, 128), lambda i, t: (i, 0)),
            scratch_shapes=list(_STAGE),
        ),
    )(table, x)
    return out


@pytest.mark.parametrize(
    "program", [_aliased_in_place, _aliased_blocks, _prefetched], ids=lambda f: f.__name__
)
def test_aliases_and_scalar_prefetch_are_proved_with_the_walks_report(
    program: Callable[[jax.Array], jax.Array], monkeypatch: pytest.MonkeyPatch
) -> None:
    _proved_alone_as_walked(_run(program, 4, 4 * ROWS), monkeypatch)


def _gathered_by_table(x: jax.Array) -> jax.Array:
    """Blocks picked through a scalar-prefetch table: a block index the lockstep path
    does not compute (the walk reads the table's values)."""
    table = jnp.asarray([3, 2, 1, 0], dtype=jnp.int32)
    out: jax.Array = pl.pallas_call(
        lambda t_ref, x_ref, o_ref, stage, sem: _staged(x_ref, o_ref, stage, sem),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(4,),
            in_specs=[pl.BlockSpec((ROWS, 128), lambda i, t: (t[i], 0))],
            out_specs=pl.BlockSpec((ROWS, 128), lambda i, t: (i, 0)),
            scratch_shapes=list(_STAGE),
        ),
    )(table, x)
    return out


def test_a_block_index_read_from_scalar_prefetch_is_left_to_the_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = _gives_up_and_the_walk_answers(
        _run(_gathered_by_table, 4, 4 * ROWS), monkeypatch, "block index"
    )
    assert said[0] == "clean"


def _axis_named_grid(x: jax.Array) -> jax.Array:
    """``lax.axis_index`` of a named grid axis is the grid step's index."""

    def body(x_ref: Any, o_ref: Any, stage: Any, sem: Any) -> None:
        rows = pl.ds(lax.axis_index("step") * ROWS, ROWS)
        copy = pltpu.make_async_copy(x_ref.at[rows], stage, sem)
        copy.start()
        copy.wait()
        o_ref[rows] = stage[...]

    out: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(("step", x.shape[0] // ROWS),),
        in_specs=[ANY],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=list(_STAGE),
    )(x)
    return out


def test_a_named_grid_axis_is_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _proved_alone_as_walked(_run(_axis_named_grid, 4, 4 * ROWS), monkeypatch)
    assert report.dmas == 4 * 4


# ------------------------------------------------------------------ run_scoped


def _scoped_handshake(signals: int) -> Callable[[jax.Array], jax.Array]:
    """At each grid step, a run_scoped REGULAR semaphore: ``signals`` signals to the
    right neighbour's, one wait on our own (two signals leave one at the region's end)."""

    def body(x_ref: Any, o_ref: Any) -> None:
        right = lax.rem(lax.axis_index(AXIS) + 1, lax.axis_size(AXIS))

        def region(sem: Any) -> None:
            for _ in range(signals):
                pl.semaphore_signal(sem, 1, device_id={AXIS: right})
            pl.semaphore_wait(sem, 1)

        pl.run_scoped(region, pltpu.SemaphoreType.REGULAR)
        o_ref[...] = x_ref[...]

    return _blocked(
        body, (2,), lambda i: (i, 0), lambda i: (i, 0), compiler_params=pltpu.CompilerParams()
    )


def test_a_run_scoped_semaphore_per_step_is_proved_with_the_walks_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    report = _proved_alone_as_walked(_run(_scoped_handshake(1), 4, 2 * ROWS), monkeypatch)
    assert report.signals == 4 * 2
    # named as the walk names it: the line of the region
    assert any("run_scoped" in name for name in report.max_bytes_in_flight), report


def test_a_run_scoped_semaphore_left_non_zero_makes_it_give_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said = _gives_up_and_the_walk_answers(
        _run(_scoped_handshake(2), 4, 2 * ROWS), monkeypatch, "not back to zero"
    )
    assert said[0] == "VerifiedLeftoverError", said


# ------------------------------------------------------------------ jax's own kernels


def _jax_whole_programs() -> list[Case]:
    """The corpus's single-device programs of jax's own kernels (jax's all_gather runs
    its own shard_map, so it is left out)."""
    chosen: list[Case] = []
    for case in corpus.cases("verify"):
        if not case.provenance.startswith("jax ops/tpu") or "all_gather" in case.provenance:
            continue
        program = case.build()
        if program.mesh is None and not program.lower:
            chosen.append(case)
    return chosen


# proved by the lockstep path on every device (the rest read block indices, loop
# bounds or grid sizes from data, which the path leaves to the walk)
JAX_PROVED = frozenset(
    {
        "jax_example_kernel_double",
        "jax_matmul",
        "jax_flash_attention",
        "jax_flash_attention_causal",
        "jax_flash_attention_causal_backward",
        "jax_random_threefry",
    }
)


@pytest.mark.parametrize("case", _jax_whole_programs(), ids=lambda c: c.name)
def test_jax_kernels_on_every_device_get_the_walks_verdict(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each program run on every device of a 2-device mesh (its arguments whole on
    each): the lockstep path's answer is the walk's, report or error word for word."""
    program = case.build()
    mesh = abstract_mesh((2,), (AXIS,))

    def run() -> Any:
        return verify(
            program.fn,
            *program.args,
            mesh=mesh,
            in_specs=P(),
            out_specs=P(),
            invocations=program.invocations,
        )

    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    without = _say(run)
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    with_it = _say(run)
    assert with_it == without
    proved = _api._LAST_LOCKSTEP[0] == ""
    assert proved == (case.name in JAX_PROVED), _api._LAST_LOCKSTEP[0]
