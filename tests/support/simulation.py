"""Helpers shared by the tests of safedma.testing.simulate: kernels in HBM, a clean ring, thread checks."""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from safedma.testing import simulate, simulated_mesh

HBM = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
BLOCK = (8, 128)  # per-device block: 4096 bytes of f32
BLOCK_BYTES = 8 * 128 * 4
SHORT = 2.0  # timeout_s of the tests that must time out
Kernel = Callable[..., None]


def hbm_call(
    kernel: Kernel,
    scratch: Sequence[Any],
    *,
    interpret: object = None,
    collective_id: int | None = None,
) -> Callable[[jax.Array], jax.Array]:
    """``kernel(x_ref, o_ref, *scratch)`` with x and o in HBM, as a function of x."""
    extra: dict[str, Any] = {}
    if interpret is not None:
        extra["interpret"] = interpret
    if collective_id is not None:
        extra["compiler_params"] = pltpu.CompilerParams(collective_id=collective_id)

    def call(x: jax.Array) -> jax.Array:
        out: jax.Array = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=list(scratch),
            **extra,
        )(x)
        return out

    return call


def dma(n: int = 1) -> list[object]:
    return [pltpu.SemaphoreType.DMA(()) for _ in range(n)]


def line_of(fn: Callable[..., Any], text: str) -> str:
    """``path:line`` of the first line of ``fn``'s source containing ``text``: the user
    line an error about ``fn`` must name."""
    lines, first = inspect.getsourcelines(fn)
    for offset, line in enumerate(lines):
        if text in line:
            return f"{inspect.getsourcefile(fn)}:{first + offset}"
    raise AssertionError(f"{text!r} not in {fn.__name__}")


def example(shape: tuple[int, ...]) -> jax.Array:
    return jnp.arange(int(np.prod(shape)), dtype=F32).reshape(shape)


def ring_kernel(axis: str = "x", names: Sequence[str] = ("x",)) -> Kernel:
    """Send this device's block to the next device along ``axis`` (dict device id)."""

    def kernel(x_ref: Any, o_ref: Any, send: Any, recv: Any) -> None:
        target: Any = {
            n: (jax.lax.axis_index(n) + 1) % jax.lax.axis_size(n)
            if n == axis
            else jax.lax.axis_index(n)
            for n in names
        }
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=target)
        copy.start()
        copy.wait()

    return kernel


def run_ring(mesh: Mesh, axis: str = "x") -> None:
    """A clean ring permute along ``axis``; checks the result."""
    shape = (
        tuple(b * s for b, s in zip(BLOCK, mesh.devices.shape))
        if mesh.devices.ndim == 2
        else (BLOCK[0] * mesh.devices.size, BLOCK[1])
    )
    x = example(shape)
    spec = P(*mesh.axis_names)
    kernel = ring_kernel(axis, tuple(str(n) for n in mesh.axis_names))
    out = simulate(hbm_call(kernel, dma(2)), x, mesh=mesh, in_specs=spec, out_specs=spec)
    dim = list(mesh.axis_names).index(axis)
    np.testing.assert_array_equal(np.asarray(out), np.roll(np.asarray(x), BLOCK[dim], axis=dim))


def assert_clean_afterwards() -> None:
    """A clean kernel runs fine right after a failing one: the state was reset."""
    run_ring(simulated_mesh(4, "x"))


def interpreter_frames() -> list[str]:
    """Threads (other than this one) currently inside TPU interpret mode."""
    busy = []
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        f: Any = frame
        while f is not None:
            if "pallas/mosaic/interpret" in f.f_code.co_filename.replace("\\", "/"):
                busy.append(f"thread {ident}: {f.f_code.co_name}")
                break
            f = f.f_back
    return busy


def python_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}


def threads_left_behind(before: set[threading.Thread], wait_s: float = 5.0) -> str | None:
    """None once no thread is in the interpreter and no new thread lives; else what is left."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = interpreter_frames()
        workers = [t for t in threading.enumerate() if t.name == "safedma-simulate"]
        new = python_threads() - before
        if not busy and not workers and not new:
            return None
        if time.monotonic() >= deadline:
            return f"interpreter {busy}, workers {workers}, new {new}"
        time.sleep(0.05)


def spin(buf: Any, steps: Any) -> None:
    """Busy work through the interpreter: each step is an interpreted load and store."""

    def body(i: Any, carry: Any) -> Any:
        buf[...] = buf[...] + 1.0
        return carry

    jax.lax.fori_loop(0, steps, body, 0)


def slow_sender(steps: int) -> Callable[..., None]:
    """Device 0 computes for ``steps`` before it sends; the others wait for its copy."""

    def kernel(x_ref: Any, o_ref: Any, buf: Any, send: Any, recv: Any) -> None:
        me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id={"x": (me + 1) % n})

        @pl.when(me == 0)
        def _() -> None:
            spin(buf, steps)

        copy.start()
        copy.wait()  # device 1 waits here until device 0 is done computing

    return kernel


def slow_scratch() -> list[Any]:
    return [pltpu.VMEM(BLOCK, F32), *dma(2)]


def over_signalled_barrier(x_ref: Any, o_ref: Any, sem: Any) -> None:
    """Device i signals device i + 1's barrier twice and waits it once: one left over."""
    barrier = pltpu.get_barrier_semaphore()
    me, n = jax.lax.axis_index("x"), jax.lax.axis_size("x")
    pl.semaphore_signal(barrier, 2, device_id={"x": (me + 1) % n})
    pl.semaphore_wait(barrier, 1)  # one signal too many
    copy = pltpu.make_async_copy(x_ref, o_ref, sem)
    copy.start()
    copy.wait()
