"""Mistakes seeded into shapes production kernels take (paged attention and grouped
matmuls): a page-group helper, zero-fill copies in a ``fori_loop`` body waited by size, a pytree
dataclass of scratch refs. Each expected error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, LocalCopy, SemArray, SemRef

T = TypeVar("T")


class PageGroup:
    def __init__(self, pages: DataRef, buf: DataRef, sem: SemRef, table: DataRef) -> None:
        self.copies = [LocalCopy(pages.at[table[i]], buf.at[i], sem) for i in range(2)]


def group_on_the_whole_array(pages: DataRef, buf: DataRef, sems: SemArray, table: DataRef) -> None:
    # S2: the double buffer's semaphore array where one slot belongs (no .at[slot]).
    PageGroup(pages, buf, sems, table)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def group_on_the_buffer(pages: DataRef, bufs: DataRef, sems: SemArray, table: DataRef) -> None:
    # S6: the buffer slot passed as the semaphore (arguments shifted by one).
    PageGroup(pages, bufs.at[0], bufs.at[1], table)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def zero_fill_priority_2(zero: DataRef, out: DataRef, sems: SemArray) -> None:
    def fill(i: jax.Array, total: jax.Array) -> jax.Array:
        # T4 (static): a third DMA queue does not exist.
        LocalCopy(src=zero, dst=out.at[pl.ds(i * 8, 8)], sem=sems.at[0]).start(priority=2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
        return total + 8

    del fill


def zero_fill_waited_on_the_array(out: DataRef, sems: SemArray, total: jax.Array) -> None:
    # S2: the wait by size on the whole semaphore array.
    safedma.wait_bytes(sems, out.at[pl.ds(0, total)])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


@dataclasses.dataclass(frozen=True)
class Metadata(Generic[T]):
    offsets: T
    sem: T


def copy_with_the_metadata_semaphore(x: DataRef, buf: DataRef, meta: Metadata[DataRef]) -> None:
    # S6: a data field of the pytree scratch used as the copy's semaphore.
    LocalCopy(x, buf, meta.sem).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
