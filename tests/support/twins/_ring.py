"""Raw-pltpu pieces the twins share, as safedma/kernels/_ring.py and _call.py are for the
library's kernels: the pallas_call with the input in HBM, a neighbour's device id, and
one ring direction's credit-based flow control. Each is a plain pltpu call, in the
order the library's kernels make theirs, so each twin still lowers to its kernel's
Mosaic (tests/kernels/test_identity.py and the kernels' twin tests check it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HBM = pl.BlockSpec(memory_space=pl.ANY)
RECV_SLOTS = 2


def hbm_call(
    kernel: Callable[..., None],
    out_shape: jax.ShapeDtypeStruct,
    *,
    scratch_shapes: Sequence[Any],
    name: str,
    interpret: Any,
    collective_id: int | None = None,
    out_specs: Any = HBM,
    **params: Any,
) -> Callable[[jax.Array], jax.Array]:
    """``pl.pallas_call`` of ``kernel`` with ``params`` bound (its name kept), input in HBM."""
    body = functools.update_wrapper(functools.partial(kernel, **params), kernel)
    call: Callable[[jax.Array], jax.Array] = pl.pallas_call(
        body,
        out_shape=out_shape,
        in_specs=[HBM],
        out_specs=out_specs,
        scratch_shapes=list(scratch_shapes),
        compiler_params=None
        if collective_id is None
        else pltpu.CompilerParams(collective_id=collective_id),
        interpret=interpret,
        name=name,
    )
    return call


def neighbour(axis: str, shift: int) -> dict[str, Any]:
    """The device ``shift`` steps along ``axis``; reads the axis index each time, as
    ``safedma.neighbour`` does."""
    n = jax.lax.axis_size(axis)
    return {axis: (jax.lax.axis_index(axis) + shift % n) % n}


def send(
    src: Any, dst: Any, step: Any, *, downstream: Any, send_sem: Any, recv_sems: Any, capacity: Any
) -> Any:
    """Start step ``step``'s copy downstream once a receive slot is free there."""

    @pl.when(step >= RECV_SLOTS)
    def _() -> None:
        pl.semaphore_wait(capacity, 1)

    copy = pltpu.make_async_remote_copy(
        src, dst, send_sem, recv_sems.at[step % RECV_SLOTS], device_id=downstream
    )
    copy.start()
    return copy


def received(step: Any, steps: int, *, upstream: Any, capacity: Any) -> None:
    """Hand the slot of incoming step ``step`` back upstream, if a later step reuses it."""

    @pl.when(step + RECV_SLOTS < steps)
    def _() -> None:
        pl.semaphore_signal(capacity, 1, device_id=upstream)
