"""Whether jax runs an ``io_callback`` inside the mesh of the thread that dispatched it.

jax's TPU interpreter runs each simulated device's kernel through ``io_callback``s. In
jax 0.10 and 0.11 the callback runs under the dispatching thread's mesh, and with 8 or
more simulated devices and a buffer of 100 KiB or more per device the devices' threads
hang copying the callback's arguments (measured on 0.10.2: 8 devices at 99 KiB run, at
100 KiB never finish). jax 0.12 runs callbacks outside that mesh and does not hang.
simulate refuses the hanging case up front rather than waiting for its timeout; this
probe decides it by what jax does, not by its version number, so that any jax release
is judged by its behaviour. Public jax only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

import jax
from jax.experimental import io_callback

__all__ = ["callbacks_run_in_the_callers_mesh"]


@functools.cache
def callbacks_run_in_the_callers_mesh() -> bool:
    """True when an ``io_callback`` sees the mesh its caller set (jax 0.10 and 0.11)."""
    seen: list[bool] = []

    def callback(value: object) -> None:
        del value
        seen.append(not jax.sharding.get_abstract_mesh().empty)

    def program(value: Any) -> Any:
        return io_callback(callback, None, value)

    # getattr: parts of these are unannotated in jax, and only their results matter here.
    make_mesh: Callable[..., Any] = getattr(jax, "make_mesh")
    devices: Callable[..., list[Any]] = getattr(jax, "devices")
    jit: Callable[..., Callable[..., Any]] = getattr(jax, "jit")
    mesh = make_mesh((1,), ("callback_probe",), devices=devices("cpu")[:1])
    with jax.set_mesh(mesh):
        jit(program)(np.zeros((1,), np.int32))
    return bool(seen and seen[0])
