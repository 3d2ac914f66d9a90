"""Whether libtpu, the TPU compiler jax loads, is installed: ``safedma[tpu]`` brings it.

safedma itself depends on plain ``jax`` so that it installs where no libtpu
wheel exists (macOS, Windows, Linux on ARM) and kernels can still be
type-checked and simulated there. Compile-only TPU builds need libtpu; without
it jax fails deep inside with a message about backends, so this check names
the extra instead. Deliberately jax-free.
"""

from __future__ import annotations

import importlib.util
import os

from safedma._errors import SafeDmaError

__all__ = ["LibtpuMissingError", "require_libtpu"]

INSTALL_HINT = "pip install 'safedma[tpu]'"


class LibtpuMissingError(SafeDmaError, ImportError):
    """A TPU compile was asked for, but libtpu (the ``safedma[tpu]`` extra) is not installed."""


def libtpu_installed() -> bool:
    """As jax looks for it: the ``libtpu`` package, or a library named by ``TPU_LIBRARY_PATH``."""
    path = os.environ.get("TPU_LIBRARY_PATH")  # jax sets it once it has loaded libtpu
    return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def require_libtpu(what: str) -> None:
    """Raise :class:`LibtpuMissingError` naming ``what`` and the extra when libtpu is absent."""
    if not libtpu_installed():
        raise LibtpuMissingError(
            f"{what} needs libtpu (the TPU compiler), which is not installed: "
            f"{INSTALL_HINT} (Linux x86-64 only; jax[tpu] brings libtpu). Type checks and "
            "simulate() need no libtpu."
        )
