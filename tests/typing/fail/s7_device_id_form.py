"""S7: a device id of the wrong form (docs/catalogue.md): float, string, list, or a raw
pltpu device id where a safedma.Device belongs.

pltpu today is only partly annotated: a float device id runs in interpret
mode (silently truncated) and fails the Mosaic verifier. Each expected error is
the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import DataRef, RemoteCopy, SemRef


def wrong_index_types() -> None:
    # S7: a float index.
    safedma.device(x=1.0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.mesh_coords(0.5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S7: a string index.
    safedma.device(x="1")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.mesh_coords("0", 1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S7: a list where one index belongs.
    safedma.mesh_coords([0, 1])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S7: the same mistakes inside a {axis: index} dict.
    safedma.device({"x": 1.5})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-assignment]  # ty: ignore[invalid-argument-type]
    safedma.device({"x": [0]})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-assignment]  # ty: ignore[invalid-argument-type]
    # S7: a non-str axis name, and a float ring shift.
    safedma.device({0: 1})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-assignment]  # ty: ignore[invalid-argument-type]
    safedma.neighbour("x", 0.5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def raw_pltpu_ids_to_a_remote_copy(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    copy = RemoteCopy(x, o, recv).with_send_sem(send)
    # S7: pltpu's raw forms (a tuple, a dict, an int) are not a safedma.Device.
    copy.to((1,))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.to({"x": 1})  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.to(1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.to(1.0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.to("x")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S7: the axis name where the device belongs.
    copy.to(safedma.neighbour)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
