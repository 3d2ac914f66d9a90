"""Typed, documented collective and pipeline kernels written with safedma.

Each kernel module exposes a per-device function to call inside
``jax.shard_map`` (or directly, for the single-device kernels) and the kernel
body itself, for reading or copying. See each module's docstring for what the
kernel does, its preconditions, the semaphores it needs and how its messages
flow. The building blocks the fused all-reduce shares with the ring kernels
(``reduce_scatter_ring``, ``all_gather_ring``, their scratch layouts) stay in
their modules.
"""

from safedma.kernels.all_gather import (
    all_gather,
    all_gather_bidirectional,
    all_gather_bidirectional_kernel,
    all_gather_kernel,
)
from safedma.kernels.all_reduce import all_reduce, all_reduce_kernel
from safedma.kernels.gather import gather_pages, gather_pages_kernel
from safedma.kernels.pipeline import ChunkFn, pipeline, pipeline_kernel
from safedma.kernels.ppermute import ppermute, ppermute_kernel
from safedma.kernels.reduce_scatter import reduce_scatter, reduce_scatter_kernel

__all__ = [
    "ChunkFn",
    "all_gather",
    "all_gather_bidirectional",
    "all_gather_bidirectional_kernel",
    "all_gather_kernel",
    "all_reduce",
    "all_reduce_kernel",
    "gather_pages",
    "gather_pages_kernel",
    "pipeline",
    "pipeline_kernel",
    "ppermute",
    "ppermute_kernel",
    "reduce_scatter",
    "reduce_scatter_kernel",
]
