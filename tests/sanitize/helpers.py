"""Set-ups shared by the sanitizer tests: sanitized calls, raw kernels routed through
``sd.pallas_call``, meshes of simulated devices."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import safedma as sd
from safedma.testing import simulated_mesh

HBM = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32

#: Catching tests: a hang is reported after 100 polls (each at most about 1 ms in
#: interpret mode when the count does not move).
QUICK = sd.SanitizeOptions(polls=100)
#: No-false-alarm tests: the default bound, what a user gets.
DEFAULT = sd.SanitizeOptions()


def interpret(mode: str = "eager") -> pltpu.InterpretParams:
    return pltpu.InterpretParams(dma_execution_mode=mode)


def example(shape: tuple[int, ...], dtype: Any = F32) -> jax.Array:
    size = 1
    for d in shape:
        size *= d
    return jnp.arange(size, dtype=F32).reshape(shape).astype(dtype)


def hbm_call(
    kernel: Callable[..., None],
    scratch: Sequence[object],
    *,
    sanitize: object = QUICK,
    mode: str | None = "eager",
    **options: Any,
) -> Callable[[jax.Array], jax.Array]:
    """``kernel(x_hbm, o_hbm, *scratch)`` through ``sd.pallas_call``, sanitized, interpreted
    in DMA execution ``mode`` (``None``: compiled for the chip, to read its Mosaic text)."""

    def call(x: jax.Array) -> jax.Array:
        result: jax.Array = sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=list(scratch),
            interpret=None if mode is None else interpret(mode),
            sanitize=sanitize,  # type: ignore[typeddict-item]
            **options,
        )(x)
        return result

    return call


@contextlib.contextmanager
def raw_calls_sanitized(
    monkeypatch: pytest.MonkeyPatch, sanitize: sd.SanitizeOptions = DEFAULT
) -> Iterator[None]:
    """Every ``pl.pallas_call`` of a raw kernel in the block runs through
    ``sd.pallas_call(..., sanitize=sanitize)``, as a user who switches to it would
    (jax's own kernels included: they call ``pl.pallas_call`` through the module)."""
    original = pl.pallas_call

    def routed(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(kernel, "__safedma_kernel__", False):  # sd.pallas_call's own call
            return original(kernel, *args, **kwargs)
        if "out_shape" in kwargs:
            out_shape, rest = kwargs.pop("out_shape"), args
        else:
            out_shape, *rest = args
        assert not rest, "positional pallas_call options beyond out_shape"
        return sd.pallas_call(kernel, out_shape, sanitize=sanitize, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(pl, "pallas_call", routed)
        yield


def on_mesh(per_device: Callable[..., Any], devices: int, axis: str = "x") -> Callable[..., Any]:
    """``per_device`` under ``jax.jit(shard_map)`` over ``devices`` simulated CPU devices,
    every argument and result split along ``axis``."""
    mesh = simulated_mesh(devices, axis)
    mapped = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False)
    )
    sharding = NamedSharding(mesh, P(axis))

    def run(*args: jax.Array) -> Any:
        return mapped(*(jax.device_put(a, sharding) for a in args))

    return run


def settle() -> None:
    """Take the error a failed effectful computation left for the next one (jax hands it
    on once), so the next test starts clean; ``sd.sanitizer_errors`` does this itself."""
    from safedma._sanitize._jax import forget_failed_effects

    forget_failed_effects()


def run_times(trips: int, operation: Callable[[], object]) -> None:
    """Run ``operation`` ``trips`` times in a ``lax.while_loop``: to the trace-time
    checks a while loop's trip count is a traced value (any number, none included), so
    a mistake written inside one is not provable before a run, and it reaches the
    sanitizer at run time instead of being refused first. (A ``fori_loop`` with
    constant bounds is a ``scan`` of known length, which the checks count.)"""

    def step(k: Any) -> Any:
        operation()
        return k + 1

    jax.lax.while_loop(lambda k: k < trips, step, jnp.int32(0))


def past_the_trace_checks(operation: Callable[[], object]) -> None:
    """Run ``operation`` once, where the trace-time checks cannot count it
    (:func:`run_times`)."""
    run_times(1, operation)


def started_never_waited(copy: Any) -> None:
    """Start ``copy`` and never wait it, in a way only a run can tell: its one wait sits
    in a loop of zero iterations (:func:`run_times`)."""
    copy.start()
    run_times(0, copy.wait)
