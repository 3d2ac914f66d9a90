"""Raw pltpu copies paired per semaphore slot at trace time (safedma/_raw_pairing.py).

Mistakes a raw body makes on every path are reported under ``sd.checked`` naming the
user's line; correct raw kernels (computed slots, loops, double buffering, jax's own
kernels in the corpus) are never rejected.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests import corpus
from tests.corpus import _run
from tests.corpus._case import Case, Raises

ANY = pl.BlockSpec(memory_space=pl.ANY)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def _trace(kernel: Callable[..., None], *, grid: tuple[int, ...] = ()) -> None:
    call = pl.pallas_call(
        sd.checked(kernel),
        out_shape=X,
        in_specs=[ANY],
        out_specs=ANY,
        grid=grid,
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    jax.jit(call).trace(X)


def _chunk(x: Any, i: Any) -> Any:
    return x.at[pl.ds(i * 8, 8)]


# ------------------------------------------------------------------ mistakes


def never_waited(x: Any, o: Any, buf: Any, sems: Any) -> None:
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).start()
    pltpu.make_async_copy(_chunk(x, 1), buf.at[1], sems.at[1]).start()  # line: start
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).wait()


def waited_twice(x: Any, o: Any, buf: Any, sems: Any) -> None:
    copy = pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0])
    copy.start()
    copy.wait()
    copy.wait()  # line: wait


def waited_on_an_unsignalled_slot(x: Any, o: Any, buf: Any, sems: Any) -> None:
    copy = pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0])

    @pl.when(pl.program_id(0) == 0)
    def _() -> None:
        copy.start()

    copy.wait()
    pltpu.make_async_copy(_chunk(x, 1), buf.at[1], sems.at[1]).wait()  # line: wait


def waited_by_another_size(x: Any, o: Any, buf: Any, sems: Any) -> None:
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).start()
    half = buf.at[0, pl.ds(0, 4)]
    pltpu.make_async_copy(x.at[pl.ds(0, 4)], half, sems.at[0]).wait()  # line: wait


def half_waited_in_a_loop(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """Every iteration starts a whole chunk and waits half of one: the slot is computed,
    so no single wait is provably wrong, but every path leaves bytes behind."""

    def body(i: Any, carry: Any) -> Any:
        slot = i % 2
        pltpu.make_async_copy(_chunk(x, i), buf.at[slot], sems.at[slot]).start()  # line: start
        half = buf.at[slot, pl.ds(0, 4)]
        pltpu.make_async_copy(x.at[pl.ds(0, 4)], half, sems.at[slot]).wait()
        return carry

    jax.lax.fori_loop(0, 4, body, 0)


def one_start_too_many(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """The first copy's wait was dropped; the second is waited on the computed slot."""
    slot = pl.program_id(0) % 2
    pltpu.make_async_copy(_chunk(x, 0), buf.at[slot], sems.at[slot]).start()  # line: start
    copy = pltpu.make_async_copy(_chunk(x, 1), buf.at[1 - slot], sems.at[1 - slot])
    copy.start()
    copy.wait()


def one_wait_too_many(x: Any, o: Any, buf: Any, sems: Any) -> None:
    slot = pl.program_id(0) % 2
    copy = pltpu.make_async_copy(_chunk(x, 0), buf.at[slot], sems.at[slot])
    copy.start()
    copy.wait()
    pltpu.make_async_copy(_chunk(x, 0), buf.at[1 - slot], sems.at[1 - slot]).wait()  # line: wait


def fetch_in(x: Any, buf: Any, sems: Any) -> None:
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).start()


def wait_in(x: Any, buf: Any, sems: Any) -> None:
    del x, sems
    _ = buf.at[0]  # line: belongs


def waited_in_a_counterpart_that_waits_nothing(x: Any, o: Any, buf: Any, sems: Any) -> None:
    fetch_in(x, buf, sems)
    wait_in(x, buf, sems)


def _marked(fn: Callable[..., None], mark: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return next(first + i for i, line in enumerate(lines) if f"# line: {mark}" in line)


@pytest.mark.parametrize(
    ("kernel", "error", "mark", "says"),
    [
        (never_waited, sd.CopyNeverWaitedError, "start", "sems[1]"),
        (waited_twice, sd.HandleWaitedTwiceError, "wait", "8192 bytes"),
        (waited_on_an_unsignalled_slot, sd.HandleWaitedTwiceError, "wait", "no copy"),
        (waited_by_another_size, sd.CopyShapeMismatchError, "wait", "2048 bytes"),
        (half_waited_in_a_loop, sd.CopyNeverWaitedError, "start", "at least 8192 bytes more"),
        (one_start_too_many, sd.CopyNeverWaitedError, "start", "at least 4096 bytes more"),
        (one_wait_too_many, sd.WaitExceedsCopiesError, "wait", "at least 4096 bytes more"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_a_raw_mistake_on_every_path_names_its_line(
    kernel: Callable[..., None], error: type[Exception], mark: str, says: str
) -> None:
    with pytest.raises(error) as caught:
        _trace(kernel, grid=(2,))
    message = str(caught.value)
    assert f"test_raw_pairing.py:{_marked(kernel, mark)}" in message, message
    assert says in message
    assert "safedma/_raw_pairing.py" not in message


# ------------------------------------------------------------------ correct kernels


def double_buffered_loop(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """Prologue, start slot i+1 in iteration i, wait slot i, no epilogue start."""

    def fetch(i: Any) -> Any:
        return pltpu.make_async_copy(_chunk(x, i), buf.at[i % 2], sems.at[i % 2])

    fetch(0).start()

    def body(i: Any, carry: Any) -> Any:
        @pl.when(i + 1 < 4)
        def _() -> None:
            fetch(i + 1).start()

        fetch(i).wait()
        return carry

    jax.lax.fori_loop(0, 4, body, 0)


def across_grid_steps(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """Step i starts step i+1's copy; step i waits its own (jax's paged-attention shape)."""
    i = pl.program_id(0)

    def fetch(j: Any) -> Any:
        return pltpu.make_async_copy(_chunk(x, j), buf.at[j % 2], sems.at[j % 2])

    @pl.when(i == 0)
    def _() -> None:
        fetch(i).start()

    @pl.when(i + 1 < pl.num_programs(0))
    def _() -> None:
        fetch(i + 1).start()

    fetch(i).wait()


def two_copies_one_semaphore(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """Two copies signal one slot; two waits of one size each, or one of both sizes."""
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).start()
    pltpu.make_async_copy(_chunk(x, 1), buf.at[1], sems.at[0]).start()
    pltpu.make_async_copy(x.at[pl.ds(0, 16)].reshape(2, 8, 128), buf, sems.at[0]).wait()


def computed_slot_waited_statically(x: Any, o: Any, buf: Any, sems: Any) -> None:
    slot = pl.program_id(0) % 2
    pltpu.make_async_copy(_chunk(x, 0), buf.at[slot], sems.at[slot]).start()
    pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).wait()

    @pl.when(slot == 1)
    def _() -> None:
        pltpu.make_async_copy(_chunk(x, 0), buf.at[1], sems.at[1]).wait()


def waited_every_other_iteration(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """One copy an iteration, one wait of two copies every second iteration."""

    def body(i: Any, carry: Any) -> Any:
        pltpu.make_async_copy(_chunk(x, i), buf.at[i % 2], sems.at[0]).start()

        @pl.when(i % 2 == 1)
        def _() -> None:
            pltpu.make_async_copy(x.at[pl.ds(0, 16)].reshape(2, 8, 128), buf, sems.at[0]).wait()

        return carry

    jax.lax.fori_loop(0, 4, body, 0)


def started_in_one_loop_drained_in_another(x: Any, o: Any, buf: Any, sems: Any) -> None:
    """As many copies as the input says, started in one loop and waited in a second."""
    count = pl.program_id(0) + 1

    def start(i: Any, carry: Any) -> Any:
        pltpu.make_async_copy(_chunk(x, i % 2), buf.at[i % 2], sems.at[0]).start()
        return carry

    def drain(i: Any, carry: Any) -> Any:
        pltpu.make_async_copy(_chunk(x, 0), buf.at[0], sems.at[0]).wait()
        return carry

    jax.lax.fori_loop(0, count, start, 0)
    jax.lax.fori_loop(0, count, drain, 0)


@pytest.mark.parametrize(
    "kernel",
    [
        double_buffered_loop,
        across_grid_steps,
        two_copies_one_semaphore,
        waited_every_other_iteration,
        started_in_one_loop_drained_in_another,
    ],
    ids=lambda k: k.__name__,
)
def test_correct_raw_patterns_trace_clean(kernel: Callable[..., None]) -> None:
    _trace(kernel, grid=(4,))


def _trace_with_grid_spec(kernel: Callable[..., None]) -> None:
    """As ``_trace``, the scratch given by a grid spec (``PrefetchScalarGridSpec``), as
    most production kernels give it: its semaphores are the body's, not operands."""
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=0,
        grid=(2,),
        in_specs=[ANY],
        out_specs=ANY,
        scratch_shapes=[pltpu.VMEM((2, 8, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
    )
    jax.jit(pl.pallas_call(sd.checked(kernel), out_shape=X, grid_spec=spec)).trace(X)


def test_a_copy_never_waited_says_where_the_source_puts_its_wait() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        _trace(waited_in_a_counterpart_that_waits_nothing, grid=(2,))
    line = _marked(wait_in, "belongs")
    assert f"the wait belongs in `wait_in`, at its end, after test_raw_pairing.py:{line}" in str(
        caught.value
    ), caught.value


def test_a_grid_specs_scratch_semaphores_are_checked() -> None:
    with pytest.raises(sd.CopyNeverWaitedError) as caught:
        _trace_with_grid_spec(never_waited)
    assert f"test_raw_pairing.py:{_marked(never_waited, 'start')}" in str(caught.value)
    _trace_with_grid_spec(double_buffered_loop)
    _trace_with_grid_spec(across_grid_steps)


def test_a_computed_slot_meets_every_static_one() -> None:
    # The start's slot is computed: the static waits may be its own (silent, not proved).
    _trace(computed_slot_waited_statically, grid=(2,))


# ------------------------------------------------------------------ the corpus sweep


def _correct(case: Case) -> bool:
    """No seeded mistake: every tool accepts it (or refuses it as unsupported), or it is
    one of jax's own ops/tpu kernels (all_gather on 4 devices included: verify reports
    a race there, a question of order, not of counts)."""
    if case.provenance.startswith("jax ops/tpu"):
        return True
    return "bug" not in case.tags and not any(isinstance(v, Raises) for v in case.expect.values())


CORRECT = [c for c in corpus.CASES if _correct(c)]


@pytest.mark.parametrize("case", CORRECT, ids=lambda c: c.name)
def test_no_raw_pairing_alarm_on_a_correct_corpus_kernel(case: Case) -> None:
    """Every correct corpus program (the suite's kernels in both spellings and jax's own
    ops/tpu kernels: paged and ragged paged attention, all_gather, flash and splash
    attention, matmul, megablox) traced with every body under ``sd.checked``."""
    try:
        _run.trace(case.build())
    except Exception as error:  # noqa: BLE001 (only the pairing's own errors are asked about)
        frames = traceback.extract_tb(error.__traceback__)
        assert not any(f.filename.endswith("_raw_pairing.py") for f in frames), str(error)
