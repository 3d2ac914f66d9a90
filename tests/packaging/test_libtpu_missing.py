"""Without libtpu (no ``safedma[tpu]``), compile_for_tpu names the extra to install.

libtpu's absence is simulated in a fresh interpreter by blocking its import
(``sys.modules["libtpu"] = None``), so jax and the check see what a CPU-only
install sees. The
installed-wheel test (test_wheel_install.py) checks the real absence.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safedma.testing import LibtpuMissingError
from safedma.testing import _libtpu
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]

_WITHOUT_LIBTPU = """
import sys

sys.modules["libtpu"] = None  # import libtpu now fails and find_spec says None, as when absent
import jax, jax.numpy as jnp
from safedma.testing import LibtpuMissingError, compile_for_tpu
try:
    compile_for_tpu(lambda x: x + 1, jax.ShapeDtypeStruct((8, 128), jnp.float32))
except LibtpuMissingError as err:
    print("LibtpuMissingError:", err)
"""


def test_compile_for_tpu_without_libtpu_names_the_extra() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    result = run_python("-c", _WITHOUT_LIBTPU, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("LibtpuMissingError: Compiling for TPU topology 'v6e:2x2'")
    assert "pip install 'safedma[tpu]'" in result.stdout


def test_error_is_a_safedma_error_and_an_import_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import safedma as sd

    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(_libtpu.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LibtpuMissingError) as raised:
        _libtpu.require_libtpu("this")
    assert isinstance(raised.value, sd.SafeDmaError) and isinstance(raised.value, ImportError)
    monkeypatch.setenv("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so")
    with pytest.raises(LibtpuMissingError):
        _libtpu.require_libtpu("this")
    library = tmp_path / "libtpu.so"
    library.write_bytes(b"")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(library))  # jax's other way to find it
    _libtpu.require_libtpu("this")


def test_libtpu_is_seen_where_installed() -> None:
    import importlib.util

    path = os.environ.get("TPU_LIBRARY_PATH")
    assert _libtpu.libtpu_installed() == (
        importlib.util.find_spec("libtpu") is not None or bool(path and os.path.isfile(path))
    )
