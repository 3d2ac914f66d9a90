"""scratch_shapes listed in another order than the kernel's scratch parameters is named for
what it is, with the parameter, what it expected and what it received, and the order to
use, in sd.pallas_call (sanitized or not) and under a plain pl.pallas_call of a checked
body; instead of the first copy's "Cannot signal on a non-()-shaped semaphore" or "Data
and semaphore arguments are swapped"."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

HBM = pl.BlockSpec(memory_space=pl.ANY)
F32 = jnp.float32
X = jnp.zeros((64, 128), F32)
SWAPPED = [pltpu.SemaphoreType.DMA(()), pltpu.VMEM((8, 128), F32)]


def raw(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem)
    copy.start()
    copy.wait()


def typed(x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef) -> None:
    sd.LocalCopy(x_hbm.at[pl.ds(0, 8)], buf, sem).start().wait()


def named_sem_used_as_data(x_hbm: Any, o_hbm: Any, sem_buf: Any, sems: Any, sem: Any) -> None:
    # `sems` holds data here and the body uses it as data: nothing failed, nothing said.
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], sems, sem)
    copy.start()
    copy.wait()


def _run(body: Any, scratch: list[Any], entry: str = "sd", **options: Any) -> None:
    if entry == "sd":
        call = sd.pallas_call
    else:
        call, body = pl.pallas_call, sd.checked(body)
    call(
        body,
        jax.ShapeDtypeStruct(X.shape, X.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=scratch,
        interpret=pltpu.InterpretParams(),
        **options,
    )(X)


def _says_the_swap(error: sd.ScratchOrderError, kernel: str, why: str) -> None:
    text = str(error)
    assert f"kernel {kernel!r} (defined at {__file__}:" in text, text
    assert (
        f"parameter buf ({why} a data buffer) received scratch_shapes[0], a DMA semaphore" in text
    )
    assert "parameter sem" in text and "scratch_shapes[1], a VMEM float32[8, 128] buffer" in text
    assert "Fix: scratch_shapes=[scratch_shapes[1], scratch_shapes[0]]" in text


@pytest.mark.parametrize("entry", ["sd", "pl"])
def test_a_raw_kernel_is_told_by_its_parameter_names(entry: str) -> None:
    with pytest.raises(sd.ScratchOrderError) as caught:
        _run(raw, SWAPPED, entry)
    _says_the_swap(caught.value, "raw", "its name says")
    assert isinstance(caught.value, ValueError)  # what jax raised for it


@pytest.mark.parametrize("entry", ["sd", "pl"])
def test_an_annotated_kernel_is_told_by_its_annotations(entry: str) -> None:
    with pytest.raises(sd.ScratchOrderError) as caught:
        _run(typed, SWAPPED, entry)
    _says_the_swap(caught.value, "typed", "annotated as")
    assert isinstance(caught.value, sd.SemaphoreKindError)  # what safedma raised for it


def test_a_sanitized_call_is_told_the_same() -> None:
    with pytest.raises(sd.ScratchOrderError) as caught:
        _run(raw, SWAPPED, sanitize=True)
    _says_the_swap(caught.value, "raw", "its name says")


def test_the_right_order_and_a_working_body_are_left_alone() -> None:
    _run(raw, list(reversed(SWAPPED)))
    _run(typed, list(reversed(SWAPPED)))
    scratch = [
        pltpu.VMEM((8, 128), F32),
        pltpu.VMEM((8, 128), F32),
        pltpu.SemaphoreType.DMA(()),
    ]
    _run(named_sem_used_as_data, scratch)
