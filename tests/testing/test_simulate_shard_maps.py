"""Programs with their own ``shard_map`` under simulate: races name devices as devices,
and buffers are sized per device on every jax (by the compiled sharding where the
program gives none)."""

from __future__ import annotations

from types import SimpleNamespace
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

from safedma.testing import RaceDetectedError, simulate, simulated_mesh
from safedma.testing._interpret_probes import RaceReport
from safedma.testing._meshes import DeviceNames, bytes_per_device
from safedma.testing._recorder import Recorder
from safedma.testing._runner import _outputs  # pyright: ignore[reportPrivateUsage]
from tests.support.simulation import (
    BLOCK,
    BLOCK_BYTES,
    F32,
    assert_clean_afterwards,
    example,
    line_of,
)

pytestmark = pytest.mark.usefixtures("no_threads_left_behind")


# ------------------------------------ its own shard_map: races name devices as devices


def _zero_then_send(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
    o_ref[...] = jnp.zeros_like(o_ref)  # no barrier: the left neighbour may already write here
    right = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
    copy = pltpu.make_async_remote_copy(
        x_ref, o_ref, send, recv, device_id=right, device_id_type=pl.DeviceIdType.LOGICAL
    )
    copy.start()
    copy.wait()


def test_a_race_in_a_program_with_its_own_shard_map_names_devices_not_dmas() -> None:
    # simulate(fn) with no mesh= knew one device, so device 5's own write was
    # reported as "DMA #5"; the run itself says how many devices there are.
    mesh: Mesh = simulated_mesh(4, "x")
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    call = pl.pallas_call(
        _zero_then_send,
        out_shape=jax.ShapeDtypeStruct(BLOCK, F32),
        in_specs=[vmem],
        out_specs=vmem,
        scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
    )
    program = jax.jit(
        jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    )
    x = jax.device_put(example((32, 128)), jax.sharding.NamedSharding(mesh, P("x")))
    with pytest.raises(RaceDetectedError) as caught:
        simulate(program, x)
    race = caught.value.races[0]
    assert race.accessor.startswith("device ") or int(race.accessor.split("#")[1]) >= 4, race
    lines = (line_of(_zero_then_send, "o_ref[...] ="), line_of(_zero_then_send, "copy.start()"))
    assert all(line in str(caught.value) for line in lines), str(caught.value)
    assert_clean_afterwards()


def test_race_accessors_below_the_runs_device_count_are_devices() -> None:
    recorder = Recorder(DeviceNames(None))
    for who in (5, 100):
        recorder.race_detected(
            RaceReport("write", (who, 0), ("vmem", 1, 5, 0), None, "RACE DETECTED", None, 8)
        )
    assert [r.accessor for r in recorder.races] == ["device 5", "DMA #100"]


# ------------------------------------ its own shard_map: sizes are per device


def _local_copy(x_ref: Any, o_ref: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()


def test_its_own_shard_map_on_8_devices_is_sized_per_device_on_every_jax() -> None:
    # 32 KiB per device, 256 KiB in all: runs on jax 0.10 (not refused as
    # 256 KiB per device) and 0.12.
    mesh: Mesh = simulated_mesh(8, "x")
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(
        _local_copy,
        out_shape=jax.ShapeDtypeStruct((8, *BLOCK), F32),
        in_specs=[hbm],
        out_specs=hbm,
        scratch_shapes=[pltpu.SemaphoreType.DMA],
    )
    program = jax.jit(
        jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    )
    x = jax.device_put(example((64, *BLOCK)), jax.sharding.NamedSharding(mesh, P("x")))
    np.testing.assert_array_equal(np.asarray(simulate(program, x)), np.asarray(x))


def test_an_output_without_a_sharding_before_compiling_is_sized_by_the_compiled_one() -> None:
    # jax 0.10 left the output info of jax's all-gather test (its own
    # shard_map) without a sharding, so its 32 KiB per device counted as
    # 256 KiB and the run was refused; the compiled program's sharding is final.
    mesh: Mesh = simulated_mesh(8, "x")
    sharding = jax.sharding.NamedSharding(mesh, P("x"))
    info = jax.ShapeDtypeStruct((64, *BLOCK), F32)  # no sharding, as jax 0.10 gives it
    lowered = SimpleNamespace(out_info=(info,))
    compiled = SimpleNamespace(output_shardings=(sharding,))
    (output,) = _outputs(lowered, compiled)
    assert bytes_per_device(output) == 8 * BLOCK_BYTES
