"""Checking Pallas GPU (``plgpu``) kernels without a GPU: their TMA copy and barrier protocol.

One job per module: :mod:`.jax_seam` (every private jax name),
:mod:`.regions` (buffers and the elements a view covers), :mod:`.protocol`
(the rules), :mod:`.walker` (the jaxpr walk), :mod:`.api` (``verify_gpu``),
:mod:`.errors` (what is reported). Nothing here imports Pallas GPU until a
program is checked.
"""

from safedma.testing._gpu.api import verify_gpu
from safedma.testing._gpu.errors import CopyInFlightAtExitError, GpuVerifyReport

__all__ = ["CopyInFlightAtExitError", "GpuVerifyReport", "verify_gpu"]
