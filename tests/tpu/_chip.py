"""The TPU lane's two runs of one function: on the chip, and in ``simulate`` on the host CPU.

Every lane test runs a kernel's function on the TPU (``jax.jit``, inputs on
the chip) and the same function under ``safedma.testing.simulate`` over a
one-device mesh of host CPU devices, in the same process (this needs
``JAX_PLATFORMS=tpu,cpu``: with ``tpu`` alone jax has no CPU device), and
compares both with a numpy reference.

Whether a TPU is here is asked once, lazily: asking starts jax's TPU backend,
which holds the chip for the rest of the process, so tests that run the chip
in child processes (test_chip_subprocess.py) go first and never ask.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

#: How long one in-process chip test may take (compiles and the CPU simulation
#: included) before the watchdog ends the whole process: a hung kernel cannot be
#: interrupted from Python.
WATCHDOG_S = 600.0


def platforms_without_tpu() -> bool:
    """True when JAX_PLATFORMS rules the TPU out, so asking jax cannot touch a chip."""
    value = os.environ.get("JAX_PLATFORMS", "")
    return bool(value) and "tpu" not in value.split(",")


@functools.cache
def no_tpu_reason() -> str:
    """Why the lane cannot run here ("" when jax's first device is a TPU).

    Starts jax's backends: after this call this process holds the chip.
    """
    import jax

    try:
        platform = str(jax.devices()[0].platform)
    except RuntimeError as err:  # JAX_PLATFORMS names tpu and no TPU backend starts
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"no TPU: jax could not start its TPU backend ({first})"
    if platform != "tpu":
        return f"no TPU: jax.devices()[0].platform is {platform!r}"
    return ""


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(np.asarray, jax.block_until_ready(tree))


def on_chip(fn: Callable[..., Any], *args: np.ndarray) -> Any:
    """``jax.jit(fn)(*args)`` with the arguments on the first TPU, as numpy."""
    import jax

    device = jax.devices()[0]
    placed = [jax.device_put(a, device) for a in args]
    return _to_numpy(jax.jit(fn)(*placed))


def simulated(fn: Callable[..., Any], *args: np.ndarray) -> Any:
    """``simulate(fn, *args)`` over a one-device mesh of host CPU devices, as numpy."""
    from safedma.testing import simulate, simulated_mesh

    return _to_numpy(simulate(fn, *args, mesh=simulated_mesh(1, "x")))


def assert_equal_trees(got: Any, want: Any, what: str) -> None:
    import jax

    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert str(got_tree) == str(want_tree), f"{what}: output structure {got_tree} != {want_tree}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (
            f"{what}, output {i}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
        )
        if not np.array_equal(g, w):
            wrong = np.count_nonzero(g != w)
            raise AssertionError(
                f"{what}, output {i}: {wrong} of {w.size} elements differ "
                f"(first at flat index {int(np.flatnonzero(g != w)[0])})"
            )


def generation(device: Any) -> str | None:
    """safedma's name for the chip's TPU generation ("v5e" for "TPU v5 lite"), if known."""
    from safedma.testing import TPU_GENERATIONS

    kind = str(getattr(device, "device_kind", ""))
    return next((name for name, (k, _) in TPU_GENERATIONS.items() if k == kind), None)


def check_on_chip(
    fn: Callable[..., Any],
    *args: np.ndarray,
    want: Any,
    device: Any,
    simulate_limit: str = "",
) -> str:
    """The chip's output equals ``want``; so does simulate's, and ``verify`` proves the
    protocol. Where simulate stops with an error matching ``simulate_limit`` (a
    construct jax's interpreter cannot run), verify alone stands for the CPU side.
    Returns what the CPU side did, for the test's output."""
    import re

    from safedma.testing import abstract_mesh, verify

    chip = on_chip(fn, *args)
    assert_equal_trees(chip, want, "the chip's output against the reference")
    try:
        sim = simulated(fn, *args)
    except Exception as err:
        if not simulate_limit or not re.search(simulate_limit, str(err)):
            raise
        cpu_side = f"simulate cannot run it ({type(err).__name__}: {simulate_limit})"
    else:
        assert_equal_trees(sim, want, "simulate's output against the reference")
        assert_equal_trees(chip, sim, "the chip's output against simulate's")
        cpu_side = "simulate's output equal"
    gen = generation(device)
    # A mesh with no axes only names the generation (emit_pipeline's tiling asks for it).
    verify(fn, *args, mesh=abstract_mesh((), (), tpu=gen) if gen else None)
    return cpu_side + "; verify clean"
