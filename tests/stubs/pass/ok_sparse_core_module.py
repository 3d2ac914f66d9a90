"""Pass: ``from jax.experimental.pallas import tpu_sc`` keeps jax's SparseCore types.

Found on production kernels: with the stubs on pyright's ``stubPath``
this import was "unknown import symbol" and every ``plsc.`` name ``Unknown``, so a
decorated loop body (``@plsc.parallel_loop(..., carry=...)``) stayed a function and its
unpacking an error. The pass-through ``tpu_sc.pyi`` fixes both; mypy was not affected.
"""

from __future__ import annotations

import jax
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from safedma import DataRef, SemRef


def sparse_core_kernel(x_ref: DataRef, o_ref: DataRef, buf: DataRef, sem: SemRef,
                       init: list[jax.Array]) -> None:
    pltpu.make_async_copy(x_ref, buf, sem).start()
    pltpu.make_async_copy(x_ref, buf, sem).wait()

    @plsc.parallel_loop(0, 64, 16, carry=init)
    def running(i: jax.Array, carry: list[jax.Array]) -> list[jax.Array]:
        total, last = carry
        return [total + i, last]

    [total, _] = running
    plsc.subcore_barrier()
    del total
    pltpu.make_async_copy(buf, o_ref, sem).start()
    pltpu.make_async_copy(buf, o_ref, sem).wait()


def mesh() -> plsc.VectorSubcoreMesh:
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
