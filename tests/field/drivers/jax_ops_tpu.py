"""jax's own DMA kernels (``jax.experimental.pallas.ops.tpu``), from the jax under test.

Shapes follow jax's tests (``tests/pallas/tpu_all_gather_test.py``,
``tpu_paged_attention_kernel_test.py``, ``tpu_ragged_paged_attention_test.py``), made
small: the protocol does not depend on sizes beyond the number of blocks.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp

from tests.corpus._case import Program
from tests.corpus._seeding import unjitted as _unjitted
from tests.field._kernel import FieldKernel

OPS = "jax.experimental.pallas.ops.tpu"


def _all_gather(devices: int) -> Any:
    def build(module: ModuleType) -> Program:
        from safedma.testing import abstract_mesh

        mesh = abstract_mesh((devices,), ("x",))

        def program(x: jax.Array) -> jax.Array:
            out: jax.Array = _unjitted(module.all_gather)(x, mesh=mesh, axis_name="x")
            return out

        return Program(program, (jax.ShapeDtypeStruct((devices * 16, 128), jnp.float32),))

    return build


def _paged_attention(module: ModuleType) -> Program:
    from tests.corpus.grids import paged_attention_inputs

    fn = functools.partial(_unjitted(module.paged_attention), pages_per_compute_block=2)
    return Program(fn, paged_attention_inputs())


ALL_GATHER_RACE = (
    "true bug: a left neighbour can have two same-size copies to us in flight on one "
    "receive semaphore (its step-i copy needs only our step-(i-1) leftward copy to have "
    "landed), so the later one can satisfy the wait meant for the earlier and we forward "
    "a slot still being written; the kernel relies on in-order delivery between two "
    "devices, which no Pallas document promises (the verify page walks the schedule)"
)

KERNELS = [
    *(
        FieldKernel(
            f"jax/all_gather/{n}_devices",
            f"{OPS}.all_gather",
            _all_gather(n),
            "jax tests/pallas/tpu_all_gather_test.py (ring all-gather, one axis)",
            readings={} if n == 2 else {"verify": ALL_GATHER_RACE},
        )
        for n in (2, 4, 8)
    ),
    FieldKernel(
        "jax/paged_attention",
        f"{OPS}.paged_attention.paged_attention_kernel",
        _paged_attention,
        "jax tests/pallas/tpu_paged_attention_kernel_test.py (2 sequences, 4 pages of 16)",
    ),
]
