"""A double-buffered Pallas GPU kernel written with safedma.gpu, and its raw plgpu twin.

    python examples/gpu_double_buffer.py

Each of ``STEPS`` row blocks of ``x`` is loaded into SMEM by the TMA (the next block's
load is in flight while this one is computed), doubled, and stored back to GMEM by the
TMA from a second pair of SMEM buffers. ``typed_body`` and ``raw_body`` trace to the
same jaxpr; the script checks that and proves the typed kernel's copy and barrier
protocol with ``verify_gpu``, all on CPU: nothing is compiled or run, and no GPU is
needed (jax 0.12 or later). ``mypy --strict`` and pyright strict accept this file.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from collections.abc import Callable  # noqa: E402
from typing import Any, cast  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import mosaic_gpu as plgpu  # noqa: E402

from safedma import gpu  # noqa: E402

STEPS = 4
ROWS = 64  # rows per block
COLS = 128


# --8<-- [start:typed]
def typed_body(
    x_gmem: gpu.GmemRef,
    o_gmem: gpu.GmemRef,
    smem_in: gpu.SmemRef,
    smem_out: gpu.SmemRef,
    bars: gpu.BarrierRef,
) -> None:
    """Load block i+1 while block i is computed; store each result from its own buffer."""
    with gpu.Tma() as tma:  # the block's end checks that no copy's handle was dropped
        ins = tma.smem(smem_in, "smem_in")
        outs = tma.smem(smem_out, "smem_out")
        barriers = tma.barriers(bars, "bars")

        def load(step: int) -> gpu.LoadHandle:
            slot = step % 2
            block = x_gmem.at[pl.ds(step * ROWS, ROWS)]
            return gpu.copy_gmem_to_smem(block, ins.at(slot), barriers.at(slot))

        loads = [load(0)]
        stores: list[gpu.StoreHandle] = []
        for step in range(STEPS):
            slot = step % 2
            if step + 1 < STEPS:
                loads.append(load(step + 1))
            x = loads[step].wait()  # barrier_wait: the block has landed
            # The store two steps back read this output buffer: wait its reads, by name.
            out = outs.at(slot) if step < 2 else stores[step - 2].wait(read_only=True)
            written = out.write(x.read() * 2)
            ready = gpu.commit_smem(written)  # a store takes only committed SMEM
            stores.append(gpu.copy_smem_to_gmem(ready, o_gmem.at[pl.ds(step * ROWS, ROWS)]))
        tma.wait_all_stores()


# --8<-- [end:typed]


# --8<-- [start:raw]
def raw_body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
    """The same kernel in plain plgpu calls (jax leaves its refs unannotated)."""
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, ROWS)], smem_in.at[0], bars.at[0])
    for step in range(STEPS):
        slot = step % 2
        if step + 1 < STEPS:
            nxt = (step + 1) % 2
            block = x_gmem.at[pl.ds((step + 1) * ROWS, ROWS)]
            plgpu.copy_gmem_to_smem(block, smem_in.at[nxt], bars.at[nxt])
        plgpu.barrier_wait(bars.at[slot])
        if step >= 2:
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        smem_out[slot] = smem_in[slot] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[slot], o_gmem.at[pl.ds(step * ROWS, ROWS)])
    plgpu.wait_smem_to_gmem(0)


# --8<-- [end:raw]


LOOP_STEPS = 6
# Typed once for the raw twin: jax leaves fori_loop unannotated.
fori_loop = cast(
    "Callable[[int, int, Callable[[Any, None], None], None], None]", getattr(jax.lax, "fori_loop")
)


# --8<-- [start:typed-loop]
def typed_loop_body(
    x_gmem: gpu.GmemRef,
    o_gmem: gpu.GmemRef,
    smem_in: gpu.SmemRef,
    smem_out: gpu.SmemRef,
    bars: gpu.BarrierRef,
) -> None:
    """The same pipeline over LOOP_STEPS blocks, its middle steps in a fori_loop."""
    with gpu.Tma() as tma:
        ins = tma.smem(smem_in, "smem_in")
        outs = tma.smem(smem_out, "smem_out")
        barriers = tma.barriers(bars, "bars")

        def compute(x: gpu.SmemBuffer, out: gpu.SmemBuffer, i: int | jax.Array) -> gpu.StoreHandle:
            ready = gpu.commit_smem(out.write(x.read() * 2))
            return gpu.copy_smem_to_gmem(ready, o_gmem.at[pl.ds(i * ROWS, ROWS)])

        # Prologue: steps 0 and 1, whose output buffers no store has read yet.
        load0 = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, ROWS)], ins.at(0), barriers.at(0))
        load1 = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(ROWS, ROWS)], ins.at(1), barriers.at(1))
        store0 = compute(load0.wait(), outs.at(0), 0)
        load2 = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(2 * ROWS, ROWS)], ins.at(0), barriers.at(0))
        store1 = compute(load1.wait(), outs.at(1), 1)

        # Step i receives its load and the stores of steps i-2 and i-1; it returns the load
        # of step i+1 and the stores of steps i-1 and i.
        def step(
            it: gpu.Step, carry: tuple[gpu.LoadHandle, gpu.StoreHandle, gpu.StoreHandle]
        ) -> tuple[gpu.LoadHandle, gpu.StoreHandle, gpu.StoreHandle]:
            load, two_back, one_back = carry
            block = x_gmem.at[pl.ds((it.index + 1) * ROWS, ROWS)]
            nxt = gpu.copy_gmem_to_smem(block, ins.at(it.slot(1)), barriers.at(it.slot(1)))
            x = load.wait()
            out = two_back.wait(read_only=True)  # wait_smem_to_gmem(1, wait_read_only=True)
            return nxt, one_back, compute(x, out, it.index)

        last, two_back, _ = tma.fori_loop(2, LOOP_STEPS - 1, step, (load2, store0, store1))
        # Epilogue: the last step loads nothing more.
        out = two_back.wait(read_only=True)
        compute(last.wait(), out, LOOP_STEPS - 1)
        tma.wait_all_stores()


# --8<-- [end:typed-loop]


def raw_loop_body(x_gmem: Any, o_gmem: Any, smem_in: Any, smem_out: Any, bars: Any) -> None:
    """typed_loop_body in plain plgpu calls."""

    def compute(slot: Any, i: Any) -> None:
        smem_out[slot] = smem_in[slot] * 2
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem_out.at[slot], o_gmem.at[pl.ds(i * ROWS, ROWS)])

    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, ROWS)], smem_in.at[0], bars.at[0])
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(ROWS, ROWS)], smem_in.at[1], bars.at[1])
    plgpu.barrier_wait(bars.at[0])
    compute(0, 0)
    plgpu.copy_gmem_to_smem(x_gmem.at[pl.ds(2 * ROWS, ROWS)], smem_in.at[0], bars.at[0])
    plgpu.barrier_wait(bars.at[1])
    compute(1, 1)

    def step(i: Any, carry: None) -> None:
        slot = i % 2
        nxt = (i + 1) % 2
        block = x_gmem.at[pl.ds((i + 1) * ROWS, ROWS)]
        plgpu.copy_gmem_to_smem(block, smem_in.at[nxt], bars.at[nxt])
        plgpu.barrier_wait(bars.at[slot])
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        compute(slot, i)
        return carry

    fori_loop(2, LOOP_STEPS - 1, step, None)
    final = (LOOP_STEPS - 1) % 2
    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
    plgpu.barrier_wait(bars.at[final])
    compute(final, LOOP_STEPS - 1)
    plgpu.wait_smem_to_gmem(0)


def kernel(body: Callable[..., None]) -> Callable[[jax.Array], jax.Array]:
    """``body`` as a ``plgpu.kernel`` over an array of ROWS-row blocks."""

    def run(x: jax.Array) -> jax.Array:
        call = plgpu.kernel(
            body,
            out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
            scratch_types=[
                plgpu.SMEM((2, ROWS, COLS), jnp.float32),
                plgpu.SMEM((2, ROWS, COLS), jnp.float32),
                plgpu.Barrier(num_arrivals=1, num_barriers=2),
            ],
        )
        out: jax.Array = call(x)
        return out

    return run


# Typed once: jax leaves make_jaxpr partly unannotated.
_make_jaxpr = cast(
    "Callable[[Callable[..., object]], Callable[..., object]]", getattr(jax, "make_jaxpr")
)


def jaxpr_text(run: Callable[[jax.Array], jax.Array], x: jax.ShapeDtypeStruct) -> str:
    """The jaxpr of ``run(x)`` as text, the kernel's name (its body's) left out."""
    text = str(_make_jaxpr(run)(x))
    return re.sub(r"\bname=\w+", "name=_", text)


def main() -> None:
    from safedma.testing import verify_gpu

    x = jax.ShapeDtypeStruct((STEPS * ROWS, COLS), jnp.float32)
    typed = jaxpr_text(kernel(typed_body), x)
    raw = jaxpr_text(kernel(raw_body), x)
    assert typed == raw, "the typed kernel should trace to its raw twin's jaxpr"
    print(verify_gpu(kernel(typed_body), x))
    x = jax.ShapeDtypeStruct((LOOP_STEPS * ROWS, COLS), jnp.float32)
    typed = jaxpr_text(kernel(typed_loop_body), x)
    raw = jaxpr_text(kernel(raw_loop_body), x)
    assert typed == raw, "the typed loop should trace to its raw twin's jaxpr"
    print(verify_gpu(kernel(typed_loop_body), x))


if __name__ == "__main__":
    main()
