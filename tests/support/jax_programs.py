"""Programs for the verify tests that jax's interpreter cannot fully run, or that jax ships.

* DMA futures: one ``pallas_call`` starts a copy and returns the semaphore
  and the in-flight destination (aliased), a later one in the same jit waits
  it (the pattern of jax's tests/pallas/tpu_pallas_async_test.py and vLLM's
  KV transfer).
* An ``emit_pipeline`` kernel that also runs a manual DMA next to the
  pipeline.
* Small calls of the raw-pltpu kernels jax ships (paged attention, ragged
  paged attention, all-gather), imported from the installed package at run
  time; their code is never copied here.
* :class:`DropWait`: a stand-in for a kernel module's ``pltpu`` that drops one
  DMA wait at trace time, to seed a bug into a kernel we do not own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ANY = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)
Future = tuple[jax.Array, jax.Array]


# ------------------------------------------------------------------ DMA futures


def _start_kernel(x_ref: Any, aliased_x: Any, o_ref: Any, sem: Any) -> None:
    del aliased_x  # x stays alive (and unwritten by XLA) until the copy is waited
    pltpu.make_async_copy(x_ref, o_ref, sem).start()


def _done_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o: Any) -> None:
    del aliased_o
    pltpu.make_async_copy(x_ref, o_ref, sem).wait()


def _done_without_wait_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o: Any) -> None:
    del x_ref, o_ref, sem, aliased_o  # seeded bug: the future is never waited


def copy_start(x: jax.Array) -> tuple[jax.Array, Future]:
    """Start copying ``x``; returns ``x`` (aliased, still being read) and the future."""
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    x, out, sem = pl.pallas_call(
        _start_kernel,
        out_shape=(shape, shape, pltpu.SemaphoreType.DMA(())),
        in_specs=[ANY],
        out_specs=(ANY, ANY, SEM),
        input_output_aliases={0: 0},
    )(x)
    return x, (out, sem)


def copy_done(x: jax.Array, future: Future, *, wait: bool = True) -> jax.Array:
    """Wait the future of ``copy_start(x)``; returns the copy (aliased to the in-flight buffer)."""
    out, sem = future
    kernel = _done_kernel if wait else _done_without_wait_kernel
    result: jax.Array = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[ANY, ANY, SEM],
        out_specs=ANY,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return result


def futures(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Two copies in flight across kernel boundaries, waited in a later kernel each."""
    x, first = copy_start(x)
    x2, second = copy_start(x)
    return copy_done(x, first), copy_done(x2, second)


def futures_never_waited(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Seeded bug: the second future's done kernel forgets its wait."""
    x, first = copy_start(x)
    x2, second = copy_start(x)
    return copy_done(x, first), copy_done(x2, second, wait=False)


# ------------------------------------------------------------------ emit_pipeline


def _double(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] * 2.0


def _pipeline_with_side_copy(
    x_hbm: Any, o_hbm: Any, side_hbm: Any, sem: Any, *, side_into_output: bool
) -> None:
    rows = x_hbm.shape[0]
    block = pl.BlockSpec((8, x_hbm.shape[1]), lambda i: (i, 0))
    # A manual DMA runs next to the pipeline: into its own output (fine), or,
    # seeded bug, into the output the pipeline is writing.
    side = pltpu.make_async_copy(x_hbm, o_hbm if side_into_output else side_hbm, sem)
    side.start()
    pltpu.emit_pipeline(_double, grid=(rows // 8,), in_specs=[block], out_specs=[block])(
        x_hbm, o_hbm
    )
    side.wait()
    if side_into_output:
        # The side output still has to be written: copy it from x, done in place.
        again = pltpu.make_async_copy(x_hbm, side_hbm, sem)
        again.start()
        again.wait()


def emit_pipeline_call(x: jax.Array, *, seeded_race: bool = False) -> tuple[jax.Array, jax.Array]:
    """``(x * 2, x)``: the doubling through emit_pipeline, ``x`` through a manual DMA."""
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    kernel = functools.partial(_pipeline_with_side_copy, side_into_output=seeded_race)
    doubled, side = pl.pallas_call(
        kernel,
        out_shape=(shape, shape),
        in_specs=[ANY],
        out_specs=(ANY, ANY),
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
    )(x)
    return doubled, side


# ------------------------------------------------------------------ seeding bugs


class DropWait:
    """``pltpu`` with the ``drop``-th DMA ``wait()`` traced through it (from 0) left out.

    Install it as a kernel module's ``pltpu`` (``monkeypatch.setattr(module,
    "pltpu", DropWait(pltpu, 0))``); everything else passes through.
    """

    def __init__(self, real: Any, drop: int) -> None:
        self._real = real
        self._drop = drop
        self.waits = 0
        self.dropped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _wrap(self, descriptor: Any) -> Any:
        return _Descriptor(descriptor, self)

    def make_async_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.make_async_copy(*args, **kwargs))

    def make_async_remote_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.make_async_remote_copy(*args, **kwargs))

    def async_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.async_copy(*args, **kwargs))

    def async_remote_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.async_remote_copy(*args, **kwargs))

    def take(self) -> bool:
        """Count one wait; True if it is the one to drop."""
        index = self.waits
        self.waits += 1
        if index == self._drop:
            self.dropped = True
            return True
        return False


class _Descriptor:
    def __init__(self, real: Any, owner: DropWait) -> None:
        self._real = real
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def start(self, *args: Any, **kwargs: Any) -> Any:
        self._real.start(*args, **kwargs)
        return self

    def wait(self) -> Any:
        if self._owner.take():
            return None
        return self._real.wait()


# ------------------------------------------------------------------ jax's kernels, small


def paged_attention_inputs() -> tuple[jax.Array, ...]:
    """q, k_pages, v_pages, lengths, page_indices: 2 sequences, 4 pages of 16 each."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((2, 8, 128)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 8, 16, 128)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 8, 16, 128)), jnp.float32)
    lengths = jnp.array([40, 64], jnp.int32)
    indices = jnp.array([[3, 1, 0, 5], [2, 4, 6, 7]], jnp.int32)
    return q, k, v, lengths, indices


def unjitted(fn: Any) -> Any:
    """The Python function behind a ``jax.jit``: each call traces afresh, so a bug seeded
    into its module after an earlier trace is not hidden by jit's cache."""
    return getattr(fn, "__wrapped__", fn)


def paged_attention_fn() -> Callable[..., jax.Array]:
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as pa

    return functools.partial(unjitted(pa.paged_attention), pages_per_compute_block=2)


def ragged_paged_attention_inputs() -> tuple[jax.Array, ...]:
    """q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs: 2 sequences of 8 queries."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((16, 8, 128)), jnp.float32)
    kv = jnp.asarray(rng.standard_normal((8, 16, 2, 128)), jnp.float32)
    kv_lens = jnp.array([20, 40], jnp.int32)
    indices = jnp.array([[3, 1, 0, 5], [2, 4, 6, 7]], jnp.int32)
    cu_q_lens = jnp.array([0, 8, 16], jnp.int32)
    num_seqs = jnp.array([2], jnp.int32)
    return q, kv, kv_lens, indices, cu_q_lens, num_seqs


def ragged_paged_attention_fn() -> Callable[..., jax.Array]:
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    return functools.partial(
        unjitted(rpa.ragged_paged_attention), num_kv_pages_per_block=2, num_queries_per_block=8
    )
