"""safedma.gpu on any jax: importing it imports neither jax nor plgpu, and a jax without
the Pallas Mosaic GPU API it lowers to is refused where the layer is first used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import safedma
from safedma import gpu
from safedma.gpu import _jax_seam
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_layer_imports_no_jax() -> None:
    code = (
        "import sys, safedma, safedma.gpu; "
        "print('jax' in sys.modules, 'jax.experimental.pallas.mosaic_gpu' in sys.modules, "
        "sorted(safedma.gpu.__all__) == sorted(dir(safedma.gpu)))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = str(REPO)
    result = run_python("-c", code, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]


def test_every_public_name_loads() -> None:
    for name in gpu.__all__:
        assert getattr(gpu, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        getattr(gpu, "Nope")


def test_a_jax_without_plgpu_is_refused_naming_the_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jax

    monkeypatch.setattr(_jax_seam, "available", lambda: False)
    with pytest.raises(safedma.UnsupportedByJaxError) as caught:
        gpu.Tma()
    message = str(caught.value)
    assert f"jax {jax.__version__} does not have it" in message
    assert "jax 0.12 or later" in message and "safedma.gpu.Tma" in message
