"""Test helpers for TPU kernels on machines without a TPU.

* Mosaic identity (:func:`mosaic_text`, :func:`assert_same_mosaic`): prove a
  safedma kernel hands the TPU compiler exactly the Mosaic module of its
  hand-written ``pltpu`` twin, by cross-lowering both for TPU on CPU.
* Compile-only builds (:func:`compile_for_tpu`): run libtpu's real XLA TPU
  compiler and Mosaic for a named TPU topology, so VMEM overflows and
  compiler rejections show up in CI rather than on a TPU.
* Protocol verification (:func:`verify`): prove a kernel's DMA and
  semaphore protocol from its own program, on every device of a real or
  device-free mesh, without running it.
* Pallas GPU protocol checks (:func:`verify_gpu`): prove the TMA copy and
  barrier protocol of ``plgpu`` kernels from their traced program, without a GPU;
  :func:`simulate_gpu` runs them in jax's GPU interpreter with races fatal and a
  barrier wait that can never complete stopped and explained.
* Strict simulation (:func:`simulate`, :func:`simulated_mesh`): run kernels in
  TPU interpret mode over several CPU devices with races, semaphores left
  non-zero at kernel exit and waits that can never be satisfied turned into
  :class:`SimulationError` subclasses instead of prints and hangs.

Run with ``JAX_PLATFORMS=cpu`` on machines where libtpu is installed but no
TPU is attached, so JAX does not try to open a TPU.
"""

from safedma.testing._compile import (
    TpuCompileError,
    TpuCompileReport,
    TpuMeshError,
    compile_for_tpu,
    tpu_mesh,
)
from safedma.testing._libtpu import LibtpuMissingError
from safedma.testing._mosaic import (
    KERNEL_PLACEHOLDER,
    TPU_GENERATIONS,
    MosaicKernel,
    MosaicMismatchError,
    abstract_mesh,
    assert_same_mosaic,
    mosaic_kernels,
    mosaic_text,
)
from safedma.testing._verify import (
    DeadlockError,
    OutOfBoundsDmaError,
    SemaphoreIndexError,
    MissingBarrierError,
    SignalAfterExitError,
    UnwrittenReadError,
    VerificationUnsupportedError,
    VerifyReport,
)
from safedma.testing._verify import verify as _verify_as_written
from safedma.testing._errors import (
    ConcurrentInterpretError,
    DeviceOutsideMeshError,
    KernelFailedError,
    LeftoverSemaphore,
    LeftoverSemaphoreError,
    NotEnoughDevicesError,
    Race,
    RaceDetectedError,
    SimulationError,
    SimulationTimeoutError,
    SimulationUnsupportedError,
    StuckWait,
    UnsatisfiableWaitError,
)
from safedma.testing._gpu import (
    BarrierNeverCompletesError,
    CopyInFlightAtExitError,
    GpuRaceDetectedError,
    GpuVerifyReport,
    StuckBarrierWait,
    simulate_gpu,
    verify_gpu,
)
from safedma.testing._meshes import simulated_mesh
from safedma.testing._private import PrivateJaxApiError
from safedma.testing._simulate import simulate as _simulate_as_written
from safedma._sanitize._options import sees_the_program_as_written

# verify and simulate see the kernels as written (the aliases must not shadow the
# submodules _verify and _simulate, which code reaches as attributes of this package): SAFEDMA_SANITIZE does not instrument them.
verify = sees_the_program_as_written(_verify_as_written)
simulate = sees_the_program_as_written(_simulate_as_written)

__all__ = [
    "DeadlockError",
    "OutOfBoundsDmaError",
    "SemaphoreIndexError",
    "MissingBarrierError",
    "SignalAfterExitError",
    "UnwrittenReadError",
    "VerificationUnsupportedError",
    "VerifyReport",
    "verify",
    "KERNEL_PLACEHOLDER",
    "ConcurrentInterpretError",
    "CopyInFlightAtExitError",
    "GpuVerifyReport",
    "verify_gpu",
    "BarrierNeverCompletesError",
    "GpuRaceDetectedError",
    "StuckBarrierWait",
    "simulate_gpu",
    "KernelFailedError",
    "DeviceOutsideMeshError",
    "LeftoverSemaphore",
    "LeftoverSemaphoreError",
    "LibtpuMissingError",
    "MosaicKernel",
    "MosaicMismatchError",
    "NotEnoughDevicesError",
    "PrivateJaxApiError",
    "Race",
    "RaceDetectedError",
    "SimulationError",
    "SimulationTimeoutError",
    "SimulationUnsupportedError",
    "StuckWait",
    "TpuCompileError",
    "TpuCompileReport",
    "TpuMeshError",
    "TPU_GENERATIONS",
    "UnsatisfiableWaitError",
    "abstract_mesh",
    "assert_same_mosaic",
    "compile_for_tpu",
    "mosaic_kernels",
    "mosaic_text",
    "simulate",
    "simulated_mesh",
    "tpu_mesh",
]

# Public classes print with the path they are imported by (safedma.testing.DeadlockError),
# not the private module that defines them.
_name: str = ""
_value: object = None
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type) and _value.__module__.startswith(f"{__name__}._"):
        _value.__module__ = __name__
del _name, _value


def __dir__() -> list[str]:
    """The public names only (not the helpers this package imports for itself)."""
    return sorted(__all__)
