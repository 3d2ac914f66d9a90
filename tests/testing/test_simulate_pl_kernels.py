"""``pl.kernel`` built outside simulate with its own ``interpret=`` parameters: simulate
still runs it strictly, so its broken twin is caught.

The correct kernel must run clean under strict simulation; its broken twin must be
caught, naming the kernel's own line.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from safedma.testing import RaceDetectedError, simulate, simulated_mesh
from tests.support.simulation import BLOCK, F32, assert_clean_afterwards, example, line_of

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ pl.kernel built outside simulate, own interpret=


def _swap_body(wait: bool) -> Any:
    def body(x_ref: Any, o_ref: Any, sems: Any) -> None:
        peer = 1 - lax.axis_index("x")
        copy = pltpu.make_async_remote_copy(
            x_ref, o_ref, sems.at[0], sems.at[1], device_id=(peer,),
            device_id_type=pl.DeviceIdType.MESH,
        )  # fmt: skip
        copy.start()
        if wait:
            copy.wait()

    return body


def _mesh_kernel(wait: bool) -> Any:
    """A pl.kernel over one TensorCore, built with its own ``interpret=`` before simulate."""
    params = inspect.signature(pl.kernel).parameters
    out = jax.ShapeDtypeStruct(BLOCK, F32)
    sems = [pltpu.SemaphoreType.DMA((2,))]
    shapes: dict[str, Any] = (
        {"out_type": out, "scratch_types": sems}  # jax 0.12
        if "out_type" in params
        else {"out_shape": out, "scratch_shapes": sems}  # jax 0.10
    )
    return pl.kernel(
        _swap_body(wait),
        mesh=pltpu.create_tensorcore_mesh("core", num_cores=1),
        interpret=pltpu.InterpretParams(),
        **shapes,
    )


def test_pl_kernel_built_outside_simulate_with_its_own_interpret_params_runs() -> None:
    # It used to be refused at its first step as "started in another thread":
    # simulate forced its parameters on pallas_call only, not on the primitive
    # pl.kernel / pl.core_map bind (core_map_p on jax 0.10, mpmd_map_p on 0.12).
    mesh: Mesh = simulated_mesh(2, "x")
    x = example((16, 128))
    out = simulate(_mesh_kernel(wait=True), x, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), 8, 0))


def test_pl_kernel_built_outside_simulate_without_its_wait_is_caught() -> None:
    mesh: Mesh = simulated_mesh(2, "x")
    kernel = _mesh_kernel(wait=False)
    with pytest.raises(RaceDetectedError) as caught:
        simulate(kernel, example((16, 128)), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    headline = str(caught.value).splitlines()[0]
    # Whichever access the detector meets second, the headline names the start.
    assert line_of(_swap_body, "copy.start()") in headline, headline
    assert_clean_afterwards()
