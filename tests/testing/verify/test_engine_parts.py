"""Unit tests of verify's engine parts: view regions, write coverage, the semaphore rule."""

from __future__ import annotations

import numpy as np
import pytest

from safedma.testing._verify.model.regions import (
    Buffer,
    Coverage,
    RegionError,
    flat_to_box,
    resolve,
)
from safedma.testing._verify.model.semantics import Machine


def _buf(shape: tuple[int, ...], itemsize: int = 4, sem: str | None = None) -> Buffer:
    return Buffer(1, 0, "b", shape, itemsize, "VMEM" if sem is None else "SEMAPHORE", sem)


def test_index_keeps_views_exact() -> None:
    view = resolve(_buf((32, 128)), [("index", (("slice", 8, 8, 1), ("slice", 0, 128, 1)))])
    assert view.box == ((8, 16), (0, 128)) and view.shape == (8, 128) and view.nbytes == 4096
    row = resolve(
        _buf((4, 8, 128)), [("index", (("int", 2, 1, 1), ("slice", 0, 8, 1), ("slice", 0, 128, 1)))]
    )
    assert row.box == ((2, 3), (0, 8), (0, 128)) and row.shape == (8, 128)


def test_whole_ref_reshape_and_bitcast_cover_the_buffer_exactly() -> None:
    buf = _buf((32, 128))
    assert resolve(buf, [("reshape", (4, 8, 128))]).box == buf.full_box()
    cast = resolve(buf, [("bitcast", 2)])
    assert cast.box == buf.full_box() and cast.nbytes == buf.nbytes
    part = resolve(
        buf,
        [
            ("reshape", (4, 8, 128)),
            ("index", (("int", 1, 1, 1), ("slice", 0, 8, 1), ("slice", 0, 128, 1))),
        ],
    )
    assert part.box == ((8, 16), (0, 128))


def test_flat_range_to_smallest_box() -> None:
    assert flat_to_box((4, 8), 8, 16) == ((1, 2), (0, 8))
    assert flat_to_box((4, 8), 4, 12) == ((0, 2), (0, 8))  # straddles rows: bounding box
    assert flat_to_box((4, 8), 9, 11) == ((1, 2), (1, 3))


def test_out_of_range_windows_are_errors() -> None:
    with pytest.raises(RegionError):
        resolve(_buf((2,), sem="DMA"), [("index", (("int", 2, 1, 1),))])
    with pytest.raises(RegionError):
        resolve(_buf((32, 128)), [("index", (("slice", 30, 8, 1), ("slice", 0, 128, 1)))])
    # a zero-size window (predication) at the end is fine
    assert resolve(_buf((32, 128)), [("index", (("slice", 32, 0, 1), ("slice", 0, 128, 1)))]).empty


def test_coverage_merges_slots_and_finds_holes() -> None:
    cov = Coverage()
    for start in (24, 8, 16):
        cov.add(((start, start + 8), (0, 128)))
    assert cov.covers(((8, 32), (0, 128))) and not cov.covers(((0, 32), (0, 128)))
    assert len(cov.boxes) == 1
    cov.add(((0, 8), (0, 64)))
    assert cov.covers(((0, 8), (0, 64))) and not cov.covers(((0, 8), (0, 128)))


def test_a_wait_guarantees_only_what_it_cannot_do_without() -> None:
    m = Machine(["a", "b", "c"])
    sem = m.sem(_buf((), sem="REGULAR"), 0)
    m.signal(1, sem, 1, "b:1")
    m.signal(2, sem, 1, "c:1")
    assert m.try_wait(0, sem, 1)  # either signal would do: neither is guaranteed
    assert m.clocks.rows[0, 1] == 0 and m.clocks.rows[0, 2] == 0  # learned neither
    assert len(sem.pending) == 2 and sem.credit == -1
    assert m.try_wait(0, sem, 1)  # now both are needed
    assert sem.pending == [] and sem.credit == 0
    assert m.clocks.rows[0, 1] >= 1 and m.clocks.rows[0, 2] >= 1
    assert not m.try_wait(0, sem, 1)  # nothing left: the wait blocks


def test_meet_of_pending_clocks_is_learned() -> None:
    m = Machine(["a", "b", "c"])
    sem = m.sem(_buf((), sem="REGULAR"), 0)
    m.clocks.rows[1, 2] = m.clocks.rows[2, 1] = 5  # b and c both know something of each other
    m.signal(1, sem, 1, "b")
    m.signal(2, sem, 1, "c")
    before = m.clocks.rows[0].copy()
    m.try_wait(0, sem, 1)
    # neither signal is guaranteed, but both senders had seen each other's first epoch
    assert np.all(m.clocks.rows[0] >= before)
    assert m.clocks.rows[0, 1] == 1 and m.clocks.rows[0, 2] == 1
