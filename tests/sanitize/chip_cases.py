"""The on-chip cases of test_on_chip.py, one per process: ``python -m tests.sanitize.chip_cases NAME``.

Each case runs sanitized kernels on the TPU and prints one JSON line, ``{"case", "ok",
"detail", "seconds"}``; the test runs each in its own process under a timeout, so a
mistake (a hang the sanitizer let through, a crashed chip) can never hold the chip or
the test session. Without a TPU a case prints ``{"case", "no_tpu": true, "platform"}``.
Every risky kernel here is sanitized: none would hang without the sanitizer in a way
that is not bounded by it.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.sanitize.helpers import past_the_trace_checks, started_never_waited

HBM = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
#: Hangs are reported after half a second of spinning on the chip (about 4 * 10^7 polls).
QUICK = sd.SanitizeOptions(hang_after_s=0.5)
#: ``--interpret``: run the cases in TPU interpret mode on the CPU (to check the cases
#: themselves without a chip; counts are then bytes, not DMA units).
INTERPRETED: list[bool] = [False]


def _units(chip: str, interpreted: str) -> str:
    return interpreted if INTERPRETED[0] else chip


def _call(
    kernel: Callable[..., None], shape: tuple[int, ...], scratch: list[Any], **kw: Any
) -> Any:
    def run(x: jax.Array) -> jax.Array:
        out: jax.Array = sd.pallas_call(
            kernel,
            jax.ShapeDtypeStruct(shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
            sanitize=kw.pop("sanitize", QUICK),
            **kw,
        )(x)
        return out

    return run


def _x(shape: tuple[int, ...] = (64, 128), dtype: Any = F32) -> jax.Array:
    size = int(np.prod(shape))
    return jnp.arange(size, dtype=F32).reshape(shape).astype(dtype)


def _copy_through(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    copy = pltpu.make_async_copy(buf, o_hbm, sem)
    copy.start()
    copy.wait()


def _expect(error: type[BaseException], run: Callable[[], object], *needles: str) -> str:
    try:
        jax.block_until_ready(run())
    except error as caught:
        text = str(caught)
        missing = [n for n in needles if n not in text]
        if missing:
            raise AssertionError(f"{error.__name__} without {missing}: {text}") from caught
        return text.splitlines()[0][:300]
    raise AssertionError(f"no {error.__name__} raised")


def _still_works() -> None:
    """A clean kernel after a reported mistake: the chip is usable."""
    x = _x()
    out = _call(_copy_through, x.shape, [pltpu.VMEM(x.shape, F32), pltpu.SemaphoreType.DMA(())])(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


# ---------------------------------------------------------------- cases


def case_clean() -> str:
    """Correct kernels: right results, nothing reported, eagerly and under jit."""
    from benchmarks import tpu_kernels
    from safedma.kernels import gather_pages, pipeline

    x = _x((4096, 128))
    got = jax.jit(lambda v: pipeline(v, lambda c: c * 2.0 + 1.0, chunk_rows=256))(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x) * 2.0 + 1.0)
    pages = _x((16, 8, 128))
    idx = jnp.array([3, 0, 15, 7, 7, 1], jnp.int32)
    got = gather_pages(pages, idx)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(pages)[np.asarray(idx)])
    got = jax.jit(lambda v: tpu_kernels.hbm_to_vmem(v, repeats=3))(x)
    rows = tpu_kernels.chunk_rows(x.shape[0] * tpu_kernels.ROW_BYTES)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x)[-rows:])
    return "pipeline, gather_pages, hbm_to_vmem: clean and correct"


def _waits_never_started(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    past_the_trace_checks(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem).wait)


def case_hang_dma() -> str:
    """A DMA wait with no copy: reported after the bound, the kernel returns."""
    from safedma.testing import DeadlockError

    x = _x()
    call = _call(
        _waits_never_started, x.shape, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())]
    )
    started = time.perf_counter()
    text = _expect(
        DeadlockError,
        lambda: call(x),
        "DMA semaphore sem",
        _units("for 128 DMA units", "for 4096 bytes"),
    )
    took = time.perf_counter() - started
    if took > 60:
        raise AssertionError(f"the hang took {took:.1f} s to report, bound 0.5 s")
    _still_works()
    return f"{text} (reported after {took:.2f} s)"


def _regular_never_signalled(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_wait(reg, 1)


def case_hang_regular_under_jit() -> str:
    """A REGULAR wait nothing signals, under jit: the host callback, then sanitizer_errors."""
    from safedma.testing import DeadlockError

    x = _x()
    call = jax.jit(_call(_regular_never_signalled, x.shape, [pltpu.SemaphoreType.REGULAR]))

    def run() -> object:
        with sd.sanitizer_errors():
            return jax.block_until_ready(call(x))

    text = _expect(DeadlockError, run, "REGULAR semaphore reg")
    _still_works()
    return text


def _started_never_waited(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem))


def case_leftover_dma() -> str:
    """A copy never waited: reported, and drained with DMA waits so the chip stays clean."""
    from safedma.testing import LeftoverSemaphoreError

    x = _x()
    call = _call(
        _started_never_waited, x.shape, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())]
    )
    text = _expect(
        LeftoverSemaphoreError,
        lambda: call(x),
        "DMA semaphore sem",
        _units("holds 128 DMA units", "holds 4096 bytes"),
    )
    _still_works()
    return text


def _still_landing(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    def scoped(scoped_buf: Any, scoped_sem: Any) -> None:
        started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(0, 3)], scoped_buf, scoped_sem))

    pl.run_scoped(scoped, pltpu.VMEM((3, 128), F32), pltpu.SemaphoreType.DMA(()))
    started_never_waited(pltpu.make_async_copy(x_hbm.at[pl.ds(8, 8)], buf, sems.at[2]))
    started_never_waited(pltpu.make_async_copy(x_hbm, o_hbm, sems.at[9]))  # 4 MiB, landing at exit


def case_leftover_dma_in_flight() -> str:
    """Copies never waited on a scoped semaphore and on two slots of a 12-slot array (the
    exit check's loop), one of 4 MiB still landing at exit: the first is reported, all
    are drained."""
    from safedma.testing import LeftoverSemaphoreError

    x = _x((8192, 128))
    call = _call(
        _still_landing,
        x.shape,
        [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA((12,))],
    )
    text = _expect(
        LeftoverSemaphoreError,
        lambda: call(x),
        "DMA semaphore scoped_sem",
        _units("holds 48 DMA units", "holds 1536 bytes"),
    )
    _still_works()
    return text


def _signal_never_waited(x_hbm: Any, o_hbm: Any, reg: Any) -> None:
    pl.semaphore_signal(reg, 2)


def case_leftover_regular() -> str:
    """A signal never waited: reported, and drained so the chip stays clean."""
    from safedma.testing import LeftoverSemaphoreError

    x = _x()
    call = _call(_signal_never_waited, x.shape, [pltpu.SemaphoreType.REGULAR])
    text = _expect(LeftoverSemaphoreError, lambda: call(x), "REGULAR semaphore reg", "holds 2")
    _still_works()
    return text


def _window_from_a_loop(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    def body(i: Any, carry: Any) -> Any:
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 30, 8)], buf, sem)
        copy.start()
        copy.wait()
        return carry

    lax.fori_loop(0, 3, body, 0)


def case_out_of_bounds() -> str:
    from safedma.testing import OutOfBoundsDmaError

    x = _x()
    call = _call(
        _window_from_a_loop, x.shape, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())]
    )
    text = _expect(OutOfBoundsDmaError, lambda: call(x), "the window 60:68 is outside 0:64")
    _still_works()
    return text


def _semaphore_from_a_loop(x_hbm: Any, o_hbm: Any, buf: Any, sems: Any) -> None:
    def body(i: Any, carry: Any) -> Any:
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sems.at[i])
        copy.start()
        copy.wait()
        return carry

    lax.fori_loop(0, 3, body, 0)


def case_semaphore_index() -> str:
    from safedma.testing import SemaphoreIndexError

    x = _x()
    call = _call(
        _semaphore_from_a_loop, x.shape, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA((2,))]
    )
    text = _expect(SemaphoreIndexError, lambda: call(x), "sems[2]")
    _still_works()
    return text


def _copy_of(
    shape: tuple[int, ...], dtype: Any, space: Any
) -> tuple[Callable[..., None], list[Any]]:
    def kernel(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
        _copy_through(x_hbm, o_hbm, buf, sem)

    return kernel, [space(shape, dtype), pltpu.SemaphoreType.DMA(())]


def case_units() -> str:
    """Waits of every measured shape family (and some outside it) pass clean: the amount a
    wait needs never exceeds what its copy adds (a wrong rule would report a hang)."""
    shapes = [
        ((8, 128), F32, pltpu.VMEM),
        ((1, 128), F32, pltpu.VMEM),
        ((3, 128), F32, pltpu.VMEM),
        ((8, 64), F32, pltpu.VMEM),
        ((8, 130), F32, pltpu.VMEM),
        ((8, 256), jnp.bfloat16, pltpu.VMEM),
        ((16, 128), jnp.bfloat16, pltpu.VMEM),
        ((32, 128), jnp.int8, pltpu.VMEM),
        ((2, 8, 128), F32, pltpu.VMEM),
        ((7,), jnp.int32, pltpu.SMEM),
        ((8, 64), jnp.bfloat16, pltpu.VMEM),  # outside the measured: a lower bound
        ((32, 64), jnp.int8, pltpu.VMEM),  # outside the measured: a lower bound
    ]
    done = []
    for shape, dtype, space in shapes:
        kernel, scratch = _copy_of(shape, dtype, space)
        x = _x(shape, dtype)
        out = _call(kernel, shape, scratch)(x)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
        done.append(f"{shape} {jnp.dtype(dtype).name}")
    return "clean: " + ", ".join(done)


def _signals_each_step(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any, reg: Any) -> None:
    i = pl.program_id(0)
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * 8, 8)], buf, sem)
    copy.start()
    copy.wait()
    copy = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(i * 8, 8)], sem)
    copy.start()
    copy.wait()
    pl.semaphore_signal(reg, 1)

    @pl.when(i == pl.num_programs(0) - 1)
    def _() -> None:
        pl.semaphore_wait(reg, pl.num_programs(0))


def case_grid() -> str:
    """A grid kernel whose semaphore is non-zero between steps and zero at the last one."""
    x = _x()
    call = _call(
        _signals_each_step,
        x.shape,
        [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(()), pltpu.SemaphoreType.REGULAR],
        grid=(8,),
    )
    out = call(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    return "clean over 8 grid steps"


def case_no_cpu_platform() -> str:
    """Run with JAX_PLATFORMS=tpu: a sanitized kernel under jit says it needs the CPU."""
    x = _x()
    call = jax.jit(
        _call(_copy_through, x.shape, [pltpu.VMEM(x.shape, F32), pltpu.SemaphoreType.DMA(())])
    )
    text = _expect(sd.SanitizerUnsupportedError, lambda: call(x), "JAX_PLATFORMS=tpu,cpu")
    eager = _call(_copy_through, x.shape, [pltpu.VMEM(x.shape, F32), pltpu.SemaphoreType.DMA(())])
    np.testing.assert_array_equal(np.asarray(eager(x)), np.asarray(x))
    return text


CASES: dict[str, Callable[[], str]] = {
    "clean": case_clean,
    "hang_dma": case_hang_dma,
    "hang_regular_under_jit": case_hang_regular_under_jit,
    "leftover_dma": case_leftover_dma,
    "leftover_dma_in_flight": case_leftover_dma_in_flight,
    "leftover_regular": case_leftover_regular,
    "out_of_bounds": case_out_of_bounds,
    "semaphore_index": case_semaphore_index,
    "units": case_units,
    "grid": case_grid,
    "no_cpu_platform": case_no_cpu_platform,
}


def main(argv: list[str]) -> int:
    name = argv[0]
    if "--interpret" in argv:
        INTERPRETED[0] = True
        with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
            return _run(name, "tpu (interpreted on the CPU)")
    try:
        platform = str(jax.devices()[0].platform)
    except RuntimeError as error:  # JAX_PLATFORMS=tpu,cpu on a machine without a TPU
        platform = f"none ({str(error).splitlines()[0][:120]})"
    if name == "platform" or platform != "tpu":
        print(json.dumps({"case": name, "no_tpu": platform != "tpu", "platform": platform}))
        return 0
    return _run(name, platform)


def _run(name: str, platform: str) -> int:
    del platform
    started = time.perf_counter()
    try:
        detail = CASES[name]()
        ok = True
    except Exception:
        detail, ok = traceback.format_exc()[-3000:], False
    seconds = round(time.perf_counter() - started, 2)
    print(json.dumps({"case": name, "ok": ok, "detail": detail, "seconds": seconds}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
