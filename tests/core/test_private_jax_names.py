"""A jax release that removed a private name safedma reads: ``import safedma`` and all
its modules (the testing helpers' too) still import, and the feature that needs the name
fails with ``PrivateJaxApiError`` naming it, who needs it and the installed jax."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import pytest

import safedma
from safedma import _compat

ROOT = Path(safedma.__file__).resolve().parent.parent

_WITHOUT_NAMES = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    from types import SimpleNamespace as NS
    import jax.experimental.pallas.tpu  # jax's own modules bound the names already
    import jax.extend
    import jax._src.core as core
    import jax._src.interpreters.pxla as pxla
    import jax._src.pallas.mosaic.core as mosaic_core
    del core.get_axis_env          # as a jax release that removed them would
    del mosaic_core.dma_semaphore
    del core.Jaxpr
    del pxla.ExecuteReplicated

    import safedma
    from safedma import LocalCopy, pallas_call, PrivateJaxApiError
    for info in pkgutil.walk_packages(safedma.__path__, "safedma."):
        if info.name.startswith("safedma.stubs"):
            continue
        if info.name not in ("safedma.pytest_plugin", "safedma.demo"):
            importlib.import_module(info.name)
    from safedma import _compat
    from safedma.testing._suite import _jax as suite_jax

    # A program with one equation that is no kernel: its parameters are searched for jaxprs.
    program = NS(eqns=[NS(primitive=NS(name="add"), params={"x": 1}, source_info=None)])
    for name, user, feature in [
        ("jax._src.core.get_axis_env", "safedma", _compat.axes_in_scope),
        (
            "jax._src.pallas.mosaic.core.dma_semaphore",
            "safedma",
            lambda: _compat._kind_of_dtype("float32"),
        ),
        ("jax._src.core.Jaxpr", "safedma.testing", lambda: suite_jax.calls_a_kernel(program)),
        (
            "jax._src.interpreters.pxla.ExecuteReplicated",
            "safedma.testing",
            lambda: suite_jax.install(print, print),
        ),
    ]:
        try:
            feature()
        except PrivateJaxApiError as err:
            assert isinstance(err, safedma.SafeDmaError)
            message = str(err)
            assert name in message, message
            assert message.startswith(f"{user} needs"), message
            assert jax.__version__ in message, message
            assert "0.10.2" in message and "report" in message, message
            print("refused", name)
        else:
            raise SystemExit(f"{name}: no PrivateJaxApiError")
    """
)


def test_a_removed_private_name_fails_where_it_is_used_naming_it() -> None:
    script = "import jax\n" + _WITHOUT_NAMES
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_environment(), "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == [
        "refused jax._src.core.get_axis_env",
        "refused jax._src.pallas.mosaic.core.dma_semaphore",
        "refused jax._src.core.Jaxpr",
        "refused jax._src.interpreters.pxla.ExecuteReplicated",
    ]


def _environment() -> dict[str, str]:
    import os

    return {**os.environ, "JAX_PLATFORMS": "cpu"}


def test_the_error_is_public_and_shared_with_the_testing_helpers() -> None:
    from safedma.testing import PrivateJaxApiError

    assert PrivateJaxApiError is safedma.PrivateJaxApiError
    assert issubclass(PrivateJaxApiError, safedma.SafeDmaError)
    assert issubclass(PrivateJaxApiError, RuntimeError)  # what safedma.testing raised before


def test_a_logical_id_becomes_mesh_coordinates_where_jax_has_no_device_id_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jax numbers devices row-major over the mesh axes: on a (2, 4) mesh ("y", "x"),
    logical id 6 is y=1, x=2."""
    monkeypatch.setattr(_compat, "axes_in_scope", lambda: {"y": 2, "x": 4})
    assert _compat._as_mesh_coordinates(6) == {"y": 1, "x": 2}
    assert list(_compat._as_mesh_coordinates(3)) == ["y", "x"]
    monkeypatch.setattr(_compat, "axes_in_scope", lambda: {})
    with pytest.raises(safedma.PrivateJaxApiError, match="DeviceIdType"):
        _compat._as_mesh_coordinates(1)


def test_a_remote_copy_to_a_logical_id_traces_without_device_id_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jax.sharding import NamedSharding, PartitionSpec as P

    seen: list[Any] = []
    original = _compat._as_mesh_coordinates

    def spy(index: Any) -> dict[str, Any]:
        coordinates = original(index)
        seen.append(coordinates)
        return coordinates

    monkeypatch.setattr(_compat, "_logical_id_type", lambda: None)
    monkeypatch.setattr(_compat, "_as_mesh_coordinates", spy)
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    import jax.numpy as jnp

    def kernel(x_ref, o_ref, send, recv):  # type: ignore[no-untyped-def]
        copy = safedma.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send)
        copy.to(safedma.logical_device(1)).start().wait()

    any_space = pl.BlockSpec(memory_space=pl.ANY)
    call = safedma.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[any_space],
        out_specs=any_space,
        scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    program = jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    x = jax.device_put(jnp.zeros((16, 128), jnp.float32), NamedSharding(mesh, P("x")))
    jax.jit(program).trace(x)
    assert len(seen) == 1 and list(seen[0]) == ["x"]
