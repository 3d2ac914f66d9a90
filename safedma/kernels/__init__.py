"""Typed, documented collective and pipeline kernels written with safedma.

Each kernel module exposes a per-device function to call inside
``jax.shard_map`` (or directly, for the single-device kernels) and the kernel
body itself, for reading or copying. See each module's docstring for what the
kernel does, its preconditions, the semaphores it needs and how its messages
flow.
"""

from safedma.kernels.gather import gather_pages, gather_pages_kernel
from safedma.kernels.pipeline import ChunkFn, pipeline, pipeline_kernel

__all__ = ["ChunkFn", "gather_pages", "gather_pages_kernel", "pipeline", "pipeline_kernel"]
