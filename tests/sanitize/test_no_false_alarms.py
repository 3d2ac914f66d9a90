"""No false alarms: correct kernels run clean under the sanitizer, with the default bound.

safedma's library kernels, the suite's kernels (safedma and raw pltpu twins, the fixes
of the protocol cases), and jax's own raw-pltpu kernels that fit one device, each in
TPU interpret mode (eager and on-wait DMAs) with every check in place: their results
match the unsanitized run and nothing is reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma._sanitize import _sites
from safedma.kernels import (
    all_gather,
    all_gather_bidirectional,
    all_reduce,
    gather_pages,
    pipeline,
    ppermute,
    reduce_scatter,
)
from tests.sanitize.helpers import example, interpret, on_mesh, raw_calls_sanitized
from tests.support import calls, kernels_pltpu, kernels_safedma
from tests.corpus import grids, semaphore_arrays
from tests.corpus._seeding import DropWait, unjitted

RING = 4


@pytest.fixture
def sanitized_everywhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """SAFEDMA_SANITIZE=1 for sd.pallas_call; raw pl.pallas_call routed through it."""
    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    with raw_calls_sanitized(monkeypatch):
        yield


def _clean(run: Callable[[], Any]) -> Any:
    """Run ``run`` with the sanitizer on; it must instrument something and report nothing."""
    before = _sites.registered()
    with sd.sanitizer_errors():
        out = jax.block_until_ready(run())
    assert _sites.registered() > before, "nothing was instrumented"
    return out


# ------------------------------------------------------------------ safedma.kernels


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
@pytest.mark.usefixtures("sanitized_everywhere")
def test_pipeline(mode: str) -> None:
    x = example((64, 256))
    out = _clean(
        lambda: pipeline(x, lambda c: c * 2.0 + 1.0, chunk_rows=8, interpret=interpret(mode))
    )
    np.testing.assert_array_equal(out, np.asarray(x) * 2.0 + 1.0)


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
@pytest.mark.usefixtures("sanitized_everywhere")
def test_gather_pages(mode: str) -> None:
    pages = example((6, 8, 128))
    indices = jnp.array([4, 0, 4, 5, 1], jnp.int32)
    out = _clean(lambda: gather_pages(pages, indices, interpret=interpret(mode)))
    np.testing.assert_array_equal(out, np.asarray(pages)[np.asarray(indices)])


def _collectives() -> list[tuple[str, Callable[[jax.Array], jax.Array], Callable[[Any], Any]]]:
    """(name, per-device kernel, reference on the whole array)."""
    tpu = interpret()
    rows = 8

    def blocks(x: Any) -> list[Any]:
        return np.split(np.asarray(x), RING)

    return [
        (
            "ppermute",
            lambda b: ppermute(b, axis="x", interpret=tpu),
            lambda x: np.roll(np.asarray(x), rows, axis=0),
        ),
        (
            "ppermute_barrier",
            lambda b: ppermute(b, axis="x", collective_id=0, interpret=tpu),
            lambda x: np.roll(np.asarray(x), rows, axis=0),
        ),
        (
            "all_gather",
            lambda b: all_gather(b, axis="x", interpret=tpu),
            lambda x: np.concatenate([np.asarray(x)] * RING),
        ),
        (
            "all_gather_bidirectional",
            lambda b: all_gather_bidirectional(b, axis="x", interpret=tpu),
            lambda x: np.concatenate([np.asarray(x)] * RING),
        ),
        (
            "reduce_scatter",
            lambda b: reduce_scatter(b, axis="x", interpret=tpu),
            lambda x: sum(blocks(x)),
        ),
        (
            "all_reduce",
            lambda b: all_reduce(b, axis="x", interpret=tpu),
            lambda x: np.concatenate([sum(blocks(x))] * RING),
        ),
    ]


@pytest.mark.parametrize("case", _collectives(), ids=lambda c: c[0])
@pytest.mark.usefixtures("sanitized_everywhere")
def test_collectives_on_a_ring(case: tuple[str, Any, Any]) -> None:
    name, per_device, reference = case
    x = (
        example((RING * RING * 8, 128))
        if name in ("reduce_scatter", "all_reduce")
        else example((RING * 8, 128))
    )
    out = _clean(lambda: on_mesh(per_device, RING)(x))
    np.testing.assert_allclose(np.asarray(out), reference(x), rtol=1e-6)


# ------------------------------------------------------------------ the suite's kernels

_SUPPORT = [
    ("scale_copy", calls.scale_copy_call, (16, 128)),
    ("reverse_halves", calls.reverse_halves_call, (16, 128)),
    ("double_buffered", calls.double_buffered_call, (64, 128)),
]


@pytest.mark.parametrize("flavour", [kernels_safedma, kernels_pltpu], ids=["safedma", "pltpu"])
@pytest.mark.parametrize("case", _SUPPORT, ids=lambda c: c[0])
@pytest.mark.usefixtures("sanitized_everywhere")
def test_suite_kernels_match_their_unsanitized_run(
    flavour: Any, case: tuple[str, Any, Any]
) -> None:
    name, make, shape = case
    x = example(shape)
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    call = make(getattr(flavour, name), spec, interpret=calls.strict_interpret())
    out = _clean(lambda: call(x))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAFEDMA_SANITIZE", "0")
        plain = jax.block_until_ready(
            make(getattr(flavour, name), spec, interpret=calls.strict_interpret())(x)
        )
    np.testing.assert_array_equal(out, plain)


@pytest.mark.parametrize("flavour", [kernels_safedma, kernels_pltpu], ids=["safedma", "pltpu"])
@pytest.mark.usefixtures("sanitized_everywhere")
def test_ring_permute(flavour: Any) -> None:
    from safedma.testing import simulated_mesh

    x = example((RING * 8, 128))
    mesh = simulated_mesh(RING, "x")
    program = calls.ring_permute_call(flavour.ring_permute, mesh, interpret=interpret())
    out = _clean(
        lambda: program(
            jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
        )
    )
    np.testing.assert_array_equal(out, np.roll(np.asarray(x), 8, axis=0))


# ------------------------------------------------------------------ jax's own kernels


@pytest.mark.slow
@pytest.mark.usefixtures("sanitized_everywhere")
def test_jax_paged_attention() -> None:
    inputs = grids.paged_attention_inputs()
    fn = grids.paged_attention().fn
    with pltpu.force_tpu_interpret_mode(interpret()):
        out = _clean(lambda: fn(*inputs))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAFEDMA_SANITIZE", "0")
        with pltpu.force_tpu_interpret_mode(interpret()):
            plain = jax.block_until_ready(fn(*inputs))
    np.testing.assert_allclose(np.asarray(out), np.asarray(plain), rtol=1e-6)


# jax's all_gather has a race on rings of 4 devices and more that the sanitizer does not
# look for and verify finds (the verify page walks through it).
@pytest.mark.safedma_verify_expected("VerifiedRaceError")
@pytest.mark.usefixtures("sanitized_everywhere")
def test_jax_all_gather_on_a_ring() -> None:
    from jax.experimental.pallas.ops.tpu import all_gather as ag

    from safedma.testing import simulated_mesh

    mesh = simulated_mesh(RING, "x")
    x = jax.device_put(
        example((RING * 8, 128)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    )
    gather = unjitted(ag.all_gather)
    with pltpu.force_tpu_interpret_mode(interpret()):
        out = _clean(lambda: jax.jit(lambda v: gather(v, mesh=mesh, axis_name="x"))(x))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


@pytest.mark.slow
@pytest.mark.usefixtures("sanitized_everywhere")
def test_jax_ragged_paged_attention_compiles_sanitized_for_v5e() -> None:
    """jax's interpreter cannot run this kernel (a reshaped ref it does not index), with
    or without the sanitizer; its instrumented form must still compile for the chip."""
    from safedma.testing import compile_for_tpu
    from jax.sharding import PartitionSpec as P

    inputs = semaphore_arrays.ragged_paged_attention_inputs()
    before = _sites.registered()
    compile_for_tpu(
        semaphore_arrays.ragged_paged_attention().fn,
        *inputs,
        topology="v5e:2x2",
        in_specs=P(),
        out_specs=P(),
    )
    assert _sites.registered() > before


# verify sees the dropped wait as the read it no longer guards (R7/R9).
@pytest.mark.safedma_verify_expected("RaceDetectedError")
def test_a_wait_dropped_from_jax_paged_attention_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks are live on jax's kernel: one of its waits left out is refused when the
    sanitized call traces the body where the body shows it (jax 0.12's kernel), and is
    otherwise a leftover on ``k_sems`` the sanitizer reports at exit (jax 0.10.2's)."""
    from safedma.testing import LeftoverSemaphoreError

    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as pa

    monkeypatch.setenv("SAFEDMA_SANITIZE", "1")
    monkeypatch.setattr(pa, "pltpu", DropWait(pltpu, 0))
    inputs = grids.paged_attention_inputs()
    with raw_calls_sanitized(monkeypatch), pltpu.force_tpu_interpret_mode(interpret()):
        with pytest.raises(
            (sd.CopyNeverWaitedError, LeftoverSemaphoreError),
            match=r"(?s)(paged_flash_attention_kernel.*k_sems|k_sems.*paged_flash_attention_kernel)",
        ):
            jax.block_until_ready(grids.paged_attention().fn(*inputs))
