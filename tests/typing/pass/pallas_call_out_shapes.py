"""Pass: ``safedma.pallas_call`` takes every ``out_shape`` jax takes, with jax's options.

Found porting production kernels : an array as the output's shape
(``out_shape=(x, state)``), a list of outputs held in a variable (the call returns a
tuple, as jax does), a dict or dataclass pytree, and the ``debug`` / ``metadata`` options.

Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_type

import jax
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, SemRef

ShapeDtype: Callable[..., jax.ShapeDtypeStruct] = jax.ShapeDtypeStruct
ANY = pl.BlockSpec(memory_space=pl.ANY)


def two_outputs(
    x_ref: DataRef, s_ref: DataRef, o_ref: DataRef, t_ref: DataRef, sem: SemRef
) -> None:
    safedma.LocalCopy(x_ref, o_ref, sem).start().wait()
    safedma.LocalCopy(s_ref, t_ref, sem).start().wait()


def arrays_as_shapes(x: jax.Array, state: jax.Array) -> tuple[jax.Array, jax.Array]:
    call = safedma.pallas_call(
        two_outputs,
        (x, state),
        in_specs=[ANY, ANY],
        out_specs=(ANY, ANY),
        scratch_shapes=[safedma.dma_semaphore()],
        debug=False,
        metadata={"kind": "copy"},
    )
    assert_type(call, safedma.KernelCall[tuple[jax.Array, jax.Array]])
    out, new_state = call(x, state)
    return out, new_state


def list_of_outputs(x: jax.Array, state: jax.Array) -> jax.Array:
    shapes = [ShapeDtype(x.shape, x.dtype), ShapeDtype(state.shape, state.dtype)]
    outs = safedma.pallas_call(
        two_outputs,
        shapes,
        in_specs=[ANY, ANY],
        out_specs=[ANY, ANY],
        scratch_shapes=[safedma.dma_semaphore()],
    )(x, state)
    assert_type(outs, tuple[jax.Array, ...])
    return outs[0]


def one_array_as_shape(x: jax.Array, state: jax.Array) -> jax.Array:
    def body(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
        safedma.LocalCopy(x_ref, o_ref, sem).start().wait()

    call = safedma.pallas_call(
        body, x, in_specs=[ANY], out_specs=ANY, scratch_shapes=[safedma.dma_semaphore()]
    )
    assert_type(call, safedma.KernelCall[jax.Array])
    return call(x)


def dict_of_outputs(x: jax.Array, state: jax.Array) -> dict[str, jax.Array]:
    shapes = {"out": ShapeDtype(x.shape, x.dtype), "state": ShapeDtype(state.shape, state.dtype)}
    call = safedma.pallas_call(
        two_outputs,
        shapes,
        in_specs=[ANY, ANY],
        out_specs={"out": ANY, "state": ANY},
        scratch_shapes=[safedma.dma_semaphore()],
    )
    assert_type(call, safedma.KernelCall[Any])  # jax's own type for a pytree of outputs
    result: dict[str, jax.Array] = call(x, state)
    return result


def keyword_scratch(x_ref: DataRef, o_ref: DataRef, *, buf: DataRef, sem: SemRef) -> None:
    safedma.LocalCopy(x_ref, buf, sem).start().wait()
    safedma.LocalCopy(buf, o_ref, sem).start().wait()


def scratch_by_name(mesh: object, x: jax.Array) -> Any:
    """Scratch given as a dict (jax's keyword scratch), to ``core_kernel`` and ``pallas_call``."""
    scratch = {"buf": safedma.vmem(x.shape, x.dtype), "sem": safedma.dma_semaphore()}
    on_cores = safedma.core_kernel(keyword_scratch, x, mesh=mesh, scratch_types=scratch)
    plain = safedma.pallas_call(
        keyword_scratch, x, in_specs=[ANY], out_specs=ANY, scratch_shapes=scratch
    )
    return on_cores(x), plain(x)
