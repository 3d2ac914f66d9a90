"""safedma in two minutes: ``python examples/ring_permute_demo.py`` (or ``./dev demo``).

1. A ring permute written with safedma runs on a simulated 4-device CPU mesh
   in TPU interpret mode (races fatal, DMAs eager) and is checked against
   ``jax.lax.ppermute``.
2. mypy runs on a short kernel file containing the motivating mistake (a
   semaphore's *value* passed where the send semaphore belongs) and shows the
   error a user sees, where raw pltpu only fails at trace time with
   "DMA source semaphore must be a Ref.".

Importing this file changes nothing: the simulated device count and the CPU
platform are set in :func:`main`, before jax creates its CPU backend (jax reads
``XLA_FLAGS`` then, not at import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import safedma as sd

DEVICES = 4


def ring_permute(
    x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef
) -> None:
    """Send this device's block to the next device along mesh axis "x"."""
    copy = sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(sd.neighbour("x"))
    copy.start().wait()


def _run_ring() -> bool:
    devices = cast("list[object]", jax.devices())  # pyright: ignore[reportUnknownMemberType]
    mesh = jax.make_mesh(  # pyright: ignore[reportUnknownMemberType]
        (DEVICES,), ("x",), devices=devices[:DEVICES]
    )
    hbm = pl.BlockSpec(memory_space=pl.ANY)

    def per_device(block: jax.Array) -> jax.Array:
        return sd.pallas_call(
            ring_permute,
            jax.ShapeDtypeStruct(block.shape, block.dtype),
            in_specs=[hbm],
            out_specs=hbm,
            scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
            interpret=pltpu.InterpretParams(detect_races=True, dma_execution_mode="eager"),
        )(block)

    ring = cast(
        Callable[[jax.Array], jax.Array],
        jax.jit(  # pyright: ignore[reportUnknownMemberType]
            jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        ),
    )

    def ppermute(b: jax.Array) -> jax.Array:
        perm = [(i, (i + 1) % DEVICES) for i in range(DEVICES)]
        shifted: jax.Array = jax.lax.ppermute(  # pyright: ignore[reportUnknownMemberType]
            b, "x", perm
        )
        return shifted

    reference = cast(
        Callable[[jax.Array], jax.Array],
        jax.jit(  # pyright: ignore[reportUnknownMemberType]
            jax.shard_map(ppermute, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
        ),
    )
    x = jnp.arange(  # pyright: ignore[reportUnknownMemberType]
        DEVICES * 8 * 128, dtype=jnp.float32
    ).reshape(DEVICES * 8, 128)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))  # pyright: ignore[reportUnknownMemberType]
    start = time.perf_counter()
    got = np.asarray(ring(x))
    seconds = time.perf_counter() - start
    same = bool(np.array_equal(got, np.asarray(reference(x))))
    print(
        f"ring permute on {DEVICES} simulated devices (interpret mode, race detection on): "
        f"{seconds:.2f} s"
    )
    print(f"  device d now holds block d-1: {[int(got[r * 8, 0]) // 1024 for r in range(DEVICES)]}")
    print(f"  matches jax.lax.ppermute exactly: {same}")
    return same


S1_MISTAKE = textwrap.dedent('''\
    """S1: a semaphore's value passed as the send semaphore."""
    from jax.experimental import pallas as pl

    import safedma as sd


    def ring_kernel(
        x_ref: sd.DataRef, o_ref: sd.DataRef, send_sem: sd.SemRef, recv_sem: sd.SemRef
    ) -> None:
        sem_val = pl.semaphore_read(send_sem)  # a jax.Array, not the semaphore
        copy = sd.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(sem_val)
        copy.to(sd.neighbour("x")).start().wait()
''')


def _run_mypy() -> bool:
    print("\nmypy --strict on a kernel with mistake S1 (a semaphore's value as the semaphore):")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s1_kernel.py")
        with open(path, "w") as f:
            f.write(S1_MISTAKE)
        print(textwrap.indent(S1_MISTAKE, "    | ", lambda line: True), end="")
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-error-summary",
                "--cache-dir",
                os.path.join(tmp, ".mypy_cache"),
                path,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    errors = [
        line.replace(path, "s1_kernel.py")
        for line in result.stdout.splitlines()
        if ": error:" in line
    ]
    for line in errors:
        print(f"  {line}")
    caught = result.returncode == 1 and any(
        "with_send_sem" in e and "[arg-type]" in e for e in errors
    )
    print(f"  caught before running anything: {caught}")
    if not caught:
        print(result.stdout + result.stderr)
    return caught


def _simulate_devices_on_cpu() -> None:
    """Four CPU devices standing in for TPUs, whether or not libtpu is installed."""
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
        ).strip()
    jax.config.update(  # pyright: ignore[reportUnknownMemberType]
        "jax_platforms", os.environ.get("JAX_PLATFORMS") or "cpu"
    )


def main() -> int:
    _simulate_devices_on_cpu()
    print(f"safedma {sd.__version__} on jax {jax.__version__} ({jax.default_backend()} backend)\n")
    ok = _run_ring()
    ok = _run_mypy() and ok
    print("\ndemo " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
