"""Scaffolding shared by the safedma-vs-raw ring kernel tests (tests/core).

Each such test builds one device's block as a ``ShapeDtypeStruct`` (sharded over a
mesh when the Mosaic of the two twins is compared) and wraps a per-device function
in ``jit(shard_map(...))`` for :func:`safedma.testing.assert_same_mosaic`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def ring_blocks(n: int, rows: int, mesh: Any = None) -> jax.ShapeDtypeStruct:
    """``rows`` float32 rows of 128 lanes per device on a ring of ``n`` along ``"x"``
    (sharded over ``mesh`` when given)."""
    sharding = NamedSharding(mesh, P("x")) if mesh is not None else None
    return jax.ShapeDtypeStruct((n * rows, 128), jnp.float32, sharding=sharding)


ALONG_X = P("x")


def sharded(
    per_device: Callable[..., Any], mesh: Any, in_specs: Any = ALONG_X, out_specs: Any = ALONG_X
) -> Callable[..., Any]:
    """``per_device`` under ``jax.shard_map`` over ``mesh``, jitted."""
    return jax.jit(
        jax.shard_map(
            per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )
    )
