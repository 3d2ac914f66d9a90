"""Property tests: verify over ring sizes, shifts and chunk counts.

Clean kernels stay clean on every ring (device-free meshes, so rings far
beyond the 8 CPU devices are cheap); the same kernel with one wait dropped
or one receive waited on the next semaphore slot is always caught, with the
device named. Bounded: a few dozen examples each, no example database.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

import safedma.kernels as sk
from safedma.testing import SimulationError, abstract_mesh
from safedma.testing import verify as verify_program
from tests.corpus.ring_collectives import chunked_ring_program

BOUNDED = settings(
    max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
ROWS_PER_CHUNK = 8
HBM = pl.BlockSpec(memory_space=pl.ANY)


def verify(fn: Any, n: int, block: tuple[int, int]) -> Any:
    x = jax.ShapeDtypeStruct((block[0] * n, block[1]), jnp.float32)
    return verify_program(
        fn, x, mesh=abstract_mesh((n,), ("x",)), in_specs=P("x"), out_specs=P("x")
    )


def chunked(shift: int, chunks: int, slots: int, **bug: int) -> Any:
    return chunked_ring_program(shift, chunks, slots, **bug)


rings = st.integers(2, 16)


def assert_clean(report: Any, devices: int) -> None:
    """A report of a clean proof over every device of the ring, with its kernel."""
    assert report.devices == devices and report.kernels, report


@BOUNDED
@given(n=rings, shift=st.integers(-20, 20), chunks=st.integers(1, 6), slots=st.integers(1, 3))
def test_a_chunked_ring_is_clean_for_every_size_shift_and_chunk_count(
    n: int, shift: int, chunks: int, slots: int
) -> None:
    assert_clean(verify(chunked(shift, chunks, slots), n, (chunks * ROWS_PER_CHUNK, 128)), n)


@BOUNDED
@given(
    n=rings,
    shift=st.integers(-20, 20),
    chunks=st.integers(1, 6),
    slots=st.integers(1, 3),
    data=st.data(),
)
def test_a_dropped_wait_is_always_caught(
    n: int, shift: int, chunks: int, slots: int, data: st.DataObject
) -> None:
    drop = data.draw(st.integers(0, chunks - 1), label="drop")
    with pytest.raises(Exception) as caught:
        verify(chunked(shift, chunks, slots, drop=drop), n, (chunks * ROWS_PER_CHUNK, 128))
    assert isinstance(caught.value, SimulationError), repr(caught.value)
    assert "x=" in str(caught.value), str(caught.value)


@BOUNDED
@given(
    n=rings,
    shift=st.integers(-20, 20),
    chunks=st.integers(1, 6),
    slots=st.integers(2, 3),
    data=st.data(),
)
def test_a_receive_waited_on_the_next_slot_is_always_caught(
    n: int, shift: int, chunks: int, slots: int, data: st.DataObject
) -> None:
    shifted = data.draw(st.integers(0, chunks - 1), label="shifted")
    with pytest.raises(Exception) as caught:
        verify(chunked(shift, chunks, slots, shifted=shifted), n, (chunks * ROWS_PER_CHUNK, 128))
    assert isinstance(caught.value, SimulationError), repr(caught.value)
    assert "x=" in str(caught.value), str(caught.value)


@BOUNDED
@given(n=rings, shift=st.integers(-20, 20), barrier=st.booleans())
def test_safedma_ppermute_is_clean_for_every_ring_and_shift(
    n: int, shift: int, barrier: bool
) -> None:
    fn = functools.partial(sk.ppermute, axis="x", shift=shift, collective_id=0 if barrier else None)
    assert_clean(verify(fn, n, (8, 128)), n)


@settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    n=rings,
    kind=st.sampled_from(
        [
            "all_gather",
            "all_gather_bidirectional",
            "reduce_scatter",
            "all_reduce",
            "all_reduce_composed",
        ]
    ),
    chunk_rows=st.sampled_from([8, 16]),
)
def test_safedma_collectives_are_clean_for_every_ring(n: int, kind: str, chunk_rows: int) -> None:
    if kind == "all_gather":
        fn: Any = functools.partial(sk.all_gather, axis="x")
        block = (chunk_rows, 128)
    elif kind == "all_gather_bidirectional":
        fn = functools.partial(sk.all_gather_bidirectional, axis="x")
        block = (2 * chunk_rows, 128)
    else:
        make: Any = {
            "reduce_scatter": sk.reduce_scatter,
            "all_reduce": sk.all_reduce,
            "all_reduce_composed": functools.partial(sk.all_reduce, fused=False),
        }[kind]
        fn = functools.partial(make, axis="x")
        block = (n * chunk_rows, 128)
    assert_clean(verify(fn, n, block), n)
