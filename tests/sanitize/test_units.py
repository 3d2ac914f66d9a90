"""What a wait needs the semaphore to hold, per backend: the chip rule measured on a v5e
(units of 32 bytes, lane dimension padded to 128 elements), bytes in jax's TPU
interpreter, elements in its generic interpreter; a lower bound outside the measured
shapes."""

from __future__ import annotations

import pytest

from safedma._sanitize._units import Backend, amount, exact_on_chip

CHIP = Backend.CHIP

# (shape, itemsize, count read on the chip after the copy landed)
MEASURED = [
    ((8, 128), 4, 128),
    ((1, 128), 4, 16),
    ((3, 128), 4, 48),
    ((8, 64), 4, 128),
    ((8, 130), 4, 256),
    ((8, 256), 2, 128),
    ((16, 128), 2, 128),
    ((32, 128), 1, 128),
    ((2, 8, 128), 4, 256),
    ((4096, 1024), 4, 524288),
    ((7,), 4, 16),
    ((16,), 4, 16),
    ((128,), 4, 16),
]


@pytest.mark.parametrize(("shape", "itemsize", "count"), MEASURED)
def test_the_chip_rule_gives_the_measured_counts(
    shape: tuple[int, ...], itemsize: int, count: int
) -> None:
    assert exact_on_chip(shape, itemsize, remote=False)
    assert amount(shape, itemsize, CHIP, remote=False) == count


@pytest.mark.parametrize(
    ("shape", "itemsize"), [((8, 64), 2), ((4, 100), 1), ((3,), 8), ((), 4), ((5, 7), 2)]
)
def test_outside_the_measured_shapes_a_lower_bound(shape: tuple[int, ...], itemsize: int) -> None:
    assert not exact_on_chip(shape, itemsize, remote=False)
    size = itemsize
    for d in shape:
        size *= d
    got = amount(shape, itemsize, CHIP, remote=False)
    # never more than the unpadded bytes in 32-byte units (padding only adds), never 0
    assert 1 <= got <= max(1, size // 32)


def test_a_remote_copy_waits_for_any_count_on_the_chip() -> None:
    assert amount((8, 128), 4, CHIP, remote=True) == 1
    assert not exact_on_chip((8, 128), 4, remote=True)


def test_interpreters_count_bytes_and_elements() -> None:
    assert amount((8, 64), 2, Backend.TPU_INTERPRET, remote=True) == 8 * 64 * 2
    assert amount((8, 64), 2, Backend.HLO_INTERPRET, remote=False) == 8 * 64


def test_an_empty_copy_needs_nothing() -> None:
    assert amount((0, 128), 4, CHIP, remote=False) == 0
