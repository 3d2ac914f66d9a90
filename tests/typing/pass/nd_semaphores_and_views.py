"""Pass: N-D semaphore arrays (``sems.at[i, j]``) and ref views (``reshape``, ``bitcast``).

Ragged paged attention and fused MoE index 2-D and 3-D semaphore arrays and copy
through reshaped and bitcast views. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from typing_extensions import assert_type

import safedma
from safedma import (
    DataRef,
    RegularSem,
    RegularSemArray,
    RegularSemArray2,
    Scratch,
    SemArray,
    SemArray2,
    SemArray3,
    SemRef,
)


def declarations() -> list[object]:
    one_d = safedma.dma_semaphores(4)
    assert_type(one_d, Scratch[SemArray])
    also_one_d = safedma.dma_semaphores((4,))
    assert_type(also_one_d, Scratch[SemArray])
    two_d = safedma.dma_semaphores((2, 3))
    assert_type(two_d, Scratch[SemArray2])
    three_d = safedma.dma_semaphores((2, 3, 4))
    assert_type(three_d, Scratch[SemArray3])
    flags = safedma.regular_semaphores((2, 2))
    assert_type(flags, Scratch[RegularSemArray2])
    return [one_d, also_one_d, two_d, three_d, flags]


def two_d_indexing(x_hbm: DataRef, buf: DataRef, sems: SemArray2, i: jax.Array) -> None:
    assert_type(sems.at[0, 1], SemRef)
    assert_type(sems.at[i, 1], SemRef)
    assert_type(sems.at[i], SemArray)
    assert_type(sems.at[i].at[1], SemRef)
    assert_type(sems.at[pl.ds(0, 1)], SemArray2)
    assert_type(sems.at[pl.ds(0, 1), 0], SemArray)
    safedma.LocalCopy(x_hbm, buf, sems.at[i, 0]).start().wait()


def three_d_indexing(sems: SemArray3, i: jax.Array) -> None:
    assert_type(sems.at[0, 1, i], SemRef)
    assert_type(sems.at[0, 1], SemArray)
    assert_type(sems.at[0], SemArray2)
    assert_type(sems.at[0, pl.ds(0, 2), 1], SemArray)


def regular_two_d(flags: RegularSemArray2, j: jax.Array) -> None:
    assert_type(flags.at[1, j], RegularSem)
    assert_type(flags.at[1], RegularSemArray)
    safedma.signal(flags.at[0, j])
    safedma.wait(flags.at[0, j])


def views(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    flat = x_hbm.reshape(16, 256)
    assert_type(flat, DataRef)
    as_int = x_hbm.bitcast(jnp.int32)
    assert_type(as_int, DataRef)
    assert_type(x_hbm.at[pl.ds(0, 16)].reshape(8, 256), DataRef)
    assert_type(buf.bitcast(np.uint32).reshape(4, 64), DataRef)
    safedma.LocalCopy(flat, buf, sem).start().wait()


def scoped_many(x_hbm: DataRef, o_hbm: DataRef) -> None:
    def body(a: DataRef, b: DataRef, sems: SemArray2, sem: SemRef, flag: RegularSem) -> int:
        safedma.LocalCopy(x_hbm, a, sems.at[0, 0]).start().wait()
        safedma.LocalCopy(a, b, sem).start().wait()
        safedma.LocalCopy(b, o_hbm, sems.at[1, 1]).start().wait()
        safedma.signal(flag)
        safedma.wait(flag)
        return 0

    result = safedma.run_scoped(
        body,
        safedma.vmem((8, 128), np.float32),
        safedma.vmem((8, 128), np.float32),
        safedma.dma_semaphores((2, 2)),
        safedma.dma_semaphore(),
        safedma.regular_semaphore(),
    )
    assert_type(result, int)

    def named(*, buf: DataRef, sem: SemRef) -> None:
        safedma.LocalCopy(x_hbm, buf, sem).start().wait()

    safedma.run_scoped(named, buf=safedma.vmem((8, 128), np.float32), sem=safedma.dma_semaphore())
    safedma.run_scoped(lambda flag: None, safedma.regular_semaphore(), collective_axes="x")
