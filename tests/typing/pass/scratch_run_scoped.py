"""Pass: typed scratch declarations and run_scoped, which hands its body refs of
the brands the declarations promise. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import numpy as np
from jax.experimental import pallas as pl
from typing import assert_type

import safedma
from safedma import DataRef, RegularSem, RegularSemArray, Scratch, SemArray, SemRef


def declarations() -> list[object]:
    one = safedma.dma_semaphore()
    assert_type(one, Scratch[SemRef])
    two = safedma.dma_semaphores(2)
    assert_type(two, Scratch[SemArray])
    flag = safedma.regular_semaphore()
    assert_type(flag, Scratch[RegularSem])
    flags = safedma.regular_semaphores(4)
    assert_type(flags, Scratch[RegularSemArray])
    buf = safedma.vmem((8, 128), np.float32)
    assert_type(buf, Scratch[DataRef])
    table = safedma.smem((16,), np.int32)
    assert_type(table, Scratch[DataRef])
    return [one, two, flag, flags, buf, table]


def scoped_kernel(x_hbm: DataRef, o_hbm: DataRef) -> None:
    def with_buffer(buf: DataRef, sems: SemArray) -> float:
        safedma.LocalCopy(x_hbm, buf, sems.at[0]).start().wait()
        buf[...] = buf[...] + 1.0
        safedma.LocalCopy(buf, o_hbm, sems.at[1]).start().wait()
        return 0.0

    result = safedma.run_scoped(
        with_buffer, safedma.vmem((8, 128), np.float32), safedma.dma_semaphores(2)
    )
    assert_type(result, float)

    def with_sem(sem: SemRef) -> None:
        safedma.LocalCopy(x_hbm.at[pl.ds(0, 4)], o_hbm.at[pl.ds(4, 4)], sem).start().wait()

    safedma.run_scoped(with_sem, safedma.dma_semaphore())

    def with_flag(flag: RegularSem) -> None:
        safedma.signal(flag)
        safedma.wait(flag)

    safedma.run_scoped(with_flag, safedma.regular_semaphore())
