"""Protocol mistakes put into jax's own Pallas GPU kernels, and what each checker says.

Each mutant is one change to the installed kernel module's source, made in memory at
test time (tests/gpu/_kernel_mutants.py: the operators, and which line counts as
the line to fix). It is run small, as the kernel's own test would, under
simulate_gpu (jax's GPU interpreter, races fatal, ``timeout_s`` bounding a hang)
and verify_gpu.

A mutant is kept when the original runs clean and right under simulate_gpu and the
mutant breaks: a checker flags it (verify_gpu's refusal is no flag) or its output is
wrong. A mutant whose output is still right and that neither checker flags is not
kept ("no effect on this schedule"; the table says why for each); one that jax
rejects when traced is not kept either. On each kept mutant each checker is scored:
what it raised (a refusal counts as refused, not caught), and whether its message
names the line to fix. A mutant that races on some runs only (in the warp-specialized
kernel the threads' interleaving decides whether the interpreter sees the race) is
kept, and the table accepts either verdict for it.

:data:`EXPECTED` is the table as measured on jax 0.12.0.1; a run that differs
fails. On another jax the sites move: the table's tests skip until it is measured
again.

Kernels jax's interpreter cannot run are recorded in :data:`REFUSED`: the original
already fails there, so none of their mutants can be judged.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from safedma.testing._gpu.jax_seam import interpret_available

if not interpret_available():
    pytest.skip("this jax has no Pallas GPU interpreter", allow_module_level=True)

import jax
import numpy as np

from safedma import SafeDmaError
from safedma.testing import (
    KernelFailedError,
    SimulationError,
    SimulationUnsupportedError,
    VerificationUnsupportedError,
    simulate_gpu,
    verify_gpu,
)
from tests.gpu import _kernel_mutants as km
from tests.gpu._jax_kernels import OPS, f32, ops

MEASURED_ON = "0.12.0.1"
TIMEOUT_S = {"ragged_dot_mgpu": 60, "transposed_ragged_dot_mgpu": 60, "hopper_matmul_mgpu": 12}
"""One warpgroup per block: a hang is stopped at once, the bound is only a bound. The
warp-specialized hopper matmul's hang is stopped at ``timeout_s`` (its clean run
takes 2 s here), so its bound is short."""

DRIVERS: dict[str, Callable[[types.ModuleType], km.Run]] = {
    "ragged_dot_mgpu": km.ragged_dot,
    "hopper_matmul_mgpu": km.hopper_matmul,
    "transposed_ragged_dot_mgpu": km.transposed_ragged_dot,
}


class Scored(NamedTuple):
    """A kept mutant: what each checker raised (``clean, wrong output`` if simulate_gpu
    ran through; ``refused`` for verify_gpu's refusal) and whether it names the line."""

    simulate: str
    simulate_at_line: bool
    verify: str
    verify_at_line: bool


NO_EFFECT = "not kept: no effect on this schedule (output right, no checker flags it)"
RACE, HANG, IN_FLIGHT = (
    "GpuRaceDetectedError",
    "BarrierNeverCompletesError",
    "CopyInFlightAtExitError",
)
REF = "refused"

SOMETIMES_RACE: frozenset[Scored | str] = frozenset({Scored(RACE, False, REF, False), NO_EFFECT})
"""Kept (it races on most runs), but simulate_gpu's verdict depends on the run: either."""

EXPECTED: dict[str, dict[str, Scored | str | frozenset[Scored | str]]] = {
    "ragged_dot_mgpu": {
        # the race names the copy and the write before the missing commit (line 173)
        "drop_commit_smem@174": Scored(RACE, True, REF, False),
        # the message says to wait before the kernel returns, but names no line
        "drop_wait_smem_to_gmem@229": Scored(IN_FLIGHT, False, REF, False),
        "wait_smem_to_gmem_n_plus_1@229": Scored(IN_FLIGHT, False, REF, False),
    },
    "hopper_matmul_mgpu": {
        "drop_commit_smem@207": Scored(RACE, True, REF, False),
        # A store still in flight when its slot is written again: the race names the
        # copy-in (198) and the store (208). Seen on most runs, not all (a warp-
        # specialized run's interleaving decides; measured 5, 6, 4 and 5 of 6).
        "drop_wait_smem_to_gmem@186": SOMETIMES_RACE,
        "drop_wait_smem_to_gmem@192": SOMETIMES_RACE,
        "drop_wait_smem_to_gmem@229": Scored(IN_FLIGHT, False, REF, False),
        "wait_smem_to_gmem_n_plus_1@186": SOMETIMES_RACE,
        "wait_smem_to_gmem_n_plus_1@192": SOMETIMES_RACE,
        "wait_smem_to_gmem_n_plus_1@229": Scored(IN_FLIGHT, False, REF, False),
        "drop_barrier_wait@205": Scored(RACE, True, REF, False),
        # the hangs name the wait (205), not the Barrier (149) or the copy (198-204)
        "num_arrivals_plus_1@149": Scored(HANG, False, REF, False),
        "barrier_slot_plus_1@203": Scored(HANG, False, REF, False),
        "barrier_slot_plus_1@205": Scored(HANG, True, REF, False),
    },
    "transposed_ragged_dot_mgpu": {
        # the threads' masking write (118) races the pipeline's next TMA load into the slot
        "drop_commit_smem@119": Scored(RACE, True, REF, False),
        # The commit orders the masking write before wgmma reads the SMEM; the
        # interpreter runs wgmma in program order, and the group's last block is the
        # pipeline's last step (no TMA load refills the slot), so nothing shows it.
        "drop_commit_smem@135": NO_EFFECT,
        "drop_commit_smem@181": Scored(RACE, True, REF, False),
        "drop_wait_smem_to_gmem@189": Scored(IN_FLIGHT, False, REF, False),
        "wait_smem_to_gmem_n_plus_1@189": Scored(IN_FLIGHT, False, REF, False),
    },
}

VERIFY_ON_ORIGINAL = {
    "ragged_dot_mgpu": "clean",
    "hopper_matmul_mgpu": REF,  # num_threads=3: warp specialization
    "transposed_ragged_dot_mgpu": REF,  # the pipeline's step count is read from memory
}

REFUSED: dict[str, tuple[Callable[[types.ModuleType], km.Run], type[Exception], str]] = {
    # jax's interpreter fails on its int8 -> bf16 conversion in registers
    "hopper_mixed_type_matmul_mgpu": (km.hopper_mixed_type_matmul, KernelFailedError,
                                      r"Expected shape \(6,\) but got \(128, 64\)"),
    # its epilogue loads TMEM through inline_mgpu, which interpret mode refuses
    "blackwell_matmul_mgpu": (km.blackwell_matmul, ValueError,
                              "GPU interpret mode does not support `inline_mgpu`"),
    # collective=True (without it the kernel names a cluster axis it never makes)
    "blackwell_ragged_dot_mgpu": (km.blackwell_ragged_dot, KernelFailedError,
                                  "collective_axis not supported yet"),
}  # fmt: skip

SLOW = {("hopper_matmul_mgpu", ident) for ident in EXPECTED["hopper_matmul_mgpu"]}
"""Every hopper matmul mutant but the first is in the slow lane: three of them hang and
are stopped at ``timeout_s`` each; the first stays fast."""
SLOW.discard(("hopper_matmul_mgpu", "drop_commit_smem@207"))


def _right(run: km.Run, out: Any) -> bool:
    return bool(np.allclose(f32(out), run.want, rtol=2e-2, atol=2e-1))


def _simulate(run: km.Run, timeout_s: float) -> tuple[str, str]:
    """simulate_gpu's verdict and message; an error that is not safedma's propagates."""
    try:
        out = simulate_gpu(run.fn, *run.args, timeout_s=timeout_s)
    except SimulationUnsupportedError as err:
        return REF, str(err)
    except SimulationError as err:
        return type(err).__name__, str(err)
    return ("clean" if _right(run, out) else "clean, wrong output"), ""


def _verify(run: km.Run) -> tuple[str, str]:
    try:
        verify_gpu(run.fn, *run.args)
    except VerificationUnsupportedError as err:
        return REF, str(err)
    except SafeDmaError as err:
        return type(err).__name__, str(err)
    return "clean", ""


def _judged(kernel: str, mutant: km.Mutant) -> Scored | str:
    with km.source_shown(mutant):
        try:
            run = DRIVERS[kernel](km.mutated_module(mutant))
            simulated, sim_message = _simulate(run, TIMEOUT_S[kernel])
        except Exception as err:  # not safedma's: jax itself rejects the change
            if isinstance(err, SafeDmaError):
                raise
            return f"not kept: jax rejects it when traced ({type(err).__name__})"
        verified, verify_message = _verify(run)
    flagged = verified not in ("clean", REF) or simulated != "clean"
    if not flagged:
        return NO_EFFECT
    return Scored(
        simulated,
        bool(sim_message) and km.names_line(sim_message, mutant),
        verified,
        verified not in ("clean", REF) and km.names_line(verify_message, mutant),
    )


def _measured_jax() -> None:
    if jax.__version__ != MEASURED_ON:
        pytest.skip(f"the table was measured on jax {MEASURED_ON}; this is {jax.__version__}")


@pytest.mark.parametrize("kernel", sorted(DRIVERS))
def test_original_kernel_runs_clean_and_right(kernel: str) -> None:
    """No false alarm: the unchanged source, run as the mutants are, is clean and right."""
    run = DRIVERS[kernel](km.fresh_module(OPS + kernel))
    out = simulate_gpu(run.fn, *run.args, timeout_s=60)
    assert _right(run, out)
    assert _verify(run)[0] == VERIFY_ON_ORIGINAL[kernel]


@pytest.mark.parametrize("kernel", sorted(REFUSED))
def test_kernel_the_interpreter_cannot_run_fails_unchanged(kernel: str) -> None:
    driver, error, says = REFUSED[kernel]
    run = driver(km.fresh_module(OPS + kernel))
    with pytest.raises(error, match=says):
        simulate_gpu(run.fn, *run.args, timeout_s=60)


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_every_site_in_the_kernel_module_is_in_the_table(kernel: str) -> None:
    _measured_jax()
    assert [m.ident for m in km.mutants_of(OPS + kernel)] == list(EXPECTED[kernel])


@pytest.mark.parametrize(
    ("kernel", "ident"),
    [
        pytest.param(k, i, marks=[pytest.mark.slow] if (k, i) in SLOW else [], id=f"{k}::{i}")
        for k, table in EXPECTED.items()
        for i in table
    ],
)
def test_mutant_is_judged_as_the_table_says(kernel: str, ident: str) -> None:
    _measured_jax()
    ops(kernel)  # the package is imported before its module is read
    (mutant,) = [m for m in km.mutants_of(OPS + kernel) if m.ident == ident]
    got = _judged(kernel, mutant)
    expected = EXPECTED[kernel][ident]
    assert got in expected if isinstance(expected, frozenset) else got == expected, (ident, got)
