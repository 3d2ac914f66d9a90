"""The sanitizer in both of jax's interpreters, and its rule in the TPU interpreter.

jax's TPU interpreter (``interpret=pltpu.InterpretParams(...)``) has no rule for
``semaphore_read``; sanitized kernels read through a primitive of safedma's own
whose rule is registered with the interpreter. jax's generic interpreter
(``interpret=True``) discharges ``semaphore_read`` itself and counts DMA
semaphores in elements.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma._sanitize import _jax
from safedma.testing import DeadlockError, LeftoverSemaphoreError
from tests.sanitize.helpers import (
    F32,
    HBM,
    QUICK,
    example,
    hbm_call,
    interpret,
    past_the_trace_checks,
    started_never_waited,
)

X = (16, 128)


def reads_its_count(x_hbm: Any, o_hbm: Any, seen: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    seen[0] = pl.semaphore_read(sem)  # the copy has landed (eager) or lands now (on wait)
    copy.wait()
    seen[1] = pl.semaphore_read(sem)
    out = pltpu.make_async_copy(buf, o_hbm, sem)
    out.start()
    out.wait()


def _with_seen(mode: str, sanitize: object) -> Any:
    x = example(X)
    return sd.pallas_call(
        reads_its_count,
        (jax.ShapeDtypeStruct(X, F32), jax.ShapeDtypeStruct((2,), np.int32)),
        in_specs=[HBM],
        out_specs=(HBM, pl.BlockSpec(memory_space=pltpu.SMEM)),
        scratch_shapes=[pltpu.VMEM(X, F32), pltpu.SemaphoreType.DMA(())],
        interpret=interpret(mode),
        sanitize=sanitize,  # type: ignore[typeddict-item]
    )(x)


@pytest.mark.parametrize("mode", ["eager", "on_wait"])
def test_a_kernels_own_semaphore_reads_work_sanitized(mode: str) -> None:
    out, seen = _with_seen(mode, QUICK)
    np.testing.assert_array_equal(out, example(X))
    assert list(np.asarray(seen)) == [16 * 128 * 4, 0]  # bytes, in the TPU interpreter


def test_unsanitized_kernels_see_jaxs_interpreter_unchanged() -> None:
    """The rule is for the sanitizer's own read only: jax still refuses semaphore_read."""
    with pytest.raises(NotImplementedError, match="semaphore_read"):
        _with_seen("eager", False)


def test_the_private_names_the_rule_needs_are_there() -> None:
    _jax.check_private_names()


def test_a_moved_private_name_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _jax._interpreter()  # pyright: ignore[reportPrivateUsage]
    monkeypatch.delattr(module, "TOKEN_SHAPE_DTYPE")
    with pytest.raises(
        RuntimeError, match=r"interpret_pallas_call\.TOKEN_SHAPE_DTYPE.*jax 0\.10\.2"
    ):
        _jax.check_private_names()


def hangs(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    past_the_trace_checks(pltpu.make_async_copy(x_hbm, buf, sem).wait)


def leaks(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    started_never_waited(pltpu.make_async_copy(x_hbm, buf, sem))


def ok(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    copy = pltpu.make_async_copy(buf, o_hbm, sem)
    copy.start()
    copy.wait()


def _generic(kernel: Any) -> Any:
    return sd.pallas_call(
        kernel,
        jax.ShapeDtypeStruct(X, F32),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.VMEM(X, F32), pltpu.SemaphoreType.DMA(())],
        interpret=True,
        sanitize=QUICK,
    )


def test_generic_interpreter_clean_kernel() -> None:
    np.testing.assert_array_equal(_generic(ok)(example(X)), example(X))


def test_generic_interpreter_hang_counts_elements() -> None:
    with pytest.raises(DeadlockError, match=r"for 2048 elements; .* still held 0 elements"):
        _generic(hangs)(example(X))


def test_generic_interpreter_leftover() -> None:
    with pytest.raises(LeftoverSemaphoreError, match=r"holds 2048 elements"):
        _generic(leaks)(example(X))


def test_tpu_interpreter_counts_bytes() -> None:
    with pytest.raises(LeftoverSemaphoreError, match=r"holds 8192 bytes"):
        hbm_call(leaks, [pltpu.VMEM(X, F32), pltpu.SemaphoreType.DMA(())])(example(X))


# ---------------------------------------------------------------- what the interpreter cannot run


def _future_start(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    pltpu.make_async_copy(x_hbm, o_hbm, sem).start()


def _future_start_call(x: jax.Array) -> Any:
    return sd.pallas_call(
        _future_start,
        (jax.ShapeDtypeStruct(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())),
        in_specs=[HBM],
        out_specs=(HBM, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
        interpret=interpret(),
        sanitize=QUICK,
    )(x)


def test_a_semaphore_handed_between_kernels_is_refused_in_the_tpu_interpreter() -> None:
    """A DMA future (a semaphore a kernel returns) cannot run in jax's TPU interpreter,
    sanitized or not: the sanitizer says so, by kernel and semaphore, instead of the
    interpreter's failure deep inside (``nan + dma_sem``)."""
    with pytest.raises(sd.SanitizerUnsupportedError) as refused:
        _future_start_call(example((8, 128)))
    text = str(refused.value)
    assert "kernel _future_start" in text and "semaphore sem " in text, text
    assert "DMA future" in text and "safedma.testing.verify" in text, text


def test_the_same_kernel_is_not_refused_for_the_chip() -> None:
    """The refusal is the interpreter's limit: sanitized for the chip, the same kernel
    lowers (a semaphore it returns is not checked at exit: it may hold a count across
    kernels)."""
    spec = jax.ShapeDtypeStruct((8, 128), F32)

    def for_chip(x: jax.Array) -> Any:
        return sd.pallas_call(
            _future_start,
            (jax.ShapeDtypeStruct(x.shape, x.dtype), pltpu.SemaphoreType.DMA(())),
            in_specs=[HBM],
            out_specs=(HBM, pl.BlockSpec(memory_space=pltpu.SEMAPHORE)),
            sanitize=QUICK,
        )(x)

    from safedma.testing import mosaic_text

    assert "tpu.enqueue_dma" in mosaic_text(for_chip, spec)
