"""Checking Pallas GPU (``plgpu``) kernels without a GPU: their TMA copy and barrier protocol.

One job per module: :mod:`.jax_seam` (every private jax name),
:mod:`.regions` (buffers and the elements a view covers), :mod:`.protocol`
(the rules), :mod:`.walker` (the jaxpr walk), :mod:`.api` (``verify_gpu``),
:mod:`.errors` (what is reported), :mod:`.simulate` (``simulate_gpu``, jax's GPU
interpreter run strictly). Nothing here imports Pallas GPU until a
program is checked.
"""

from safedma.testing._gpu.api import verify_gpu
from safedma.testing._gpu.errors import (
    BarrierNeverCompletesError,
    CopyInFlightAtExitError,
    GpuVerifyReport,
    StuckBarrierWait,
)
from safedma.testing._gpu.simulate import GpuRaceDetectedError, simulate_gpu

__all__ = [
    "BarrierNeverCompletesError",
    "CopyInFlightAtExitError",
    "GpuRaceDetectedError",
    "GpuVerifyReport",
    "StuckBarrierWait",
    "simulate_gpu",
    "verify_gpu",
]
