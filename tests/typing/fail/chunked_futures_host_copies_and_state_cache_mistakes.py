"""Mistakes seeded into shapes production kernels take (vLLM tpu-inference): a
chunked copy as a DMA future, a copy to host memory, a state cache double-buffered across
pipeline steps, a SparseCore histogram. Each expected error is the ``# type: ignore[code]``
on its line.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, SemArray, SemRef


def chunk_waited_on_its_description(
    src: DataRef, dst: DataRef, sizes: DataRef, sem: SemRef, i: jax.Array
) -> None:
    # S9: the wait kernel waits the rebuilt chunk without started_elsewhere().
    copy = safedma.LocalCopy(src.at[pl.ds(0, sizes[i])], dst.at[pl.ds(0, sizes[i])], sem)
    copy.wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def chunk_on_a_table_value(src: DataRef, dst: DataRef, sizes: DataRef, i: jax.Array) -> None:
    # S1: a value read from the scalar-prefetched table where the semaphore belongs.
    safedma.LocalCopy(src, dst, sizes[i]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def host_copy_scoped_on_a_buffer(src: DataRef, host: DataRef) -> None:
    def body(sem: SemRef) -> None:
        safedma.LocalCopy(src, host, sem).start().wait()

    # S6: a VMEM buffer scoped where the body takes its semaphore.
    safedma.run_scoped(body, safedma.vmem((8, 128), src.dtype))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def block_waited_on_the_whole_array(bufs: DataRef, lsems: SemArray, n: jax.Array) -> None:
    # S2: the current block waited by size on the semaphore array, not its slot.
    safedma.wait_bytes(lsems, bufs.at[0, pl.ds(0, n)])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def row_prefetched_on_the_whole_array(state: DataRef, bufs: DataRef, lsems: SemArray) -> None:
    # S2: a row prefetched on the semaphore array (the slot, .at[nxt], forgotten).
    safedma.LocalCopy(state.at[pl.ds(0, 1)], bufs.at[1, pl.ds(0, 1)], lsems).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def zero_fill_waited_on_a_send_side(zeros: DataRef, shared: DataRef, sem: SemRef) -> None:
    # S5: the zero fill (a local copy) waited as if it were a remote send.
    safedma.LocalCopy(zeros, shared, sem).started_elsewhere().wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
