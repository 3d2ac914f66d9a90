"""Device ids (``safedma/_devices.py``): a LOGICAL id built by safedma lowers without
jax's ``device_id_type`` deprecation warning. Copies and signals to logical ids against
their raw twins: tests/corpus/ring_collectives.py and tests/corpus/barriers.py."""

from __future__ import annotations

import warnings

import safedma as sd
from tests.corpus._calls import X_SHARDED, mesh_call, trace
from tests.corpus.ring_collectives import logical_send


def test_safedma_logical_ids_raise_no_jax_deprecation_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(mesh_call(logical_send, [sd.dma_semaphore(), sd.dma_semaphore()]), X_SHARDED)
