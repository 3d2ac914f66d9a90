"""Compile-only TPU builds and Mosaic identity for the first kernel, on a machine without a TPU.

    python examples/compile_checks.py

1. ``assert_same_mosaic``: the safedma ring permute of ``first_kernel.py`` and the same
   kernel written in raw pltpu lower to the same Mosaic module (cross-lowered for TPU on
   a device-free mesh).
2. ``compile_for_tpu``: libtpu's TPU compiler builds it for a v6e 2x2 slice and reports
   the generated code size (needs the ``tpu`` extra, Linux x86-64).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu is installed, no TPU is attached

from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from examples.first_kernel import per_device  # noqa: E402
from safedma.testing import abstract_mesh, assert_same_mosaic, compile_for_tpu  # noqa: E402


# --8<-- [start:twin]
def ring_permute_pltpu(x_ref: Any, o_ref: Any, send_sem: Any, recv_sem: Any) -> None:
    """The same kernel in raw pltpu: what a careful author writes by hand."""
    me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
    # jax leaves this function's refs unannotated, which pyright strict reports.
    copy = pltpu.make_async_remote_copy(  # pyright: ignore[reportUnknownMemberType]
        x_ref, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % n}
    )
    copy.start()
    copy.wait()


def per_device_pltpu(block: jax.Array) -> jax.Array:
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    out: jax.Array = pl.pallas_call(
        ring_permute_pltpu,
        jax.ShapeDtypeStruct(block.shape, block.dtype),
        in_specs=[hbm],
        out_specs=hbm,
        scratch_shapes=[pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.DMA(())],
    )(block)
    return out
    # --8<-- [end:twin]


def main() -> None:
    # --8<-- [start:identity]
    mesh = abstract_mesh((4,), ("x",))  # no devices needed
    x = jax.ShapeDtypeStruct((4 * 8, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))

    def sharded(body: Any) -> Any:
        return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)

    assert_same_mosaic(sharded(per_device), sharded(per_device_pltpu), x, mesh=mesh)
    # --8<-- [end:identity]
    print("assert_same_mosaic: the safedma kernel and its pltpu twin lower to the same Mosaic")

    # --8<-- [start:compile]
    report = compile_for_tpu(
        per_device, jax.ShapeDtypeStruct((4 * 8, 128), jnp.float32), topology="v6e:2x2"
    )
    print(report.kernel_names, report.generated_code_size_in_bytes, "bytes of TPU code")
    # --8<-- [end:compile]


if __name__ == "__main__":
    main()
