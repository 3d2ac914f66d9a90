"""Dtypes, topologies, meshes and build checks shared by the tests of safedma.kernels."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from safedma.testing import TpuCompileReport

DType = np.dtype[Any]
F32: DType = np.dtype(jnp.float32)
BF16: DType = np.dtype(jnp.bfloat16)
I32: DType = np.dtype(jnp.int32)
TILE_ROWS = {F32: 8, BF16: 16}  # rows of one (rows, 128) tile
EACH_DTYPE = pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
# One topology per TPU generation safedma's kernels compile for.
TOPOLOGIES = ["v5e:2x2", "v6e:2x2", "v5p:2x2x1", "v4:2x2x1", "tpu7x:2x2x1"]
# Per-device kernels (gather, pipeline): mesh shape, axis names, the axes the data is split over.
SPLIT_MESHES = pytest.mark.parametrize(
    "mesh_shape,names,split",
    [
        ((2,), ("x",), "x"),
        ((4,), ("x",), "x"),
        ((8,), ("x",), "x"),
        ((2, 4), ("y", "x"), "y"),
        ((2, 4), ("y", "x"), "x"),
        ((2, 4), ("y", "x"), ("y", "x")),
    ],
    ids=["2", "4", "8", "2x4-y", "2x4-x", "2x4-yx"],
)


def split_devices(mesh: Mesh, split: str | tuple[str, ...]) -> int:
    """How many shards ``split`` (one axis or several) cuts the data into on ``mesh``."""
    axes = (split,) if isinstance(split, str) else split
    return int(np.prod([mesh.shape[a] for a in axes]))


def assert_built(report: TpuCompileReport, *, devices: int, kernels: tuple[str, ...]) -> None:
    """The compile covered ``devices`` devices, built exactly ``kernels``, and made code."""
    assert report.num_devices == devices
    assert report.kernel_names == kernels
    assert report.generated_code_size_in_bytes > 0
