"""Copy options (``safedma/_dma_options.py``): ``sd.priority`` takes 0 or 1 only.

Copies started with a priority from a variable, and ``select_ref``, against their raw
twins: tests/corpus/local_copies.py and tests/corpus/semaphore_arrays.py.

``add=True`` with an indexed side in a kernel known to run on TensorCores is T5 at the
user's line: jax's TensorCore lowering does not support it and interpret mode would do a
plain copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.support.hbm_calls import one_step_hbm_call as _call
from tests.support.source_lines import line_in, raising_lines


@pytest.mark.parametrize("level", [2, -1, True, 1.0])
def test_priority_outside_0_1_is_caught(level: Any) -> None:
    with pytest.raises(sd.PriorityError):
        sd.priority(level)


STEPS, ROWS, LANES = 4, 8, 128
SAFE, RAW = True, False
X = jax.ShapeDtypeStruct((STEPS * ROWS, LANES), jnp.float32)


# --- DMA accumulate with an indexed side, in a kernel known to run on TensorCores --------


def _indexed_add(how: str) -> Callable[..., None]:
    def kernel(x_hbm: Any, o_hbm: Any, idx: Any, sem: Any) -> None:
        idx[...] = jnp.arange(ROWS, dtype=jnp.int32)
        src, dst = x_hbm.at[pl.ds(0, ROWS)], o_hbm.at[idx]
        if how == "sync_copy":
            sd.sync_copy(src, dst, add=True)  # ADD BY SYNC_COPY
        else:
            sd.LocalCopy(src, dst, sem).start(add=True).wait()  # ADD BY START

    return kernel


def _core_mesh() -> Any:
    if hasattr(pltpu, "TensorCoreMesh"):
        return pltpu.TensorCoreMesh(axis_name="core", num_cores=2)  # jax 0.12
    return pltpu.create_tensorcore_mesh("core", num_cores=2)


@pytest.mark.parametrize("entry", ["pallas_call", "core_kernel"])
@pytest.mark.parametrize("how", ["start", "sync_copy"])
def test_an_indexed_add_on_tensor_cores_is_t5(entry: str, how: str) -> None:
    # add=True was once let through wherever a side is indexed by an array (SparseCore's
    # indirect copies), so this reached jax's TensorCore lowering: "DMA with add=True is
    # not supported" (NotImplementedError), and interpret mode does a plain copy.
    scratch = [pltpu.VMEM((ROWS,), jnp.int32), pltpu.SemaphoreType.DMA(())]
    if entry == "pallas_call":
        call = _call(_indexed_add(how), SAFE, scratch)
    else:
        call = sd.core_kernel(_indexed_add(how), X, mesh=_core_mesh(), scratch_types=scratch)
    with pytest.raises(sd.UnsupportedDmaError) as err:
        jax.eval_shape(call, X)
    assert "This kernel runs on TensorCores" in str(err.value), err.value
    marker = "# ADD BY START" if how == "start" else "# ADD BY SYNC_COPY"
    assert line_in(_indexed_add, marker) in raising_lines(err, __file__)
