"""A library kernel called inside ``jax.shard_map``, and the same kernel simulated on CPU.

    python examples/library_kernels.py

``gather_all`` is how a program on a TPU mesh calls ``safedma.kernels.all_gather``. On
a machine without a TPU the script runs the per-device call on 8 simulated CPU devices
with ``simulate`` (which does the ``shard_map`` itself) and compares the result with
the input: every device ends up with all of it. The library kernels page of the manual
shows ``gather_all``; ``mypy --strict`` and pyright strict accept this file.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import safedma.kernels  # noqa: E402
from safedma.testing import simulate, simulated_mesh  # noqa: E402


# --8<-- [start:call]
def gather(block: jax.Array) -> jax.Array:
    """Per device: this device's block in, every device's blocks out, in device order."""
    return safedma.kernels.all_gather(block, axis="x", concat_axis=0)


def gather_all(x: jax.Array, mesh: Mesh) -> jax.Array:
    """x sharded along mesh axis "x" in, all of x on every device out."""
    return jax.shard_map(
        gather,
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P(),
        check_vma=False,  # the kernels' outputs carry no varying-axes type
    )(x)
    # --8<-- [end:call]


def main() -> None:
    # --8<-- [start:simulate]
    x = np.arange(8 * 8 * 128, dtype=np.float32).reshape(8 * 8, 128)
    out = simulate(gather, x, mesh=simulated_mesh((8,), ("x",)), out_specs=P())
    np.testing.assert_array_equal(np.asarray(out), x)
    # --8<-- [end:simulate]
    print("all_gather: 8 CPU devices, every device holds the whole input")


if __name__ == "__main__":
    main()
