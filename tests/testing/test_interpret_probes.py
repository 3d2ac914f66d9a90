"""The interpret-mode probes: every patched jax name exists, says why, and is put back."""

from __future__ import annotations

import importlib

import jax
import pytest

from safedma.testing import SimulationError, simulate

from safedma.testing import _interpret_probes as probes
from tests.support.simulation import BLOCK, dma, example, hbm_call


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
