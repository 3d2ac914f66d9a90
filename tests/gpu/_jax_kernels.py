"""What the tests that drive jax's own Pallas GPU kernels (jax/experimental/pallas/ops/gpu)
share: the kernel modules by name, a stand-in for the GPU their wrappers ask about, and
float32 views of outputs to compare.

The kernel modules import ``jax._src.test_util`` (absl, served by the field lane's
stand-in where it is not installed) and ask the default device for its SM count; on a
CPU-only machine the count comes from :class:`JaxWithDevices`. Nothing of the kernels'
code is changed.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from tests.field import _shims

_shims.install()  # absl, imported by jax._src.test_util, where it is not installed

OPS = "jax.experimental.pallas.ops.gpu."


def f32(x: Any) -> Any:
    """``x`` as a float32 numpy array, to compare a kernel's output with numpy's."""
    import numpy as np

    return np.asarray(x, dtype=np.float32)


def ops(name: str) -> Any:
    """jax's GPU kernel module ``name`` (``"ragged_dot_mgpu"``)."""
    return importlib.import_module(OPS + name)


class JaxWithDevices(types.ModuleType):
    """jax, except that its devices are one GPU-like device with ``sms`` SMs: set as a
    kernel module's ``jax`` where its wrapper reads ``jax.devices()[0].core_count``."""

    def __init__(self, sms: int) -> None:
        super().__init__("jax")
        self._sms = sms

    def __getattr__(self, name: str) -> Any:
        import jax

        return getattr(jax, name)

    def devices(self, *args: Any) -> list[Any]:
        return [types.SimpleNamespace(core_count=self._sms)]

    local_devices = devices
