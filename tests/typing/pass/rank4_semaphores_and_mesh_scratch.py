"""Pass: 4-D DMA semaphore arrays and scratch placed on one mesh (``scratch @ mesh``).

Found on production kernels: vLLM's hierarchical reduce-scatter
indexes its send and receive semaphores by slot, step, chunk group and dimension
(``sems.at[s, t, g, d]``), slices them step by step (``sems.at[s, t]`` then
``.at[g, d]``), and places each scratch on the mesh that uses it in a multi-mesh
``pl.kernel`` (``pltpu.SemaphoreType.DMA(shape) @ mesh``).

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

from typing import assert_type

import jax

import safedma
from safedma import DataRef, SemArray, SemArray2, SemArray3, SemArray4, SemRef


def rank4(x_hbm: DataRef, o_hbm: DataRef, send: SemArray4, recv: SemArray4, i: jax.Array) -> None:
    assert_type(send.at[0, 1, i, 2], SemRef)
    assert_type(send.at[0, 1, i], SemArray)
    assert_type(send.at[0, 1], SemArray2)
    assert_type(send.at[0], SemArray3)
    assert_type(send.at[:, 0], SemArray3)
    assert_type(send.at[:], SemArray4)
    step = recv.at[0, i]
    assert_type(step, SemArray2)
    copy = safedma.RemoteCopy(x_hbm, o_hbm, step.at[1, 0]).with_send_sem(send.at[0, i, 1, 0])
    copy.to(safedma.neighbour("x")).start().wait()


def placed(mesh: object) -> list[object]:
    sems = safedma.dma_semaphores((2, 3, 4, 5)) @ mesh
    assert_type(sems, safedma.Scratch[SemArray4])
    return [sems, safedma.regular_semaphores((2, 3)) @ mesh, safedma.dma_semaphore() @ mesh]
