"""Benchmark: how long verify takes to report a mistake against proving the same kernel
clean, and whether its memory stays flat over many calls (CPU only, no TPU).

The kernel is a data-parallel double buffer (each device streams 16 blocks of rows
HBM -> VMEM through two slots over a grid of 16 steps, each step prefetching the next
block while it copies the current one out), the mistake the wait of the current block's copy dropped. Both
run on 1-D device-free meshes of 4, 64 and 256 devices, side by side in one process;
the table gives the least CPU time of ``reps`` calls each. Then 300 calls of the
mistake on 4 devices, with the process's resident memory before and after.

``python -m benchmarks.verify_failure_path [REPS]``.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

from benchmarks._common import heading, table

DEVICES = (4, 64, 256)
CALLS = 300
ROWS = 8
BLOCKS = 16  # blocks of ROWS rows each device streams through its two slots


def _program(drop_wait: bool) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def fetch(x_hbm: Any, buf: Any, sems: Any, block: Any) -> Any:
        slot = block % 2
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(block * ROWS, ROWS)], buf.at[slot], sems.at[slot]
        )

    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any, out_sem: Any) -> None:
        block = pl.program_id(0)

        @pl.when(block == 0)
        def _() -> None:
            fetch(x_hbm, buf, sems, block).start()

        @pl.when(block + 1 < BLOCKS)
        def _() -> None:
            fetch(x_hbm, buf, sems, block + 1).start()

        wait = fetch(x_hbm, buf, sems, block)
        if not drop_wait:
            wait.wait()
        out = pltpu.make_async_copy(buf.at[block % 2], o_hbm.at[pl.ds(block * ROWS, ROWS)], out_sem)
        out.start()
        out.wait()

    def body(x: jax.Array) -> jax.Array:
        any_space = pl.BlockSpec(memory_space=pl.ANY)
        return pl.pallas_call(
            kernel,
            grid=(BLOCKS,),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[any_space],
            out_specs=any_space,
            scratch_shapes=[
                pltpu.VMEM((2, ROWS, 128), jnp.float32),
                pltpu.SemaphoreType.DMA((2,)),
                pltpu.SemaphoreType.DMA(()),
            ],
        )(x)

    return body


def _verify(drop_wait: bool, devices: int) -> tuple[float, str]:
    import jax
    import jax.numpy as jnp

    from safedma.testing import SimulationError, abstract_mesh, verify

    mesh = abstract_mesh((devices,), ("x",))
    x = jax.ShapeDtypeStruct((devices * BLOCKS * ROWS, 128), jnp.float32)
    start = time.process_time()
    try:
        verify(_program(drop_wait), x, mesh=mesh)
        verdict = "clean"
    except SimulationError as err:
        verdict = type(err).__name__
    return time.process_time() - start, verdict


def _rss_mib() -> float:
    """The process's resident memory now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(reps: int = 3) -> None:
    heading("verify: the failure path against the clean path (CPU time, least of runs)")
    _verify(True, 4)  # warm: imports and jax's tracing machinery
    rows = []
    for devices in DEVICES:
        clean = [_verify(False, devices) for _ in range(reps)]
        mistake = [_verify(True, devices) for _ in range(reps)]
        rows.append(
            [
                str(devices),
                f"{min(t for t, _ in clean):.2f} s ({clean[0][1]})",
                f"{min(t for t, _ in mistake):.2f} s ({mistake[0][1]})",
            ]
        )
    print(table(["devices", "clean", "a dropped wait"], rows))
    memory = [_rss_mib()]
    start = time.perf_counter()
    for call in range(1, CALLS + 1):
        _verify(True, 4)
        if call % 100 == 0:
            memory.append(_rss_mib())
    steps = ", ".join(f"{m:.0f}" for m in memory)
    print(
        f"\n{CALLS} calls reporting the dropped wait on 4 devices: "
        f"{time.perf_counter() - start:.1f} s; resident memory after 0, 100, 200, 300 "
        f"calls: {steps} MiB"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
