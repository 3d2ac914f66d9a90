"""S-rows (docs/catalogue.md) in the shapes production kernels take: inside
helpers, containers of refs (dicts, tuples, lists, dataclasses), closures and partials.
Each expected error is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import safedma
from safedma import DataRef, LocalCopy, RegularSem, RemoteCopy, SemArray, SemRef


def send_to(src: DataRef, dst: DataRef, send: SemRef, recv: SemRef) -> None:
    RemoteCopy(src, dst, recv).with_send_sem(send).to(safedma.neighbour("x")).start()


def dict_of_the_wrong_kind(
    x: DataRef, o: DataRef, flags: Mapping[str, RegularSem], sems: Mapping[str, SemRef]
) -> None:
    # S3: a REGULAR semaphore from a dict of scratch, passed to a helper as a DMA one.
    send_to(x, o, flags["send"], sems["recv"])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def dict_of_arrays(
    x: DataRef, o: DataRef, arrays: Mapping[str, SemArray], sems: Mapping[str, SemRef]
) -> None:
    # S2: an array from a dict of scratch where one semaphore belongs (no .at[i]).
    send_to(x, o, arrays["send"], sems["recv"])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def value_in_a_tuple(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    pair = (send, safedma.read(recv))
    # S1: the tuple's second item is the receive semaphore's value.
    send_to(x, o, pair[0], pair[1])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


@dataclasses.dataclass(frozen=True)
class Stage:
    src: DataRef
    dst: DataRef
    sem: SemRef

    def copy(self) -> LocalCopy:
        return LocalCopy(self.src, self.dst, self.sem)


def dataclass_fields_swapped(x: DataRef, buf: DataRef, sem: SemRef) -> None:
    # S6: the semaphore and the destination swapped when the dataclass is built.
    Stage(src=x, dst=sem, sem=buf)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def copy_from_a_helper_waited(x: DataRef, buf: DataRef, sem: SemRef) -> None:
    stage = Stage(x, buf, sem)
    stage.copy().start()
    # S9: the copy a helper returns is a description: only a handle waits.
    stage.copy().wait()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def handle_from_a_list(x: DataRef, buf: DataRef, sem: SemRef) -> None:
    handles = [LocalCopy(x, buf, sem).start()]
    # S5: a local copy's handle, kept in a list, has no send side.
    handles[0].wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def builder_closure_without_send(x: DataRef, o: DataRef, recv: SemRef) -> None:
    def build() -> RemoteCopy[safedma.Missing, safedma.Given]:
        return RemoteCopy(x, o, recv).to(safedma.neighbour("x"))

    # S4: the closure's copy has no send semaphore; it cannot start.
    build().start()  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def priority_through_partial(x: DataRef, buf: DataRef, sem: SemRef) -> None:
    # T4: priority 2 through functools.partial.
    start = functools.partial(LocalCopy(x, buf, sem).start, priority=2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    start().wait()
