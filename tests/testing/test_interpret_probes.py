"""The interpret-mode probes: every patched jax name exists, says why, and is put back."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.testing import (
    LeftoverSemaphoreError,
    RaceDetectedError,
    SimulationError,
    simulate,
    verify,
)

from safedma.testing import _interpret_probes as probes
from tests.support.simulation import BLOCK, dma, example, hbm_call
from tests.support.source_lines import marker_line


def _current(probe: probes._Probe) -> object:
    module = importlib.import_module(probe.module)
    holder = getattr(module, probe.owner) if probe.owner else module
    return vars(holder).get(probe.name, "<absent>")


def test_every_probe_names_an_existing_jax_name_and_why() -> None:
    for probe in probes._PROBES:
        assert len(probe.why) > 40, probe.name
        if probe.only_if():
            probes._target(probe)  # raises PrivateJaxApiError if this jax moved it
    probes._check_signatures()


def test_probes_are_put_back_after_a_simulation_even_a_failing_one() -> None:
    before = {(p.module, p.owner, p.name): _current(p) for p in probes._PROBES}

    def leaky(x_ref: object, o_ref: object, sem: object) -> None:
        from jax.experimental.pallas import tpu as pltpu

        pltpu.make_async_copy(x_ref, o_ref, sem).start()  # never waited: a race at exit

    with pytest.raises(SimulationError):  # the leftover copy fails the run
        simulate(hbm_call(leaky, dma()), example(BLOCK))
    after = {(p.module, p.owner, p.name): _current(p) for p in probes._PROBES}
    assert after == before


def test_strict_params_are_never_equal_to_a_users_params() -> None:
    from jax.experimental.pallas import tpu as pltpu

    ours = probes.strict_interpret_params()
    theirs = pltpu.InterpretParams(**{f: getattr(ours, f) for f in ours.__dataclass_fields__})
    assert ours != theirs and isinstance(ours, pltpu.InterpretParams)
    assert jax.__version__  # the table above was checked against this jax


def _drain_kernel(case: str) -> Any:
    """A copy sized by SMEM value n (0 here): waited alone (a drain of nothing on a
    semaphore no copy signalled), or placed at the buffer's end (an empty window)."""

    def kernel(n_ref: Any, x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        n = n_ref[0]
        rows = pl.ds(0, n) if case == "zero_wait" else pl.ds(BLOCK[0] + n, n)
        empty = pltpu.make_async_copy(x_hbm.at[rows], o_hbm.at[rows], sem)
        if case != "zero_wait":
            empty.start()
        empty.wait()
        whole = pltpu.make_async_copy(x_hbm, o_hbm, sem)
        whole.start()  # the whole copy
        if case != "whole_unwaited":
            whole.wait()

    def fn(n: jax.Array, x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(BLOCK, jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.SemaphoreType.DMA],
            ),
        )(n, x)
        return out

    return fn


@pytest.mark.parametrize("case", ["zero_wait", "empty_at_end"])
def test_a_copy_of_nothing_runs_clean_as_on_a_tpu(case: str) -> None:
    """jax's interpreter asserts on a 0-byte wait nothing signalled and calls a window
    of 0 rows at the buffer's end out of bounds; both are no-ops on a TPU (production
    MoE kernels drain by sizes that can be 0), and verify accepts them."""
    n = jnp.zeros((1,), jnp.int32)
    x = example(BLOCK)
    out = simulate(_drain_kernel(case), n, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    verify(_drain_kernel(case), n, x)


def test_a_wait_of_nothing_does_not_stand_for_another_copy() -> None:
    """The whole copy is never waited, whatever the 0-byte wait before it: simulate
    sees the output copied out while the copy may be in flight; verify stops at the
    count left at exit, naming the copy that carries it (not the empty one)."""
    n, x = jnp.zeros((1,), jnp.int32), example(BLOCK)
    with pytest.raises(RaceDetectedError, match="data race"):
        simulate(_drain_kernel("whole_unwaited"), n, x)
    with pytest.raises(LeftoverSemaphoreError) as caught:
        verify(_drain_kernel("whole_unwaited"), n, x)
    text = str(caught.value)
    assert f"test_interpret_probes.py:{marker_line(__file__, '# the whole copy')}" in text
    assert "(0 bytes)" not in text, text
