"""Four devices along ``"x"``, 16 rows each: the mesh and the sharded input of the exchange
kernels (tests/core/test_exchanges.py) and of the catalogue mistakes seeded in their shapes
(tests/core/test_catalogue_rows_in_other_shapes.py)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from safedma.testing import abstract_mesh

N = 4
ROWS = 16


def mesh(tpu: str | None = None) -> Any:
    """A device-free mesh of ``N`` devices along ``"x"`` (naming the TPU when given)."""
    return abstract_mesh((N,), ("x",), tpu=tpu)


def blocks(mesh: Any) -> jax.ShapeDtypeStruct:
    """``ROWS`` float32 rows of 128 lanes per device, sharded along ``"x"`` of ``mesh``."""
    return jax.ShapeDtypeStruct((N * ROWS, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
