"""CountedCopy is refused at trace time for a chip before TPU v6 that this process runs on.

jax compiles a DMA that signals a REGULAR semaphore for every generation, but a v5e
runs it into a halted core; the refusal names the chip and the fix. The chip is read
from the process's default backend, so the tests stand in for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

import safedma as sd
from safedma import _compat

HBM = pl.BlockSpec(memory_space=pl.ANY)


def _counted(x: sd.DataRef, o: sd.DataRef, flag: sd.RegularSem) -> None:
    sd.CountedCopy(x, o, flag).start().wait()


def _trace() -> None:
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    call = sd.pallas_call(
        _counted,
        out_shape=x,
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.regular_semaphore()],
    )
    jax.jit(call).trace(x)


@pytest.mark.parametrize(
    ("kind", "generation"),
    [
        ("TPU v5 lite", 5),
        ("TPU v5e", 5),
        ("TPU v5p", 5),
        ("TPU v4", 4),
        ("TPU v6 lite", 6),
        ("TPU7x", 7),
        ("cpu", None),
    ],
)
def test_the_generation_is_read_from_the_device_kind(kind: str, generation: int | None) -> None:
    assert _compat.chip_generation(kind) == generation


@pytest.mark.parametrize("kind", ["TPU v5 lite", "TPU v4"])
def test_a_chip_before_v6_refuses_a_counted_copy_at_its_line(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_compat, "compiled_for_chip", lambda: kind)
    with pytest.raises(sd.UnsupportedDmaError) as caught:
        _trace()
    text = str(caught.value)
    assert repr(kind) in text and "needs TPU v6" in text and "LocalCopy" in text
    # Raised while the user's line runs: the traceback's last frame outside safedma is it.
    package = Path(sd.__file__).resolve().parent
    user = [e for e in caught.traceback if package not in Path(e.path).resolve().parents]
    assert user[-1].frame.code.name == "_counted"


@pytest.mark.parametrize("kind", ["TPU v6 lite", "TPU7x", None])
def test_a_v6_chip_or_no_chip_traces_it(kind: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "compiled_for_chip", lambda: kind)
    _trace()


def test_on_the_cpu_no_chip_is_named() -> None:
    assert _compat.compiled_for_chip() is None
