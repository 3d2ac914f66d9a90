"""A sanitized kernel whose wait can never be satisfied on any path is refused when traced,
with an error named for what happened: a wait nothing signals, or waits that take more
than the copies add. Both are subclasses of ``HandleWaitedTwiceError``, which existing
``except`` clauses catch."""

from __future__ import annotations

from typing import Any

import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.sanitize.helpers import F32, example, hbm_call
from tests.support.simulation import line_of

X = (64, 128)


def wait_nothing_signals(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem).wait()


def wait_larger_than_its_copy(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem).start()
    pltpu.make_async_copy(x_hbm.at[pl.ds(0, 16)], o_hbm.at[pl.ds(0, 16)], sem).wait()


def copy_waited_twice(x_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem)
    copy.start()
    copy.wait()
    copy.wait()  # second


def _run(kernel: Any) -> None:
    hbm_call(kernel, [pltpu.VMEM((8, 128), F32), pltpu.SemaphoreType.DMA(())])(example(X))


def test_a_wait_nothing_signals_is_named_for_that() -> None:
    with pytest.raises(sd.WaitNeverSignalledError) as caught:
        _run(wait_nothing_signals)
    text = str(caught.value)
    assert line_of(wait_nothing_signals, ".wait()") in text
    assert "no copy or signal in the kernel body adds to" in text
    assert "Wait the semaphore slot the copy was started on" in text
    assert isinstance(caught.value, sd.HandleWaitedTwiceError)


def test_a_wait_larger_than_its_copy_says_to_match_the_copy() -> None:
    with pytest.raises(sd.WaitExceedsCopiesError) as caught:
        _run(wait_larger_than_its_copy)
    text = str(caught.value)
    assert line_of(wait_larger_than_its_copy, ".wait()") in text
    assert "take 8192 bytes" in text and "add at most 4096 bytes" in text
    assert "the copy's own descriptor" in text and "remove the extra wait" not in text
    assert isinstance(caught.value, sd.HandleWaitedTwiceError)


def test_a_copy_waited_twice_says_to_remove_a_wait() -> None:
    with pytest.raises(sd.WaitExceedsCopiesError) as caught:
        _run(copy_waited_twice)
    text = str(caught.value)
    assert line_of(copy_waited_twice, "# second") in text
    assert "2 wait(s)" in text and "remove the extra wait" in text
