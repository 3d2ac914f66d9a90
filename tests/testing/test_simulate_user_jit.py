"""A user's own ``jax.jit`` around a kernel under simulate.

A function of the user's, jitted, that calls a kernel with an input made inside it: jax
0.12's XLA once aborted the whole process (``hlo_cse.cc: Check failed``), so simulate
compiles without XLA's CSE pass; each case runs in its own process, so a regression is a
failed test, not a crashed run. Only ``jax.jit`` itself is unwrapped, not a wrapper that
copied its attributes.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from safedma.testing import simulate, simulated_mesh
from tests.support.processes import run_python
from tests.support.simulation import BLOCK, F32, example

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ 2: the user's own jax.jit around a kernel


_USER_JIT = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from safedma.testing import KernelFailedError, simulate

def stage(x_ref, o_ref, scratch):
    pltpu.sync_copy(x_ref.at[0], scratch.at[3])
    o_ref[0, :] = scratch[3, :]

def stage_out_of_range(s_ref, x_ref, o_ref, scratch):
    pltpu.sync_copy(x_ref.at[0], scratch.at[s_ref[0]])  # OUT OF RANGE
    o_ref[0, :] = scratch[3, :]

def call(kernel, smem):
    specs = [pl.BlockSpec(memory_space=pltpu.SMEM)] if smem else []
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[*specs, pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((10, 128), jnp.float32)])

@jax.jit
def run():
    return call(stage, False)(jnp.ones((8, 128), jnp.float32))

@jax.jit
def run_broken():
    return call(stage_out_of_range, True)(jnp.array([10], jnp.int32), jnp.ones((8, 128), jnp.float32))

for name, program in [
    ("called", lambda: run()),
    ("called-and-used", lambda: run() * 2.0),
    ("jit-of-jit", jax.jit(lambda: run())),
]:
    out = np.asarray(simulate(program))
    print(name, float(out[0, 0]))
try:
    simulate(lambda: run_broken())
except KernelFailedError as err:
    print("caught at", "(stage_out_of_range)" in str(err) or str(err))
"""


def test_a_users_jit_around_a_kernel_runs_and_its_broken_twin_is_caught(tmp_path: Path) -> None:
    script = tmp_path / "user_jit.py"
    script.write_text(textwrap.dedent(_USER_JIT))
    env = dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS="cpu")
    result = run_python(str(script), cwd=Path.cwd(), env=env, timeout=600)
    assert result.returncode == 0, (
        f"exit {result.returncode} on {sys.version_info[:2]}: {result.stderr[-3000:]}"
    )
    assert "called 1.0\ncalled-and-used 2.0\njit-of-jit 1.0\n" in result.stdout, result.stdout
    assert "caught at True" in result.stdout, result.stdout


# ------------------------------------ a jitted function whose kernel input is made inside it


def _stage_through_scratch(x_ref: Any, o_ref: Any, scratch: Any) -> None:
    pltpu.sync_copy(x_ref.at[0], scratch.at[3])
    o_ref[0, :] = scratch[3, :]


@jax.jit
def _jitted_without_arguments() -> jax.Array:
    out: jax.Array = pl.pallas_call(
        _stage_through_scratch,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((10, 128), F32)],
    )(jnp.ones(BLOCK, F32))
    return out


# The kernel writes row 0 only and the test checks the rest stays NaN: R6 on purpose.
@pytest.mark.safedma_verify_expected("UnwrittenReadError")
def test_a_jitted_function_is_simulated_without_a_second_jit_around_it() -> None:
    # simulate(run) compiled jit(lambda: run()); jax 0.12's XLA aborted the
    # whole process on it (hlo_cse.cc "Check failed") for this kernel shape.
    out = np.asarray(simulate(_jitted_without_arguments))
    np.testing.assert_array_equal(out[0], np.ones(128, np.float32))
    assert np.isnan(out[1:]).all()  # never written: simulate's NaN-filled memory


def test_only_jax_jit_itself_is_unwrapped_not_a_wrapper_that_copied_its_attributes() -> None:
    # functools.wraps (as shard_map uses) copies a function's attributes onto
    # its wrapper; a shard_map of a function carrying `lower` was taken for a
    # jit and simulated without its shard_map ("unbound axis name x").
    mesh: Mesh = simulated_mesh(4, "x")

    def body(x: jax.Array) -> jax.Array:
        return x + lax.axis_index("x").astype(x.dtype)

    body.lower = jax.jit(body).lower  # type: ignore[attr-defined]
    program = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    x = jax.device_put(example((32, 128)), jax.sharding.NamedSharding(mesh, P("x")))
    expected = np.asarray(x) + np.repeat(np.arange(4, dtype=np.float32), 8)[:, None]
    np.testing.assert_array_equal(np.asarray(simulate(program, x)), expected)
