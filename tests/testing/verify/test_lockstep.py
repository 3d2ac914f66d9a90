"""verify's lockstep path (``_lockstep.py``): the per-device walk's answers, at pod scale.

The suite runs verify with ``SAFEDMA_VERIFY_LOCKSTEP=check`` (tests/conftest.py):
wherever the lockstep path proves a program, the per-device walk runs too, and a
program it proves that the walk rejects, or counts that differ, fail the test. So
every clean and every seeded kernel of the suite cross-checks it. The tests here pin
the rest: what it proves on its own in the default mode, that it gives up on what it
cannot decide (and the walk then answers word for word as without it), and that its
rule-4 arithmetic is the per-device model's on random waits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

import safedma.kernels as sk
from safedma.testing import SimulationError, abstract_mesh, verify
from safedma.testing._verify.face import api as _api
from safedma.testing._verify.model import clocks as _clocks
from safedma.testing._verify.lockstep.clocks import Snapshot
from safedma.testing._verify.lockstep.model import Model, SemBuf
from tests.corpus.ring_collectives import chunked_ring_program

HBM = pl.BlockSpec(memory_space=pl.ANY)

KINDS: dict[str, tuple[Callable[..., Any], int]] = {
    # kernel, rows of a device's block per ring device (reduce-scatter: a chunk each)
    "all_gather": (sk.all_gather, 0),
    "all_gather_bidirectional": (sk.all_gather_bidirectional, 0),
    "reduce_scatter": (sk.reduce_scatter, 8),
    "all_reduce": (sk.all_reduce, 8),
}
MESHES = [((2,), ("x",)), ((8,), ("x",)), ((2, 4), ("y", "x")), ((4, 4), ("y", "x"))]


def _say(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "clean", repr(run())
    except SimulationError as err:
        return type(err).__name__, str(err)


def _collective(
    kind: str, shape: tuple[int, ...], names: tuple[str, ...], collective_id: int | None
) -> Callable[[], Any]:
    make, per_device = KINDS[kind]
    ring = shape[-1]
    rows = per_device * ring if per_device else 16
    x = jax.ShapeDtypeStruct((rows * int(np.prod(shape)), 128), jnp.float32)
    spec = P(names[0] if len(names) == 1 else names)
    ids = {} if collective_id is None else {"collective_id": collective_id}
    fn = functools.partial(make, axis="x", **ids)
    mesh = abstract_mesh(shape, names)
    return lambda: verify(fn, x, mesh=mesh, in_specs=spec, out_specs=spec)


@pytest.fixture
def lockstep_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default mode, with the per-device walk made to fail if it runs at all."""
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")

    def no_walk(*args: Any) -> None:
        raise AssertionError("the per-device walk ran")

    monkeypatch.setattr(_api, "_walk", no_walk)


@pytest.mark.parametrize("collective_id", [None, 3])  # None: the kernel's default
@pytest.mark.parametrize(("shape", "names"), MESHES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_collectives_are_proved_by_the_lockstep_path_alone(
    kind: str,
    shape: tuple[int, ...],
    names: tuple[str, ...],
    collective_id: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _collective(kind, shape, names, collective_id)
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    walked = run()
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")

    def no_walk(*args: Any) -> None:
        raise AssertionError("the per-device walk ran")

    monkeypatch.setattr(_api, "_walk", no_walk)
    proved = run()
    assert _api._LAST_LOCKSTEP[0] == ""
    # the same report: counts, and here (no wait with a choice) the same peaks too
    assert proved == walked


def _ring(seed: dict[str, int]) -> Callable[..., Any]:
    return chunked_ring_program(1, 3, 2, **seed)


@pytest.mark.parametrize("seed", [{"drop": 1}, {"shifted": 0}, {"shifted": 2}])
def test_a_seeded_mistake_makes_it_give_up_and_the_walk_answers_as_without_it(
    seed: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = jax.ShapeDtypeStruct((8 * 24, 128), jnp.float32)
    run = functools.partial(verify, _ring(seed), x, mesh=abstract_mesh((8,), ("x",)))
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    without = _say(run)
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    with_it = _say(run)
    assert without[0] != "clean"
    assert with_it == without
    assert _api._LAST_LOCKSTEP[0] != ""


def test_the_clean_twin_is_proved(lockstep_only: None) -> None:
    x = jax.ShapeDtypeStruct((8 * 24, 128), jnp.float32)
    report = verify(_ring({}), x, mesh=abstract_mesh((8,), ("x",)))
    # three chunks to the next device and the copy-out of the receive buffer, per device
    assert (report.devices, report.dmas, report.remote_dmas) == (8, 32, 24)


def _first_device_copies(x: jax.Array) -> jax.Array:
    def kernel(x_ref: Any, o_ref: Any, sem: Any) -> None:
        copy = pltpu.make_async_copy(x_ref, o_ref, sem)

        @pl.when(jax.lax.axis_index("x") == 0)
        def _() -> None:
            copy.start()
            copy.wait()

        @pl.when(jax.lax.axis_index("x") != 0)
        def _() -> None:
            copy.start()
            copy.wait()

    out: jax.Array = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return out


def test_control_flow_that_differs_between_devices_is_left_to_the_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    x = jax.ShapeDtypeStruct((8 * 8, 128), jnp.float32)
    report = verify(_first_device_copies, x, mesh=abstract_mesh((8,), ("x",)))
    assert "differs between devices" in _api._LAST_LOCKSTEP[0]
    assert report.dmas == 8


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("collective_id", [None, 3])
def test_calls_back_to_back_are_proved_with_the_walks_report(
    kind: str, collective_id: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """invocations=3: fresh outputs, scratch and semaphores per call, the barrier
    semaphore kept across calls (a neighbour's next-call signal that could count at this
    call's barrier wait makes the path give up: rule 6)."""
    make, per_device = KINDS[kind]
    rows = per_device * 8 if per_device else 16
    x = jax.ShapeDtypeStruct((rows * 8, 128), jnp.float32)
    ids = {} if collective_id is None else {"collective_id": collective_id}
    fn = functools.partial(make, axis="x", **ids)
    run = functools.partial(verify, fn, x, mesh=abstract_mesh((8,), ("x",)), invocations=3)
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    walked = run()
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    proved = run()
    assert _api._LAST_LOCKSTEP[0] == ""
    assert proved == walked and proved.invocations == 3


def _two_kernels_and_xla_around(x: jax.Array) -> jax.Array:
    """A reshape before, an all-gather, an add between, a ring permute, a slice after."""
    y = sk.all_gather(x.reshape(x.shape), axis="x") + 1.0
    z = sk.ppermute(y, axis="x", shift=3, collective_id=5)
    return z[: x.shape[0]]


def test_a_device_program_of_several_kernels_and_xla_operations_is_proved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = jax.ShapeDtypeStruct((8 * 16, 128), jnp.float32)
    run = functools.partial(
        verify, _two_kernels_and_xla_around, x, mesh=abstract_mesh((8,), ("x",))
    )
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "off")
    walked = run()
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    proved = run()
    assert _api._LAST_LOCKSTEP[0] == ""
    assert proved == walked and len(proved.kernels) == 2


def test_a_bad_mode_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "fast")
    x = jax.ShapeDtypeStruct((8 * 16, 128), jnp.float32)
    fn = functools.partial(sk.all_gather, axis="x")
    with pytest.raises(ValueError, match="SAFEDMA_VERIFY_LOCKSTEP"):
        verify(fn, x, mesh=abstract_mesh((8,), ("x",)))


# ------------------------------------------------------------- rule 4, in bulk


@pytest.mark.parametrize("shape", ["one issuer", "several issuers", "any one suffices"])
@pytest.mark.parametrize("seed", range(40))
def test_a_bulk_wait_learns_and_guarantees_what_the_per_device_model_does(
    seed: int, shape: str
) -> None:
    """Random waits on 6 devices over 1-5 candidates: the clock each waiter learns, the
    credit left and what stays pending equal ``_clocks.learned`` and rule 4 per device.
    (``Model._learn`` takes the max when every candidate is needed, the issue order for
    one issuer's contributions, and a sort otherwise; the shapes reach all three.)"""
    rng = np.random.default_rng(seed)
    n = 6
    k = int(rng.integers(2 if shape == "any one suffices" else 1, 6))
    single_issuer = shape == "one issuer"
    model = Model(n, symmetric=False)
    rows = model.clocks.dense = rng.integers(1, 30, (n, n)).astype(np.int32)
    rows[model.devs, model.devs] = 40  # own epochs ahead of what others know
    sem = SemBuf("s", (), "DMA", False, n)
    amounts = [rng.integers(1, 4, n) for _ in range(k)]
    # credit may be negative (earlier waits consumed contributions they did not guarantee)
    credit = np.maximum(rng.integers(-2, 3, n), 1 - np.sum(amounts, axis=0))
    if shape == "any one suffices":
        amounts = [np.full(n, 3) for _ in range(k)]
        credit = np.zeros(n, dtype=np.int64)
    sem.credit[:, 0] = credit
    slot = np.zeros(n, dtype=np.int64)
    clocks: list[np.ndarray[Any, Any]] = []
    clock = rng.integers(0, 30, (n, n)).astype(np.int32)
    for amount in amounts:
        if single_issuer:  # one issuer's contributions: clocks grow in issue order
            clock = clock + rng.integers(0, 4, (n, n)).astype(np.int32)
            issuer = (model.devs + 1) % n
        else:
            clock = rng.integers(0, 30, (n, n)).astype(np.int32)
            issuer = rng.integers(0, n, n)
        clocks.append(clock.copy())
        model.contribute(sem, slot, amount, Snapshot(None, clock.copy()), [], issuer)
    total = credit + np.sum(amounts, axis=0)
    need_total = np.asarray([int(rng.integers(1, t + 1)) for t in total])
    if shape == "any one suffices":
        need_total = rng.integers(1, 4, n)
    before = model.clocks.matrix().copy()
    model.wait(sem, slot, need_total)
    for o in range(n):
        amts = [int(a[o]) for a in amounts]
        guaranteed = [total[o] - a < need_total[o] for a in amts]
        need = need_total[o] - credit[o]
        want = before[o].copy()
        if need > 0:
            learned = _clocks.learned([c[o] for c in clocks], amts, int(need))
            want = np.maximum(want, learned)
        assert np.array_equal(model.clocks.matrix()[o], want), o
        landed = sum(a for a, g in zip(amts, guaranteed) if g)
        assert sem.credit[o, 0] == credit[o] + landed - need_total[o]
        assert sem.in_flight[o, 0] == sum(amts) - landed


def _outcomes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The lockstep path's outcomes of the verify calls that follow (models included)."""
    from safedma.testing._verify.lockstep import prove as _prove

    seen: list[Any] = []
    real = _prove.prove

    def keep(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(_api._lockstep, "prove", keep)
    return seen


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce"])
def test_a_1024_device_ring_is_proved_in_lockstep_with_clocks_linear_in_devices(
    kind: str, lockstep_only: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring stays symmetric: the clocks are one circulant row throughout, so each
    release and acquire touches ``devices`` clock entries (a dense matrix: devices^2)."""
    outcomes = _outcomes(monkeypatch)
    n = 1024
    report = _collective(kind, (n,), ("x",), None)()
    assert _api._LAST_LOCKSTEP[0] == ""
    assert report.devices == n
    clocks = outcomes[-1].model.clocks
    assert clocks.symmetric and clocks.densified == 0
    # a few clock operations per ring step per semaphore, each of n entries
    assert clocks.entries_touched < 64 * n * n
    waits = report.waits // n
    assert clocks.entries_touched < 8 * n * (waits + report.dmas // n + report.signals // n)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_circulant_clocks_hold_the_numbers_of_dense_ones(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ring walked with the clocks kept circulant and kept dense: the same
    report, and the same clock of every device at the end."""
    from safedma.testing._verify.lockstep import clocks as _lclocks
    from safedma.testing._verify.lockstep import model as _lmodel

    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "on")
    outcomes = _outcomes(monkeypatch)
    run = _collective(kind, (16,), ("x",), None)
    circulant = run()
    assert outcomes[-1].model.clocks.symmetric
    matrix = outcomes[-1].model.clocks.matrix().copy()
    monkeypatch.setattr(_lmodel, "Clocks", lambda n, symmetric=True: _lclocks.Clocks(n, False))
    dense = run()
    assert not outcomes[-1].model.clocks.symmetric
    assert dense == circulant
    assert np.array_equal(outcomes[-1].model.clocks.matrix(), matrix)


def test_a_ring_that_is_not_a_shift_turns_the_clocks_dense_and_is_still_proved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a 2x4 mesh with the ring along x the targets are no cyclic shift of the flat
    device index: the clocks turn dense once, and the result is the walk's."""
    monkeypatch.setenv("SAFEDMA_VERIFY_LOCKSTEP", "check")
    outcomes = _outcomes(monkeypatch)
    _collective("all_gather", (2, 4), ("y", "x"), None)()
    assert _api._LAST_LOCKSTEP[0] == ""
    assert outcomes[-1].model.clocks.densified == 1
