"""Mistakes the type checkers see in a kernel written with safedma.gpu.

Each line that must be an error ends with
``# expect: mypy[code] pyright[rule,...]``;
tests/gpu/test_typed_gpu_typing.py runs mypy --strict and pyright strict on this file
and compares what they report with these comments, line by line.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl

from safedma import gpu

T = 64


def body(
    x_gmem: gpu.GmemRef,
    o_gmem: gpu.GmemRef,
    smem_in: gpu.SmemRef,
    smem_out: gpu.SmemRef,
    bars: gpu.BarrierRef,
) -> None:
    with gpu.Tma() as tma:
        ins, outs = tma.smem(smem_in), tma.smem(smem_out)
        barriers = tma.barriers(bars)
        load = gpu.copy_gmem_to_smem(x_gmem.at[pl.ds(0, T)], ins.at(0), barriers.at(0))

        # Reading a buffer whose handle is still loading: a handle has no read.
        load.read()  # expect: mypy[attr-defined] pyright[reportAttributeAccessIssue,reportUnknownMemberType]

        x = load.wait()
        written = outs.at(0).write(x.read() * 2)
        block = o_gmem.at[pl.ds(0, T)]

        # A store of SMEM the kernel wrote, without commit_smem.
        gpu.copy_smem_to_gmem(written, block)  # expect: mypy[arg-type] pyright[reportArgumentType]

        # A load handle where a buffer belongs.
        gpu.copy_smem_to_gmem(load, block)  # expect: mypy[arg-type] pyright[reportArgumentType]

        # A GMEM ref where an SMEM buffer belongs.
        gmem, bar = x_gmem, barriers.at(1)
        gpu.copy_gmem_to_smem(gmem, gmem, bar)  # expect: mypy[arg-type] pyright[reportArgumentType]

        # Indexing the SMEM ref the typed layer owns, around it.
        smem_in[0]  # expect: mypy[index] pyright[reportIndexIssue]

        # A traced index: states are tracked per buffer at trace time.
        step: jax.Array = jax.numpy.int32(1)
        ins.at(step)  # expect: mypy[arg-type] pyright[reportArgumentType]

        stored = gpu.copy_smem_to_gmem(gpu.commit_smem(written), block)
        stored.wait(read_only=True)

        # A loop step that returns other kinds of handles than it receives.
        def wrong(it: gpu.Step, carry: tuple[gpu.LoadHandle]) -> tuple[gpu.StoreHandle]:
            return (stored,)

        tma.fori_loop(0, 2, wrong, (load,))  # expect: mypy[arg-type] pyright[reportArgumentType]
        tma.wait_all_stores()
